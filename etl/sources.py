"""Locating, checking and scanning raw source tables with DuckDB.

A table is found as ``<dir>/<module>/<name>.parquet``, ``.csv.gz`` or ``.csv`` (the MIMIC-IV
v2.2 to v3.1 layouts all use ``hosp/`` and ``icu/``). Exactly one of these must exist: two
candidate files for one table are refused (docs/decisions.md), and the file read is recorded
in the cohort report. CSV tables are scanned with an explicit column list read from their header
line, so a text value in a column that DuckDB's sniffer would have guessed numeric can never
break a long scan half way; the columns the ETL uses are cast to their types, all others stay
VARCHAR. Parquet columns the ETL uses must have a type that casts to theirs (checked when the
table is located), and every time-zone-aware timestamp is read as its UTC wall-clock time, so
no output depends on the machine's time zone.
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import os
import re
import shutil
import tempfile
import weakref
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import duckdb

from etl.errors import InputError

SUFFIXES = (".parquet", ".csv.gz", ".csv")
#: The one timestamp format of CSV tables (MIMIC-IV writes '2150-01-01 10:00:00'); a date alone,
#: a 'T' separator or a fraction of a second is refused, naming the file and the column.
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S"


@dataclass(frozen=True)
class Table:
    """One located raw table.

    Attributes:
        name: logical name, e.g. ``"icustays"``.
        path: file on disk.
        columns: column names in file order (from the CSV header or the Parquet schema).
        kinds: DuckDB types of the columns as stored (Parquet), or all VARCHAR (CSV).
        distinct: scan ``SELECT DISTINCT *`` (set by :func:`check_key` when the table holds
            identical duplicated rows).
        read_from: the file DuckDB reads when it is not ``path`` (a gzip without its padding).
        loaded_as: the DuckDB temp table holding the typed rows (:func:`load`), scanned instead
            of the file.
    """

    name: str
    path: Path
    columns: tuple[str, ...]
    kinds: tuple[str, ...] = ()
    distinct: bool = False
    read_from: Path | None = None
    loaded_as: str | None = None

    @property
    def is_parquet(self) -> bool:
        return self.path.suffix == ".parquet"

    @property
    def read_path(self) -> Path:
        """The file DuckDB scans: ``path``, or a copy of it without trailing gzip padding."""
        return self.read_from or self.path

    def scan_sql(self, types: dict[str, str]) -> str:
        """A DuckDB table expression reading this file.

        Args:
            types: DuckDB types of the columns the caller uses; other columns are VARCHAR (CSV)
                or left as stored (Parquet, where the caller's casts apply in SQL).
        """
        scan = self.loaded_as or self._raw_scan(types)
        return f"(SELECT DISTINCT * FROM {scan})" if self.distinct else scan

    def _raw_scan(self, types: dict[str, str]) -> str:
        path = sql_path(self.read_path)
        if self.is_parquet:
            casts = []
            for c, kind in zip(self.columns, self.kinds or ("",) * len(self.columns)):
                if kind.startswith("TIMESTAMP WITH TIME ZONE"):
                    # an instant -> its UTC wall-clock time, whatever the connection's TimeZone
                    casts.append(f"CAST(timezone('UTC', {c}) AS {types.get(c, 'TIMESTAMP')}) AS {c}")
                elif types.get(c) in INTEGER_TYPES and kind.startswith(("VARCHAR", "BLOB")):
                    casts.append(f"{whole_number_sql(self.path, c, types[c])} AS {c}")
                elif types.get(c) in INTEGER_TYPES and not kind.startswith(_PARQUET_INTEGERS):
                    # DECIMAL / FLOAT / DOUBLE: a fractional value is refused as in a CSV, never rounded
                    where = sql_path(f"{self.path} :: {c}")
                    d = f"CAST({c} AS DOUBLE)"
                    casts.append(f"CASE WHEN {c} IS NULL THEN NULL WHEN {d} = floor({d}) THEN CAST({c} AS {types[c]}) "
                                 f"ELSE error('{NOT_WHOLE}{where}') END AS {c}")
                elif c in types:
                    casts.append(f"CAST({c} AS {types[c]}) AS {c}")
            replace_ = f" REPLACE ({', '.join(casts)})" if casts else ""
            return f"(SELECT *{replace_} FROM read_parquet('{path}'))"
        return self.whole_numbers(types, self.csv_scan(types))

    def csv_scan(self, types: dict[str, str]) -> str:
        """DuckDB's read of this CSV with the caller's types, except integer columns, read as
        text (:meth:`whole_numbers` converts them: DuckDB's own conversion rounds a fractional
        value, '0.6' -> 1, instead of refusing it)."""
        cols = ", ".join(
            f"'{c}': '{'VARCHAR' if types.get(c) in INTEGER_TYPES else types.get(c, 'VARCHAR')}'" for c in self.columns
        )
        return (
            f"read_csv('{sql_path(self.read_path)}', header=true, delim=',', quote='\"', escape='\"', "
            f"columns={{{cols}}}, timestampformat='{TIMESTAMP_FORMAT}', nullstr='')"
        )

    def whole_numbers(self, types: dict[str, str], rel: str) -> str:
        """``rel`` (rows of :meth:`csv_scan`) with its integer columns converted by whole_number_sql."""
        ints = [c for c in self.columns if types.get(c) in INTEGER_TYPES]
        if not ints:
            return rel
        casts = ", ".join(f"{whole_number_sql(self.path, c, types[c])} AS {c}" for c in ints)
        return f"(SELECT * REPLACE ({casts}) FROM {rel})"

    def varchar_scan(self) -> str:
        """A scan of this file with every column as stored (CSV: all VARCHAR); for diagnosis."""
        path = sql_path(self.read_path)
        if self.is_parquet:
            return f"read_parquet('{path}')"
        cols = ", ".join(f"'{c}': 'VARCHAR'" for c in self.columns)
        return (f"read_csv('{path}', header=true, delim=',', quote='\"', escape='\"', "
                f"columns={{{cols}}}, nullstr='')")


INTEGER_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT")
_PARQUET_INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
                     "UBIGINT")
#: Start of the DuckDB error raised by :func:`whole_number_sql` (translated by wrap_duckdb_error).
NOT_WHOLE = "abps: not a whole number in "


def whole_number_sql(path: Path, col: str, kind: str) -> str:
    """SQL converting the text column ``col`` to the integer type ``kind``: a whole number
    (``12``, ``12.0``, ``1.2e1``) converts, a fractional one (``0.6``) stops the query with an
    error naming the file and the column (never the value)."""
    where = sql_path(f"{path} :: {col}")
    as_double = f"TRY_CAST({col} AS DOUBLE)"
    # 'e' and 'E' looked for apart: lower() would build a new string per value; a hexadecimal
    # value ('0x1caa3ee', read by DuckDB's cast as by Arrow's) holds an 'x' and no exponent
    return (f"CASE WHEN {col} IS NULL OR contains({col}, 'x') OR contains({col}, 'X') "
            f"OR NOT (contains({col}, '.') OR contains({col}, 'e') OR contains({col}, 'E')) "
            f"THEN CAST({col} AS {kind}) "
            f"WHEN {as_double} = floor({as_double}) THEN CAST({as_double} AS {kind}) "
            f"ELSE error('{NOT_WHOLE}{where}') END")


def _rows_failing(con: duckdb.DuckDBPyConnection, table: Table, failing: dict[str, str],
                  scan: str | None) -> tuple[str, int] | None:
    """``(column, rows)`` of the first column of ``failing`` (column -> SQL condition a bad row
    meets) with a bad row, counted in one scan of ``scan`` (default the file's text scan); else None."""
    if not failing:
        return None
    checks = ", ".join(f"count(*) FILTER (WHERE {cond})" for cond in failing.values())
    bad = con.execute(f"SELECT {checks} FROM {scan or table.varchar_scan()}").fetchall()[0]
    return next(((c, int(n)) for c, n in zip(failing, bad) if n), None)


def check_flags(con: duckdb.DuckDBPyConnection, table: Table, cols: tuple[str, ...], scan: str | None = None) -> None:
    """Refuse a label / flag column holding a value that is not exactly 0 or 1 once parsed as a
    number (``1.0`` is 1; ``0.6``, ``2``, ``yes`` are refused; empty is missing). ``scan``: the
    file's rows as read, when already in memory (:func:`load_checked`); default the file.

    Raises:
        InputError: naming the file, the column and how many rows hold other values.
    """
    hit = _rows_failing(con, table, {c: f"{c} IS NOT NULL AND coalesce(TRY_CAST(CAST({c} AS VARCHAR) AS DOUBLE) "
                                        "IN (0, 1), false) = false" for c in cols if c in table.columns}, scan)
    if hit:
        raise InputError(f"{table.path}: column '{hit[0]}' must be 0 or 1 ({hit[1]} rows hold other values)")


def check_range(con: duckdb.DuckDBPyConnection, table: Table, bounds: dict[str, tuple[float, float]],
                scan: str | None = None) -> None:
    """Refuse a numeric column holding a value outside ``[lo, hi]`` (a negative age or identifier, a
    year of 5 digits), which would otherwise drop or move rows silently; empty is missing.
    ``scan``: as :func:`check_flags`.

    Raises:
        InputError: naming the file, the column, the bounds and how many rows are outside.
    """
    # no trim(): DuckDB's cast to DOUBLE already reads a number between blanks or tabs (' 7 ' -> 7),
    # and the extra string per value was half of this query's CPU
    hit = _rows_failing(con, table, {c: f"TRY_CAST(CAST({c} AS VARCHAR) AS DOUBLE) NOT BETWEEN {lo} AND {hi}"
                                     for c, (lo, hi) in bounds.items() if c in table.columns}, scan)
    if hit:
        lo, hi = bounds[hit[0]]
        raise InputError(f"{table.path}: column '{hit[0]}' must lie in [{lo:g}, {hi:g}] ({hit[1]} rows do not)")


def check_text(con: duckdb.DuckDBPyConnection, table: Table, cols: tuple[str, ...], scan: str | None = None) -> None:
    """Refuse a text column holding a NUL byte: no clinical text has one, so it marks a damaged
    file, and the value would otherwise reach the outputs (a care unit name, a center) as read.
    ``cols``: the text columns whose values reach the outputs or select rows; ``scan``: as
    :func:`check_flags`.

    Raises:
        InputError: naming the file, the column, how many rows, and the line of the first NUL.
    """
    hit = _rows_failing(con, table, {c: f"contains(CAST({c} AS VARCHAR), chr(0))" for c in cols
                                     if c in table.columns}, scan)
    if hit:
        c, n = hit
        line = nul_line(table.read_path)
        at = f"; the first on line {line}" if line else ""
        raise InputError(f"{table.path}: column '{c}' holds a NUL byte in {n} row{'s' if n != 1 else ''} "
                         f"(a damaged file?){at}")


def nul_line(path: Path) -> int | None:
    """The line (1 = the header) of the first NUL byte in the file ``path`` (plain or gzip), or
    None (a Parquet file, none found, unreadable). Reads up to it: for the error path only."""
    if path.suffix == ".parquet":
        return None
    try:
        with _open_csv(path, "rb") as fh:
            for n, raw in enumerate(fh, start=1):
                if b"\0" in raw:
                    return n
    except (OSError, EOFError, ValueError):
        return None
    return None


def require_rows(con: duckdb.DuckDBPyConnection, table: Table, why: str) -> None:
    """Refuse a table with a header (or schema) but no data row. Cheap: DuckDB stops after the
    first row (``LIMIT 1``).

    Raises:
        InputError: naming the file and ``why`` the table cannot be empty.
    """
    if table.loaded_as is not None:  # already loaded: its table answers at once
        rows = con.execute(f"SELECT 1 FROM {table.loaded_as} LIMIT 1").fetchall()
    elif _first_row_plain(table):
        return
    else:
        rows = con.execute(f"SELECT 1 FROM {table.varchar_scan()} LIMIT 1").fetchall()
    if not rows:
        raise InputError(f"{table.path}: no data rows (a header only); {why}")


def _first_row_plain(table: Table) -> bool:
    """True when a CSV's first line after the header is a plain data row: no quote, as many
    fields as the header, within the first 64 KiB (DuckDB reads it as a row). False when this
    cannot tell (the caller asks DuckDB); reading a gzip member's start costs microseconds where
    DuckDB's scan costs a quarter of a second on a large chartevents."""
    if table.is_parquet:
        return False
    try:
        if table.read_path.name.endswith(".gz"):
            with gzip.open(table.read_path, "rb") as fh:
                head = fh.read(1 << 16)
        else:
            with table.read_path.open("rb") as fh:
                head = fh.read(1 << 16)
    except (OSError, EOFError, zlib.error):
        return False
    lines = head.split(b"\n")
    if len(lines) < 3:  # the second line must end inside the block
        return False
    row = lines[1].rstrip(b"\r")
    return bool(row.strip()) and b'"' not in row and row.count(b",") == len(table.columns) - 1


#: every open ETL connection, for :func:`interrupt_all` (weak: a closed, dropped connection leaves)
_LIVE: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()


def interrupt_all() -> None:
    """Interrupt the query running on every open ETL connection (called from another thread when
    a signal arrives: a multi-threaded query does not stop for a signal on its own; cli.app)."""
    for con in list(_LIVE):
        try:
            con.interrupt()
        except Exception:  # a closed connection
            pass


def connect(threads: int = 1, memory_limit: str | None = None, scratch: Path | None = None) -> duckdb.DuckDBPyConnection:
    """The one function that opens a DuckDB connection for the ETL (both sources, every step).

    Settings: ``TimeZone = 'UTC'`` (a TIMESTAMPTZ never reads differently under another ``TZ``),
    ``threads`` (``--threads``), ``memory_limit`` (``--memory-limit``, validated as digits and a
    unit by ``EtlOptions.validate``), spill files under ``scratch/duckdb_tmp`` (inside the
    output's temporary sibling), and no insertion-order guarantee (every output is sorted
    explicitly). Without ``memory_limit`` / ``scratch`` (schema probes) DuckDB's defaults apply.
    """
    con = duckdb.connect(":memory:")
    _LIVE.add(con)
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"SET threads = {int(threads)}")
    if memory_limit is not None:
        try:
            con.execute(f"SET memory_limit = '{memory_limit.strip()}'")
        except duckdb.Error as exc:  # e.g. a value past DuckDB's range
            con.close()
            raise InputError(f"--memory-limit {memory_limit.strip()}: {_first(str(exc))[:160]}") from None
    if scratch is not None:
        con.execute(f"SET temp_directory = '{sql_path(scratch / 'duckdb_tmp')}'")
    con.execute("SET preserve_insertion_order = false")
    return con


#: The longest CSV header line read (bytes): MIMIC-IV's and eICU's are under 1 KiB.
HEADER_MAX_BYTES = 1 << 20


def _csv_header(path: Path) -> tuple[str, ...]:
    try:  # the first line as bytes: a text reader would decode (and refuse) the rows after it too
        with (gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")) as fh:
            raw = fh.readline(HEADER_MAX_BYTES)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: unreadable ({_reason(exc)})") from None
    if b"\r" in raw.rstrip(b"\r\n"):
        raise InputError(f"{path}: its lines end in a carriage return alone (classic Mac OS); convert them to "
                         "line feeds, e.g. tr '\\r' '\\n'")
    if len(raw) == HEADER_MAX_BYTES and not raw.endswith(b"\n"):
        raise InputError(f"{path}: no line break in the first {HEADER_MAX_BYTES >> 20} MiB (not a CSV header)")
    try:
        line = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{path}: the CSV header is not UTF-8 text") from None
    cols = tuple(c.strip().strip('"').lower() for c in line.rstrip("\r\n").split(","))
    if not line.strip() or not all(cols):
        raise InputError(f"{path}: empty file or missing CSV header")
    return cols


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
    return text[:160]


#: Stored (Parquet) types each target type accepts; anything else is refused when the table is
#: located, with the file, column and both types named. VARCHAR is accepted and its values are
#: checked when cast (an unconvertible value is reported by :func:`wrap_duckdb_error`).
_INTEGER_KINDS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
                  "UINTEGER", "UBIGINT")
_ACCEPTS: dict[str, tuple[str, ...]] = {
    "BIGINT": _INTEGER_KINDS + ("DECIMAL", "VARCHAR"),
    "INTEGER": _INTEGER_KINDS + ("DECIMAL", "VARCHAR"),
    "TINYINT": _INTEGER_KINDS + ("DECIMAL", "VARCHAR", "BOOLEAN"),
    "DOUBLE": _INTEGER_KINDS + ("DECIMAL", "DOUBLE", "FLOAT", "VARCHAR"),
    "TIMESTAMP": ("TIMESTAMP", "TIMESTAMP_NS", "TIMESTAMP_MS", "TIMESTAMP_S", "DATE", "VARCHAR"),
}


def _check_kinds(path: Path, cols: tuple[str, ...], kinds: tuple[str, ...], types: dict[str, str]) -> None:
    for col, kind in zip(cols, kinds):
        want = types.get(col)
        if want is None or want not in _ACCEPTS:
            continue
        base = kind.split("(")[0].strip()
        if not any(base == k or base.startswith(k + " ") for k in _ACCEPTS[want]):
            raise InputError(f"{path}: column '{col}' is stored as {kind}, which cannot be read as {want}")


def locate(root: Path, module: str, name: str, required: tuple[str, ...],
           types: dict[str, str] | None = None) -> Table:
    """Find the one file ``<root>/<module>/<name>.{parquet,csv.gz,csv}`` and check its columns.

    ``module`` may be empty for sources whose tables lie directly in ``root`` (eICU).

    Args:
        types: DuckDB types the ETL casts columns to; Parquet columns whose stored type cannot
            be cast are refused here (before any long scan).

    Raises:
        InputError: the table is missing, two candidate files exist (ambiguous source), the file
            is unreadable, lacks a required column, or stores a used column with a wrong type
            (the message names the file and the column).
    """
    base = root / module if module else root
    label = f"{module}/{name}" if module else name
    try:
        found = [base / f"{name}{suffix}" for suffix in SUFFIXES if (base / f"{name}{suffix}").is_file()]
    except PermissionError:  # a folder that cannot be searched: is_file raises instead of saying False
        raise InputError(f"{base}: unreadable folder (permission denied)") from None
    if not found:
        wanted = {f"{name}{suffix}".lower() for suffix in SUFFIXES}
        try:
            near = sorted(p.name for p in base.iterdir() if p.name.lower() in wanted)
        except OSError:
            near = []
        exact = [n for n in near if n in {f"{name}{suffix}" for suffix in SUFFIXES}]
        if exact:  # the name is right, but it is no readable file
            what = "a link to nothing" if (base / exact[0]).is_symlink() and not (base / exact[0]).exists() \
                else "not a file"
            raise InputError(f"{base / exact[0]}: {what} (the {label} table is read from it)")
        hint = f"; {near[0]} is there: the file names are case-sensitive" if near else ""
        raise InputError(f"missing table {label} (.csv.gz, .csv or .parquet) under {root}{hint}")
    if len(found) > 1:
        raise InputError(f"ambiguous table {label}: {' and '.join(p.name for p in found)} both exist "
                         f"under {base}; keep exactly one")
    path = found[0]
    kinds: tuple[str, ...] = ()
    if path.suffix == ".parquet":
        try:
            with contextlib.closing(connect()) as con:
                desc = con.sql(f"DESCRIBE SELECT * FROM read_parquet('{sql_path(path)}')").fetchall()
        except duckdb.Error as exc:
            raise InputError(f"{path}: unreadable Parquet ({exc.__class__.__name__})") from None
        cols = tuple(r[0].lower() for r in desc)
        kinds = tuple(str(r[1]).upper() for r in desc)
    else:
        cols = _csv_header(path)
        kinds = ("VARCHAR",) * len(cols)
    for col in required:
        if col not in cols:
            marked = [c for c in cols if c.replace("\ufeff", "").strip() == col]
            if marked:  # the name is there behind an invisible character (a byte order mark inside the header)
                raise InputError(f"{path}: column '{col}' is written with an invisible character in the header "
                                 f"({', '.join(f'U+{ord(ch):04X}' for ch in sorted(set(marked[0]) - set(col)))})")
            raise InputError(f"{path}: missing column '{col}'")
    if len(set(cols)) != len(cols):
        raise InputError(f"{path}: a column name appears twice in the header")
    _check_kinds(path, cols, kinds, types or {})
    return Table(name, path, cols, kinds, read_from=_unpadded(path) if path.suffix == ".gz" else None)


def load(con: duckdb.DuckDBPyConnection, table: Table, types: dict[str, str], name: str) -> Table:
    """Read ``table`` once into the DuckDB temp table ``name`` (its typed scan, so the same
    values and the same errors as scanning the file) and return the table scanning it: the key
    check, the stays and the Charlson flags then read memory, not the file again.

    Raises:
        duckdb.Error: as the file's scan (the caller translates it, :func:`duckdb_errors`).
    """
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM {table.scan_sql(types)}")
    return replace(table, loaded_as=name)


def load_checked(con: duckdb.DuckDBPyConnection, table: Table, types: dict[str, str], name: str,
                 checks: Callable[[str], None]) -> Table:
    """:func:`load` with checks of the rows as read (``checks(relation)``, e.g. check_range
    and check_flags with ``scan=relation``) before integer columns are converted, reading a CSV
    file once: its :meth:`Table.csv_scan` (integer columns as text) goes to the temp table
    ``<name>_read``, the checks run on it, then :meth:`Table.whole_numbers` fills ``name``. A
    Parquet file is checked on its own scan, then loaded.

    Raises:
        InputError: from ``checks``; duckdb.Error: as the file's scan (:func:`duckdb_errors`).
    """
    if table.is_parquet:
        checks(table.varchar_scan())
        return load(con, table, types, name)
    read = f"{name}_read"
    con.execute(f"CREATE OR REPLACE TEMP TABLE {read} AS SELECT * FROM {table.csv_scan(types)}")
    try:
        checks(read)
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM {table.whole_numbers(types, read)}")
    finally:
        con.execute(f"DROP TABLE IF EXISTS {read}")
    return replace(table, loaded_as=name)


def inflated(table: Table, folder: Path) -> Table:
    """A gzip CSV ``table`` reading a copy of its text that ISA-L (python-isal) inflates into
    ``folder``: DuckDB then parses plain text on its threads instead of inflating with zlib on one
    (about a third less CPU and wall for MIMIC-IV's small tables). ``table`` itself for any other
    file, and for a gzip that does not inflate to its end (DuckDB then reads it and words the
    error, as before). The copies hold patient rows: the folder is the owner's alone (0700, files
    0600). The caller removes ``folder``.

    Raises:
        InputError: the gzip inflates to its end but fails its CRC-32 or length check
            (:func:`gzip_trailer_error`), or ``folder`` refuses the copy (full disk, no permission):
            a copy that cannot be written is not read around, since DuckDB's reader would skip the
            trailer check.
    """
    if table.is_parquet or not table.read_path.name.endswith(".gz"):
        return table
    from isal import igzip, isal_zlib

    dst = folder / f"{table.name}.csv"

    def refused(exc: OSError) -> InputError:
        with contextlib.suppress(OSError):
            dst.unlink(missing_ok=True)
        return InputError(f"{folder}: cannot write the inflated copy of {table.path} ({exc.strerror or exc})")

    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        out = os.fdopen(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")
    except OSError as exc:
        raise refused(exc) from None
    with out:
        try:
            with igzip.open(table.read_path, "rb") as src:
                while block := src.read(1 << 22):
                    try:
                        out.write(block)
                    except OSError as exc:
                        raise refused(exc) from None
        except (OSError, EOFError, ValueError, isal_zlib.error) as exc:  # reading the gzip
            dst.unlink(missing_ok=True)
            damaged = gzip_trailer_error(table.path, exc)
            if damaged is not None:
                raise damaged from None
            return table
        try:
            out.flush()
        except OSError as exc:
            raise refused(exc) from None
    return replace(table, read_from=dst)


def gzip_trailer_error(path: Path, exc: BaseException) -> InputError | None:
    """The one-line error naming ``path`` when its gzip data inflated to the end of a member but
    failed the member's trailer check (CRC-32 or length of the text, RFC 1952 Sec. 2.3.1): the
    text is not what was compressed. None for any other error. DuckDB's gzip reader does not check
    the trailer, so a file read by ISA-L is refused here rather than handed on to DuckDB."""
    import gzip

    if not isinstance(exc, gzip.BadGzipFile):
        return None
    what = str(exc)
    if what.startswith("CRC check failed"):
        return InputError(f"{path}: damaged gzip (the CRC-32 of the inflated text does not match the file's: "
                          "the text is not what was compressed)")
    if what.startswith("Incorrect length"):
        return InputError(f"{path}: damaged gzip (the length of the inflated text does not match the file's)")
    return None


def sql_path(path: Path | str) -> str:
    """``path`` as the inside of a SQL string literal (single quotes doubled), for DuckDB's
    ``read_csv('...')`` / ``read_parquet('...')`` / ``COPY ... TO '...'``."""
    return str(path).replace("'", "''")


def check_key(con: duckdb.DuckDBPyConnection, table: Table, key: tuple[str, ...],
              types: dict[str, str]) -> tuple[Table, int, int]:
    """Check that ``key`` identifies the rows of ``table``; collapse identical duplicates.

    Cost: one pass counting distinct keys; a second pass (``SELECT DISTINCT *``) only when a key
    repeats.

    Returns:
        ``(table, rows_in, rows_out)``: the rows with a non-null key, before and after collapsing
        identical duplicates; when they differ the returned table scans ``SELECT DISTINCT *``.

    Raises:
        InputError: a row has no key (an empty identifier), or two rows share a key but differ in
            some column (conflicting duplicates); the message names the file, the key column(s)
            and a count, never a value.
    """
    scan = table.scan_sql(types)
    k = key[0] if len(key) == 1 else "(" + ", ".join(key) + ")"
    where = " AND ".join(f"{c} IS NOT NULL" for c in key)
    n, n_keys, n_empty = con.execute(f"SELECT count(*) FILTER (WHERE {where}), count(DISTINCT {k}) FILTER (WHERE {where}), "
                                     f"count(*) FILTER (WHERE NOT ({where})) FROM {scan}").fetchall()[0]
    if n_empty:
        raise InputError(f"{table.path}: {n_empty} row{'s' if n_empty != 1 else ''} without a value of "
                         f"'{', '.join(key)}' (the identifier of its rows; an empty one cannot be linked)")
    if n == n_keys:
        return table, int(n), int(n)
    n_rows = con.execute(f"SELECT count(*) FROM (SELECT DISTINCT * FROM {scan} WHERE {where})").fetchall()[0][0]
    cols = ", ".join(key)
    if n_rows != n_keys:
        raise InputError(f"{table.path}: conflicting duplicates: {n_rows - n_keys} rows share a value of "
                         f"'{cols}' with another row but differ in other columns")
    return replace(table, distinct=True), int(n), int(n_rows)


def diagnose(tables: list[Table], types: dict[str, str]) -> tuple[Table, str] | None:
    """Find the first (table, column) holding a value that does not cast to its type.

    Run only after a scan failed: each used column is read as stored and TRY_CAST to its type.
    """
    with contextlib.closing(connect()) as con:
        for t in tables:
            cols = [(c, types[c]) for c, kind in zip(t.columns, t.kinds or ("VARCHAR",) * len(t.columns))
                    if c in types and kind.startswith("VARCHAR")]
            if not cols:
                continue
            checks = ", ".join(f"count(*) FILTER (WHERE {c} IS NOT NULL AND {_try_convert(t, c, w)} IS NULL)"
                               for c, w in cols)
            try:
                bad = con.execute(f"SELECT {checks} FROM {t.varchar_scan()}").fetchall()[0]
            except duckdb.Error:
                continue
            for (c, _), n in zip(cols, bad):
                if n:
                    return t, c
    return None


def _try_convert(t: Table, col: str, kind: str) -> str:
    """SQL converting the text column ``col`` of ``t`` to ``kind`` as its scan does, NULL where it
    cannot: a CSV timestamp by :data:`TIMESTAMP_FORMAT` (a plain cast would also read a date alone)."""
    if kind == "TIMESTAMP" and not t.is_parquet:
        return f"TRY_STRPTIME({col}, '{TIMESTAMP_FORMAT}')"
    return f"TRY_CAST({col} AS {kind})"


@contextlib.contextmanager
def duckdb_errors(tables: list[Table], types: dict[str, str] | None = None) -> Iterator[None]:
    """Translate DuckDB errors raised while scanning ``tables``: an interrupt stays an interrupt
    (KeyboardInterrupt), anything else becomes a one-line InputError (:func:`wrap_duckdb_error`)."""
    try:
        yield
    except duckdb.InterruptException:
        raise KeyboardInterrupt from None
    except RuntimeError as exc:
        # a signal handled while a query runs: DuckDB stops the query and raises this instead
        # of the handler's exception (the CLI maps it to the signal's exit code)
        if "interrupted" in str(exc).lower():
            raise KeyboardInterrupt from None
        raise
    except duckdb.Error as exc:
        raise wrap_duckdb_error(exc, tables, types) from None


def wrap_duckdb_error(exc: duckdb.Error, tables: list[Table], types: dict[str, str] | None = None) -> InputError:
    """Turn a DuckDB error raised while scanning ``tables`` into a one-line InputError.

    The message names the file DuckDB complained about and, for a value that does not cast to
    its column's type, the column (found by :func:`diagnose` when DuckDB does not say). It never
    repeats row content (DuckDB quotes offending lines and values; those are dropped).
    """
    if isinstance(exc, duckdb.OutOfMemoryException):
        return InputError("DuckDB ran out of memory within --memory-limit (raise --memory-limit; "
                          "DuckDB spills to disk but some steps need a minimum)")
    text = str(exc)
    if NOT_WHOLE in text:
        where = text.split(NOT_WHOLE, 1)[1]
        path, _, col = where.rpartition(" :: ")
        col = re.match(r"[A-Za-z0-9_]*", col).group(0)
        return InputError(f"{path}: column '{col}' holds values that are not whole numbers "
                          f"(an integer column; a fractional value is refused, never rounded)")
    culprit = next((t for t in tables if str(t.path) in text or str(t.read_path) in text), None)
    kind = "unreadable gzip" if ("gzip" in text.lower() or "zlib" in text.lower()) else "malformed data"
    if kind != "unreadable gzip" or culprit is None:
        # DuckDB does not always name the file: probe each gzip stream, the smallest first (a
        # damaged small table is named without inflating chartevents)
        for t in sorted(tables, key=_size):
            if t.path.suffix == ".gz" and (culprit is None or culprit is t) and not _gzip_ok(t.path):
                culprit, kind = t, "unreadable gzip"
                break
    if kind == "unreadable gzip" and culprit is None:
        culprit = _duckdb_unreadable([t for t in tables if t.path.suffix == ".gz"])
    if kind == "unreadable gzip" and culprit is not None:
        # DuckDB's words on a compressed stream carry no row content; the paths are dropped
        why = _first(text).replace(str(culprit.read_path), "").replace(str(culprit.path), "")
        why = re.sub(r"^[A-Za-z ]*Error:\s*", "", why).strip(" :") or exc.__class__.__name__
        # DuckDB words some failures of a damaged stream as a cast of the bytes it read: the
        # quoted text is row content (a value, a line), never repeated
        why = re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", why)
        return InputError(f"{culprit.path}: unreadable gzip ({why[:160]})")
    if kind == "malformed data" and types:
        hit = diagnose([culprit] if culprit else tables, types)
        if hit is not None:
            t, col = hit
            return InputError(f"{t.path}: column '{col}' holds values that are not {types[col]} "
                              f"({exc.__class__.__name__})")
    where = str(culprit.path) if culprit else "input tables"
    if "invalid unicode" in text.lower():
        kind = "text that is not UTF-8"
    # DuckDB's "CSV Error on Line: 141" (its "LINE 1:" is the SQL statement's line, not the file's)
    line = re.search(r"(?:CSV Error on Line: |\bline )(\d+)", text)
    if culprit is not None and not culprit.is_parquet and kind == "malformed data":
        opened = unclosed_quote_line(culprit.read_path)
        if opened is not None:  # DuckDB reads the rest of the file as one field and cannot say where
            return InputError(f"{culprit.path}: a quote (\") opens on line {opened} and is not closed before the "
                              f"end of the file (malformed data, {exc.__class__.__name__})")
        too_long = re.search(r"Maximum line size of (\d+) bytes exceeded", text)
        if too_long:  # DuckDB counts lines of its own read buffers here, not of the file
            found = long_line(culprit.read_path, int(too_long.group(1)))
            if found is not None:
                return InputError(f"{culprit.path}: line {found[0]} holds {found[1] / 1e6:.1f} MB, past the "
                                  f"{int(too_long.group(1)) / 1e6:g} MB a CSV line may hold (a damaged file?)")
        if not line:  # DuckDB's sniffer gives up on a row of another width without naming it
            width = row_width_problem(culprit.read_path)
            if width is not None:
                return InputError(f"{culprit.path}: {width} (malformed data, {exc.__class__.__name__})")
    at = f" near line {line.group(1)}" if (culprit and line and not culprit.is_parquet) else ""
    return InputError(f"{where}: {kind}{at} ({exc.__class__.__name__})")


def _open_csv(path: Path, mode: str, **kw):
    """``path`` opened for reading, inflated when it is a gzip (the error-path readers below)."""
    return (gzip.open if path.name.endswith(".gz") else open)(path, mode, **kw)


def unclosed_quote_line(path: Path) -> int | None:
    """The line (1 = the header) on which a quoted field opens that no quote closes before the end
    of the CSV file ``path`` (plain or gzip), or None when every quote is closed. A doubled quote
    inside a quoted field (RFC 4180's escape) opens and closes, so it leaves the state as it was.
    Reads the whole file: for the error path only."""
    inside, opened, n = False, None, 0
    try:
        with _open_csv(path, "rb") as fh:
            for n, raw in enumerate(fh, start=1):
                count = raw.count(b'"')
                if count % 2:
                    inside = not inside
                    opened = n if inside else None
    except (OSError, EOFError, ValueError):
        return None
    return opened if inside else None


def long_line(path: Path, limit: int) -> tuple[int, int] | None:
    """``(line, bytes)`` of the first line of the file ``path`` (plain or gzip; 1 = the header)
    longer than ``limit`` bytes, else None. Reads in 1 MiB pieces up to it: for the error path only."""
    n, size = 1, 0
    try:
        with _open_csv(path, "rb") as fh:
            while piece := fh.readline(1 << 20):
                size += len(piece)
                if piece.endswith(b"\n"):
                    if size - 1 > limit:
                        return n, size - 1
                    n, size = n + 1, 0
    except (OSError, EOFError, ValueError):
        return None
    return (n, size) if size > limit else None


def row_width_problem(path: Path) -> str | None:
    """``line N has K fields where the header has H`` for the first row of the CSV file ``path``
    (plain or gzip; RFC 4180 quoting) whose field count differs from the header's, else None.
    Reads up to that row: for the error path only."""
    import csv

    try:
        with _open_csv(path, "rt", encoding="utf-8", errors="replace", newline="") as fh:
            reader = csv.reader(fh, strict=True)
            width = len(next(reader, []))
            for row in reader:
                if row and len(row) != width:
                    return f"line {reader.line_num} has {len(row)} fields where the header has {width}"
    except (OSError, EOFError, ValueError, csv.Error):
        return None
    return None


def _first(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def _duckdb_unreadable(tables: list[Table]) -> Table | None:
    """The first of ``tables`` whose scan DuckDB cannot read to the end (error path only)."""
    with contextlib.closing(connect()) as con:
        for t in tables:
            try:
                con.execute(f"SELECT count(*) FROM {t.varchar_scan()}").fetchall()
            except duckdb.Error:
                return t
    return None


def _size(table: Table) -> int:
    try:
        return table.read_path.stat().st_size
    except OSError:
        return 0


def _gzip_ok(path: Path) -> bool:
    """Whether ``path`` inflates to its end (ISA-L; error path only)."""
    from isal import igzip, isal_zlib

    try:
        with igzip.open(path, "rb") as fh:
            while fh.read(1 << 24):
                pass
        return True
    except (OSError, EOFError, ValueError, isal_zlib.error):
        return False


# ------------------------------------------------------------------ gzip padding
#
# Some copy and archive tools pad a file with zero bytes up to a block size. GNU gzip, zcat and
# Python's gzip module ignore zero bytes after the last member; DuckDB does not (it reads them as
# the start of another member and fails with "Input is not a GZIP stream"). A padded .csv.gz is
# found from its tail and DuckDB reads a copy of its bytes up to the end of the last member.

_COPIES: dict[str, Path] = {}


def _trailing_zeros(path: Path, size: int) -> int:
    n, pos = 0, size
    with path.open("rb") as fh:
        while pos > 0:
            step = min(1 << 16, pos)
            fh.seek(pos - step)
            block = fh.read(step)
            stripped = block.rstrip(b"\0")
            n += len(block) - len(stripped)
            if stripped:
                return n
            pos -= step
    return n


def gzip_data_end(path: Path) -> int | None:
    """The offset just past the last gzip member of ``path`` when only zero bytes follow it,
    or None when the file ends with its last member (no padding).

    Cheap for an unpadded file: the tail is read, and a gzip member ends with the input size
    modulo 2**32 (little endian), which is never 0 and rarely below the compressed size for a
    non-empty CSV; only a tail of zero bytes that cannot be such a trailer (4 or more zeros, or a
    size below the file's) costs one decompression pass (zlib, output discarded) to find the
    members' end.

    Raises:
        InputError: the gzip data is corrupt or cut (file and reason named).
    """
    size = path.stat().st_size
    zeros = _trailing_zeros(path, size)
    if zeros == 0 or size < 18:
        return None
    with path.open("rb") as fh:
        fh.seek(size - 4)
        isize = int.from_bytes(fh.read(4), "little")
    if zeros < 4 and isize >= size:
        return None
    end, pos = 0, 0
    d = zlib.decompressobj(31)
    with path.open("rb") as fh:
        try:
            while True:
                chunk = fh.read(1 << 20)
                if not chunk:
                    break
                pos += len(chunk)
                data = chunk
                while data:
                    while data and not d.eof:
                        d.decompress(data, 1 << 24)
                        data = d.unconsumed_tail
                    if not d.eof:
                        break
                    rest = d.unused_data
                    end = pos - len(rest) - len(data)
                    if rest.strip(b"\0") == b"" and end >= size - zeros:
                        return end if end < size else None
                    d = zlib.decompressobj(31)
                    data = rest.lstrip(b"\0") if rest[:1] == b"\0" else rest
        except zlib.error as exc:
            raise InputError(f"{path}: unreadable gzip ({_reason(exc)})") from None
    if d.eof:
        return end if end < size else None
    raise InputError(f"{path}: unreadable gzip (the compressed data ends early)")


def _unpadded(path: Path) -> Path | None:
    """A copy of ``path`` without its trailing zero padding (None when it has none). Copies live
    in one private temporary folder of this process, removed when the process ends."""
    end = gzip_data_end(path)
    if end is None:
        return None
    key = f"{path.resolve()}:{path.stat().st_mtime_ns}:{end}"
    if key not in _COPIES:
        if not _COPIES:
            folder = Path(tempfile.mkdtemp(prefix="abps-unpadded-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            _COPIES["folder"] = folder
        dst = _COPIES["folder"] / f"{len(_COPIES)}-{path.name}"
        with path.open("rb") as src, dst.open("wb") as out:
            left = end
            while left:
                buf = src.read(min(left, 1 << 22))
                if not buf:
                    break
                out.write(buf)
                left -= len(buf)
        os.chmod(dst, 0o600)
        _COPIES[key] = dst
    return _COPIES[key]

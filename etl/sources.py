"""Locating and scanning raw source tables with DuckDB.

A table is found as ``<dir>/<module>/<name>.parquet``, ``.csv.gz`` or ``.csv`` (the MIMIC-IV
v2.2 to v3.1 layouts all use ``hosp/`` and ``icu/``). CSV tables are scanned with an explicit
column list read from their header line, so a text value in a column that DuckDB's sniffer would
have guessed numeric can never break a long scan half way; the columns the ETL uses are cast
to their types, all others stay VARCHAR.
"""

from __future__ import annotations

import contextlib
import gzip
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import duckdb

from etl.errors import InputError

SUFFIXES = (".parquet", ".csv.gz", ".csv")


@dataclass(frozen=True)
class Table:
    """One located raw table.

    Attributes:
        name: logical name, e.g. ``"icustays"``.
        path: file on disk.
        columns: column names in file order (from the CSV header or the Parquet schema).
    """

    name: str
    path: Path
    columns: tuple[str, ...]

    @property
    def is_parquet(self) -> bool:
        return self.path.suffix == ".parquet"

    def scan_sql(self, types: dict[str, str]) -> str:
        """A DuckDB table expression reading this file.

        Args:
            types: DuckDB types of the columns the caller uses; other columns are VARCHAR (CSV)
                or left as stored (Parquet, where the caller's casts apply in SQL).
        """
        path = str(self.path).replace("'", "''")
        if self.is_parquet:
            casts = ", ".join(f"CAST({c} AS {t}) AS {c}" for c, t in types.items() if c in self.columns)
            replace = f" REPLACE ({casts})" if casts else ""
            return f"(SELECT *{replace} FROM read_parquet('{path}'))"
        cols = ", ".join(
            f"'{c}': '{types.get(c, 'VARCHAR')}'" for c in self.columns
        )
        return (
            f"read_csv('{path}', header=true, delim=',', quote='\"', escape='\"', "
            f"columns={{{cols}}}, timestampformat='%Y-%m-%d %H:%M:%S', nullstr='')"
        )


def _csv_header(path: Path) -> tuple[str, ...]:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
                line = fh.readline()
        else:
            with path.open("r", encoding="utf-8", newline="") as fh:
                line = fh.readline()
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: unreadable ({_reason(exc)})") from None
    cols = tuple(c.strip().strip('"').lower() for c in line.rstrip("\r\n").split(","))
    if not line.strip() or not all(cols):
        raise InputError(f"{path}: empty file or missing CSV header")
    return cols


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
    return text[:160]


def locate(root: Path, module: str, name: str, required: tuple[str, ...]) -> Table:
    """Find ``<root>/<module>/<name>.{parquet,csv.gz,csv}`` and check its columns.

    ``module`` may be empty for sources whose tables lie directly in ``root`` (eICU).

    Raises:
        InputError: the table is missing, unreadable, or lacks a required column
            (the message names the file and the column).
    """
    base = root / module if module else root
    label = f"{module}/{name}" if module else name
    for suffix in SUFFIXES:
        path = base / f"{name}{suffix}"
        if path.is_file():
            break
    else:
        raise InputError(f"missing table {label} (.csv.gz, .csv or .parquet) under {root}")
    if path.suffix == ".parquet":
        try:
            cols = tuple(
                r[0].lower()
                for r in duckdb.sql(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()
            )
        except duckdb.Error as exc:
            raise InputError(f"{path}: unreadable Parquet ({_reason(exc)})") from None
    else:
        cols = _csv_header(path)
    for col in required:
        if col not in cols:
            raise InputError(f"{path}: missing column '{col}'")
    return Table(name, path, cols)


@contextlib.contextmanager
def duckdb_errors(tables: list[Table]) -> Iterator[None]:
    """Translate DuckDB errors raised while scanning ``tables``: an interrupt stays an interrupt
    (KeyboardInterrupt), anything else becomes a one-line InputError (:func:`wrap_duckdb_error`)."""
    try:
        yield
    except duckdb.InterruptException:
        raise KeyboardInterrupt from None
    except duckdb.Error as exc:
        raise wrap_duckdb_error(exc, tables) from None


def wrap_duckdb_error(exc: duckdb.Error, tables: list[Table]) -> InputError:
    """Turn a DuckDB error raised while scanning ``tables`` into a one-line InputError.

    The message names the file DuckDB complained about when it can be told, and never
    repeats row content (DuckDB quotes offending lines; those are dropped).
    """
    text = str(exc)
    culprit = next((t for t in tables if str(t.path) in text), None)
    kind = "unreadable gzip" if ("gzip" in text.lower() or "zlib" in text.lower()) else "malformed data"
    if culprit is None:
        for t in tables:  # DuckDB does not always name the file: probe each gzip stream
            if t.path.suffix == ".gz" and not _gzip_ok(t.path):
                culprit, kind = t, "unreadable gzip"
                break
    where = str(culprit.path) if culprit else "input tables"
    return InputError(f"{where}: {kind} ({exc.__class__.__name__})")


def _gzip_ok(path: Path) -> bool:
    try:
        with gzip.open(path, "rb") as fh:
            while fh.read(1 << 24):
                pass
        return True
    except (OSError, EOFError, zlib.error):
        return False

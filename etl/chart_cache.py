"""A one-time Parquet copy of MIMIC-IV ``chartevents``, written on first read and reused.

Why (docs/decisions.md, "chartevents Parquet cache"): the gzip CSV of chartevents is one
deflate stream, inflated on one core, and its text is parsed again on every ``abps etl`` run;
the ETL is bound by that (docs/benchmarks.md, ETL). The cache keeps only the four columns the
ETL reads (``stay_id``, ``charttime``, ``itemid``, ``valuenum``), already typed, as zstd
Parquet that DuckDB scans in parallel; every later run reads it instead of the CSV.

A cache entry is one Parquet file and one JSON manifest per source file (named by a hash of
the source's resolved path). The entry is used only when the manifest matches the source as it
is now: the same size in bytes, the same modification time (ns), the same SHA-256 of its first
and last MiB, the same columns and types, the same cache format, and a Parquet file whose footer
holds the row count the manifest recorded when the copy was written (DuckDB's count of the rows
it copied). Anything else (a changed, replaced or touched source, a truncated or foreign
cache file) rebuilds the entry; the Parquet file is written under a temporary name and renamed,
and the manifest is written last, so an interrupted build is never used.

The cache holds patient-level data (the same rows as the source): it lives where the user
says (``--chart-cache DIR``), by default under the user's cache folder
(``$ABPS_CACHE_DIR``, else ``$XDG_CACHE_HOME/abps``, else ``~/.cache/abps``), and
``--chart-cache off`` never writes one.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import duckdb

from etl.io import atomic_write_text
from etl.sources import Table

#: Bump when the cached layout changes: every older entry is then rebuilt.
FORMAT = 1
#: With ``--chart-cache auto`` (the default) only sources at least this large are cached: a small
#: file (the demo) reads as fast as its copy would, and writes nothing outside the output.
AUTO_MIN_BYTES = 64 * 2**20
#: Bytes hashed at each end of the source.
HASH_BYTES = 2**20


def default_cache_dir() -> Path:
    """``$ABPS_CACHE_DIR``, else ``$XDG_CACHE_HOME/abps``, else ``~/.cache/abps``; plus ``chartevents``."""
    if os.environ.get("ABPS_CACHE_DIR"):
        return Path(os.environ["ABPS_CACHE_DIR"]) / "chartevents"
    base = Path(os.environ["XDG_CACHE_HOME"]) if os.environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "abps" / "chartevents"


def fingerprint(path: Path) -> dict:
    """Size, mtime (ns) and the SHA-256 of the first and last :data:`HASH_BYTES` bytes of ``path``.

    Raises:
        OSError: the file cannot be read.
    """
    st = path.stat()
    h = hashlib.sha256()
    with path.open("rb") as fh:
        h.update(fh.read(HASH_BYTES))
        if st.st_size > HASH_BYTES:
            fh.seek(max(HASH_BYTES, st.st_size - HASH_BYTES))
            h.update(fh.read(HASH_BYTES))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256_ends": h.hexdigest()}


@dataclass(frozen=True)
class CacheResult:
    """What :func:`use_cache` did.

    Attributes:
        table: the table to scan (the cache's Parquet file, or the source unchanged).
        status: ``off`` (not asked / too small), ``hit`` (a matching entry was read),
            ``written`` (no entry), ``rebuilt`` (an entry that no longer matched was replaced),
            or ``unwritable`` (the cache folder could not be written; the source was read).
        rows: rows in the cache (None when none is used).
        seconds: time spent checking and writing the entry.
        reason: why an entry was rebuilt or could not be written (no row content).
    """

    table: Table
    status: str
    rows: int | None = None
    seconds: float = 0.0
    reason: str = ""


def _entry(cache_dir: Path, source: Path) -> tuple[Path, Path]:
    key = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:16]
    return cache_dir / f"{source.name.split('.')[0]}-{key}.parquet", cache_dir / f"{source.name.split('.')[0]}-{key}.json"


def _parquet_rows(con: duckdb.DuckDBPyConnection, path: Path) -> int | None:
    try:
        q = str(path).replace("'", "''")
        return int(con.execute(f"SELECT sum(num_rows) FROM parquet_file_metadata('{q}')").fetchall()[0][0])
    except (duckdb.Error, TypeError):
        return None


def _mismatch(manifest: dict, want: dict, con: duckdb.DuckDBPyConnection, parquet: Path) -> str:
    """Why the entry does not match (empty string: it matches)."""
    for k in ("format", "columns", "types"):
        if manifest.get(k) != want[k]:
            return f"cache {k} changed"
    for k in ("size", "mtime_ns", "sha256_ends"):
        if manifest.get("source", {}).get(k) != want["source"][k]:
            return f"source {k.replace('_ns', '').replace('sha256_ends', 'content hash')} changed"
    if not parquet.is_file():
        return "cache file missing"
    if _parquet_rows(con, parquet) != manifest.get("rows"):
        return "cache file row count differs from its manifest"
    return ""


def use_cache(con: duckdb.DuckDBPyConnection, table: Table, types: dict[str, str], columns: tuple[str, ...],
              setting: str) -> CacheResult:
    """The chartevents table to scan: a valid cache entry, a new one, or the source itself.

    Args:
        con: the ETL's DuckDB connection (its threads and memory limit bound the copy).
        table: the located source table (a Parquet source is returned unchanged).
        types: DuckDB types of ``columns``.
        columns: the columns copied (the ones the ETL reads), in this order.
        setting: ``auto`` (cache sources of at least :data:`AUTO_MIN_BYTES` in
            :func:`default_cache_dir`), ``off``, or a folder (always cache there).

    Raises:
        duckdb.Error: the source could not be read while copying (the caller names the file).
    """
    t0 = time.perf_counter()
    if table.is_parquet or setting == "off":
        return CacheResult(table, "off")
    if setting == "auto":
        if table.path.stat().st_size < AUTO_MIN_BYTES:
            return CacheResult(table, "off")
        cache_dir = default_cache_dir()
    else:
        cache_dir = Path(setting).expanduser()
    parquet, manifest_path = _entry(cache_dir, table.path)
    want = {"format": FORMAT, "columns": list(columns), "types": [types[c] for c in columns],
            "source": fingerprint(table.path)}
    status, reason = "written", ""
    if manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError):
            manifest = {}
        reason = _mismatch(manifest, want, con, parquet)
        if not reason:
            return CacheResult(_as_table(table, parquet, columns, types), "hit", manifest["rows"],
                               time.perf_counter() - t0)
        status = "rebuilt"
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        manifest_path.unlink(missing_ok=True)  # the old entry is invalid from here on
        tmp = parquet.with_name(parquet.name + f".tmp{os.getpid()}")
        select = ", ".join(columns)
        q = str(tmp).replace("'", "''")
        try:
            rows = con.execute(f"COPY (SELECT {select} FROM {table.scan_sql(types)}) TO '{q}' "
                               "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 1000000)").fetchall()[0][0]
            os.replace(tmp, parquet)
        finally:
            tmp.unlink(missing_ok=True)
        if fingerprint(table.path) != want["source"]:  # the source changed while it was copied
            parquet.unlink(missing_ok=True)
            return CacheResult(table, "unwritable", None, time.perf_counter() - t0, "source changed while copied")
        atomic_write_text(manifest_path, json.dumps({**want, "rows": int(rows),
                                                     "source_name": table.path.name}, indent=1))
    except OSError as exc:
        return CacheResult(table, "unwritable", None, time.perf_counter() - t0,
                           f"{exc.__class__.__name__} writing {cache_dir}")
    return CacheResult(_as_table(table, parquet, columns, types), status, int(rows), time.perf_counter() - t0, reason)


def _as_table(table: Table, parquet: Path, columns: tuple[str, ...], types: dict[str, str]) -> Table:
    return replace(table, path=parquet, columns=tuple(columns), kinds=tuple(types[c] for c in columns))

"""A one-time Parquet cache of the vitals per charttime that the ETL derives from MIMIC-IV
``chartevents``, reused by later runs while the source and the query are unchanged.
When an entry is used or rebuilt, and where it lives: docs/etl.md, "Module notes".
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb

from etl.errors import InputError
from etl.io import atomic_write_text, file_digest, user_cache_dir
from etl.sources import Table, sql_path

#: Bump when the cached layout changes: every older entry is then rebuilt (2: a derived
#: relation, the query's hash in the manifest, rows sorted by stay and charttime; 3: written by
#: the streamed pass, ``n_rows`` as BIGINT; 4: only the rows of the stays' widest vital windows,
#: their digest in the manifest, LZ4).
FORMAT = 4
#: The source's table expression inside the query hashed into the manifest (the query's text
#: without the path, so moving nothing but the cache folder keeps the key).
SOURCE_PLACEHOLDER = "<chartevents>"
#: With ``--chart-cache auto`` (the default) only sources at least this large are cached: a small
#: file (the demo) reads as fast as its copy would, and writes nothing outside the output.
AUTO_MIN_BYTES = 64 * 2**20
#: Bytes hashed at each end of the source.
HASH_BYTES = 2**20


def default_cache_dir() -> Path:
    """``$ABPS_CACHE_DIR``, else ``$XDG_CACHE_HOME/abps``, else ``~/.cache/abps``; plus ``chartevents``
    (:func:`etl.io.user_cache_dir`)."""
    return user_cache_dir("chartevents")


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
        relation: a DuckDB table expression of the cached query's rows (the cache's Parquet
            file), or None when the cache is not used (the caller runs the query on the source).
        status: ``off`` (not asked / too small), ``hit`` (a matching entry was read),
            ``written`` (no entry), ``rebuilt`` (an entry that no longer matched was replaced),
            or ``unwritable`` (the cache folder could not be written; the source was read).
        rows: rows in the cache (None when none is used).
        seconds: time spent checking and writing the entry.
        reason: why an entry was rebuilt or could not be written (no row content).
    """

    relation: str | None
    status: str
    rows: int | None = None
    seconds: float = 0.0
    reason: str = ""


def _cache_dir(table: Table, setting: str) -> Path | None:
    """The folder ``--chart-cache`` names for ``table``; None when nothing is cached ("off", or
    "auto" and a source under :data:`AUTO_MIN_BYTES`)."""
    if setting == "off":
        return None
    if setting == "auto":
        return default_cache_dir() if table.path.stat().st_size >= AUTO_MIN_BYTES else None
    return Path(setting).expanduser()


def may_hold(table: Table, setting: str) -> bool:
    """Whether the cache may hold a valid entry for ``table``: its manifest exists and names the
    source's size and mtime. A cheap look (no hashing, no query), for deciding whether to start
    reading the source before the entry is checked; :func:`use_cache` decides.

    Raises:
        OSError: the source cannot be stat'ed.
    """
    cache_dir = _cache_dir(table, setting)
    if cache_dir is None:
        return False
    try:
        source = _read_manifest(_entry(cache_dir, table.path)[1]).get("source")
    except OSError:
        return False
    if not isinstance(source, dict):
        return False
    st = table.path.stat()
    return source.get("size") == st.st_size and source.get("mtime_ns") == st.st_mtime_ns


def _entry(cache_dir: Path, source: Path) -> tuple[Path, Path]:
    key = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:16]
    return cache_dir / f"{source.name.split('.')[0]}-{key}.parquet", cache_dir / f"{source.name.split('.')[0]}-{key}.json"


def _read_manifest(path: Path) -> dict:
    """The manifest at ``path``; ``{}`` when it is not JSON or not a JSON object.

    Raises:
        OSError: it cannot be read.
    """
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _parquet_rows(con: duckdb.DuckDBPyConnection, path: Path) -> int | None:
    try:
        return int(con.execute(f"SELECT sum(num_rows) FROM parquet_file_metadata('{sql_path(path)}')")
                   .fetchall()[0][0])
    except (duckdb.Error, TypeError):
        return None


def _mismatch(manifest: dict, want: dict, con: duckdb.DuckDBPyConnection, parquet: Path) -> str:
    """Why the entry does not match (empty string: it matches)."""
    for k in ("format", "query_sha256", "columns", "types", "scope_sha256"):
        if manifest.get(k) != want[k]:
            return {"query_sha256": "cached query changed (itemids, valid ranges or ETL version)",
                    "scope_sha256": "cached stays changed (stay_id or intime)"}.get(k, f"cache {k} changed")
    for k in ("size", "mtime_ns", "sha256_ends"):
        source = manifest.get("source")
        if not isinstance(source, dict) or source.get(k) != want["source"][k]:
            return f"source {k.replace('_ns', '').replace('sha256_ends', 'content hash')} changed"
    if not parquet.is_file():
        return "cache file missing"
    if _parquet_rows(con, parquet) != manifest.get("rows"):
        return "cache file row count differs from its manifest"
    if file_digest(parquet) != manifest.get("sha256"):  # damage inside the file (zeroed or flipped bytes)
        return "cache file content differs from its manifest (SHA-256)"
    return ""


def _read_sql(parquet: Path) -> str:
    return f"read_parquet('{sql_path(parquet)}')"


def query_sha256(query: Callable[[str], str], order_by: str = "") -> str:
    """SHA-256 of the cached query's text with the source as :data:`SOURCE_PLACEHOLDER`, and of
    its row order: the key that ties an entry to the itemids, valid ranges and SQL that made it."""
    return hashlib.sha256(f"{query(SOURCE_PLACEHOLDER)}\nORDER BY {order_by}".encode()).hexdigest()


def use_cache(con: duckdb.DuckDBPyConnection, table: Table, types: dict[str, str], columns: tuple[str, ...],
              setting: str, query: Callable[[str], str], order_by: str = "",
              build: Callable[[Path], int] | None = None, scope: str = "") -> CacheResult:
    """The rows of ``query`` over the chartevents source, from a valid cache entry or a new one.

    Args:
        con: the ETL's DuckDB connection (its threads and memory limit bound the build).
        table: the located source table (gzip CSV, CSV or Parquet: the aggregation is worth
            caching whatever the format).
        types: DuckDB types of ``columns``.
        columns: the source columns the query reads (recorded with their types in the manifest).
        setting: ``auto`` (cache sources of at least :data:`AUTO_MIN_BYTES` in
            :func:`default_cache_dir`), ``off``, or a folder (always cache there).
        query: the cached relation as a function of the source's table expression (for MIMIC-IV
            etl.mimic.cached_vitalsign_sql); its text, hashed, keys the entry.
        order_by: ``ORDER BY`` list of the rows written (empty: as produced).
        build: ``build(path) -> rows`` writes the entry's Parquet file (the rows of ``query``
            over the source, in ``order_by`` order) and returns its row count; called only
            when the entry is written. Default: DuckDB's ``COPY`` of the query. The MIMIC ETL
            passes its one streamed pass (etl/chart_stream.py), which computes the cohort's
            first-day vitals while it writes the file.
        scope: a digest of what else ``query`` reads besides the source (for MIMIC-IV the stays
            and intimes whose windows bound the cached rows); a changed scope rebuilds the entry.

    Raises:
        duckdb.Error: the source could not be read while the entry was built (the caller names
            the file).
    """
    t0 = time.perf_counter()
    cache_dir = _cache_dir(table, setting)
    if cache_dir is None:
        return CacheResult(None, "off")
    parquet, manifest_path = _entry(cache_dir, table.path)
    want = {"format": FORMAT, "query_sha256": query_sha256(query, order_by), "columns": list(columns),
            "types": [types[c] for c in columns], "scope_sha256": scope, "source": fingerprint(table.path)}
    status, reason = "written", ""
    if manifest_path.is_file():
        try:
            manifest = _read_manifest(manifest_path)
        except OSError:
            manifest = {}
        reason = _mismatch(manifest, want, con, parquet)
        if not reason:
            return CacheResult(_read_sql(parquet), "hit", manifest["rows"], time.perf_counter() - t0)
        status = "rebuilt"
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        manifest_path.unlink(missing_ok=True)  # the old entry is invalid from here on
        tmp = parquet.with_name(parquet.name + f".tmp{os.getpid()}")
        q = sql_path(tmp)
        select = f"SELECT * FROM ({query(table.scan_sql(types))})" + (f" ORDER BY {order_by}" if order_by else "")
        try:
            if build is not None:
                rows = build(tmp)
            else:
                rows = con.execute(f"COPY ({select}) TO '{q}' "
                                   "(FORMAT parquet, COMPRESSION lz4_raw, ROW_GROUP_SIZE 1000000)").fetchall()[0][0]
            os.replace(tmp, parquet)
        finally:
            tmp.unlink(missing_ok=True)
        if fingerprint(table.path) != want["source"]:  # the source changed while it was read
            parquet.unlink(missing_ok=True)
            return CacheResult(None, "unwritable", None, time.perf_counter() - t0, "source changed while copied")
        try:
            atomic_write_text(manifest_path, json.dumps({**want, "rows": int(rows), "sha256": file_digest(parquet),
                                                         "source_name": table.path.name,
                                                         "source_path": str(table.path.resolve())}, indent=1))
        except InputError:  # a full disk or a folder made read-only meanwhile: no entry without its manifest
            parquet.unlink(missing_ok=True)
            return CacheResult(None, "unwritable", None, time.perf_counter() - t0, f"cannot write {manifest_path}")
    except OSError as exc:
        return CacheResult(None, "unwritable", None, time.perf_counter() - t0,
                           f"{exc.__class__.__name__} writing {cache_dir}")
    return CacheResult(_read_sql(parquet), status, int(rows), time.perf_counter() - t0, reason)

"""MIMIC-IV -> federated ICU-mortality cohort (ABPS paper Sec. 6.1 and Appendix A): locates and checks
the source tables, runs the SQL concepts of ``etl/sql/mimic/`` in order, counts every stay dropped and
hands the kept stays to the shared tail. Details: docs/etl.md, "Module notes".
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from etl import charlson, chart_stream, progress
from etl.chart_cache import may_hold, use_cache
from etl.errors import InputError, InputWarning
from etl.io import atomic_output_dir
from etl.pipeline import (
    EARLIEST_VITALS_HOURS,
    Attrition,
    EtlOptions,
    check_keys,
    concept_sql,
    connect,
    finish,
    frame,
    scalar,
)
from etl.schema import CARE_UNITS, VITAL_COLUMNS
from etl.sources import (
    Table,
    check_flags,
    check_range,
    check_text,
    duckdb_errors,
    inflated,
    load_checked,
    locate,
    require_rows,
    wrap_duckdb_error,
)
from etl.tasks import DEFAULT_TASK, column_types, relabel, required_columns

__all__ = ["EtlOptions", "run_etl", "build_cohort", "VITAL_COLUMNS", "REQUIRED", "KEYS", "TYPES"]

REQUIRED = {
    ("hosp", "patients"): ("subject_id", "gender", "anchor_age", "anchor_year", "anchor_year_group"),
    ("hosp", "admissions"): ("subject_id", "hadm_id", "admittime", "admission_type",
                             "admission_location", "insurance", "race", "hospital_expire_flag"),
    ("hosp", "diagnoses_icd"): ("hadm_id", "seq_num", "icd_code", "icd_version"),
    ("icu", "icustays"): ("subject_id", "hadm_id", "stay_id", "first_careunit", "intime"),
    ("icu", "chartevents"): ("stay_id", "charttime", "itemid", "valuenum"),
}
TYPES = {
    "subject_id": "BIGINT", "hadm_id": "BIGINT", "stay_id": "BIGINT", "anchor_age": "INTEGER",
    "anchor_year": "INTEGER", "admittime": "TIMESTAMP", "intime": "TIMESTAMP", "outtime": "TIMESTAMP",
    "charttime": "TIMESTAMP", "itemid": "INTEGER", "valuenum": "DOUBLE",
    "hospital_expire_flag": "INTEGER", "icd_version": "INTEGER", "seq_num": "INTEGER",
}
#: The key of each table (docs/etl.md): identical duplicated rows are collapsed and counted,
#: conflicting ones refused. chartevents has no key: its identical rows (same stay, item,
#: charttime and value) are collapsed (etl/sql/mimic/vital_rows.sql) and counted inside the
#: vital window.
KEYS: dict[str, tuple[str, ...]] = {
    "patients": ("subject_id",), "admissions": ("hadm_id",), "icustays": ("stay_id",),
    "diagnoses_icd": ("hadm_id", "seq_num"),
}



_ID = (1, 2**62)
#: plausible ranges of the small tables' numeric columns (identifiers positive; ages and the
#: shifted years of MIMIC-IV's anchor): a value outside is refused, never dropped or joined away
RANGES: dict[str, dict[str, tuple[float, float]]] = {
    "patients": {"subject_id": _ID, "anchor_age": (0, 150), "anchor_year": (1, 9999)},
    "admissions": {"subject_id": _ID, "hadm_id": _ID},
    "icustays": {"subject_id": _ID, "hadm_id": _ID, "stay_id": _ID, "los": (0, 1e5)},
    "diagnoses_icd": {"subject_id": _ID, "hadm_id": _ID, "seq_num": (0, 1e4), "icd_version": (9, 10)},
}

def _checks(con: duckdb.DuckDBPyConnection, table: Table):
    """The value checks of a keyed table (the 0/1 outcome flag of admissions, :data:`RANGES`, no
    NUL byte in its text columns) on a relation of its rows as read."""

    def run(scan: str) -> None:
        if table.name == "admissions":
            check_flags(con, table, ("hospital_expire_flag",), scan=scan)
        check_range(con, table, RANGES[table.name], scan=scan)
        check_text(con, table, text_columns(table.name), scan=scan)

    return run


def text_columns(name: str) -> tuple[str, ...]:
    """The text columns of the table ``name`` in :data:`REQUIRED` (those :data:`TYPES` does not type)."""
    return next((tuple(c for c in cols if c not in TYPES) for (_, n), cols in REQUIRED.items() if n == name), ())


def _locate_all(mimic_dir: Path, task: str, types: dict[str, str]) -> dict[str, Table]:
    if not mimic_dir.is_dir():
        raise InputError(f"--mimic-dir {mimic_dir}: not a directory")
    return {name: locate(mimic_dir, module, name, cols + required_columns(task, "mimic", name), types)
            for (module, name), cols in REQUIRED.items()}


def care_unit_rows() -> str:
    """VALUES rows (first_careunit, short name) of etl.schema.CARE_UNITS for etl/sql/mimic/stays.sql."""
    return ", ".join(f"('{k}', '{v}')" for k, v in CARE_UNITS.items())


def charlson_sql(diagnoses_icd: str, admissions: str, source: str) -> str:
    """The Charlson flags per hadm_id of the kept stays (relation ``kept``), from table
    expressions of ``diagnoses_icd`` and ``admissions`` (MIMIC-IV shape; also the MEDS source's
    rebuilt relations) and a ``--comorbidity-source``."""
    if source == "same-admission":
        rel = concept_sql("mimic", "diagnoses_same_admission", diagnoses_icd=diagnoses_icd)
    else:
        rel = concept_sql("mimic", "diagnoses_earlier_admissions", diagnoses_icd=diagnoses_icd,
                          admissions=admissions)
    return charlson.charlson_flags_sql(f"({rel})")


def assemble(kept: pl.DataFrame, vitals: pl.DataFrame, cci: pl.DataFrame) -> pl.DataFrame:
    """Kept stays + first-day vitals (by stay_id) + Charlson flags (by hadm_id, absent -> 0)."""
    return (
        kept.join(vitals, on="stay_id", how="left")
        .join(cci, on="hadm_id", how="left")
        .with_columns([pl.col(c).fill_null(0).cast(pl.Int8) for c in charlson.CCI_COLUMNS])
    )


def mimic_release(con: duckdb.DuckDBPyConnection, patients: str, admissions: str, has_race: bool, layout: str) -> str:
    """Which MIMIC-IV release the loaded tables come from, e.g. ``MIMIC-IV 3.x, csv.gz tables``.

    3.x is recognised by what v3.0 added (mimic-iv-etl-facts: the ``2020 - 2022``
    ``anchor_year_group`` and the widened ``insurance`` values such as ``Private``); otherwise
    2.x (v2.0 renamed ``ethnicity`` to ``race``; a table without ``race`` is older than 2.0).

    Args:
        patients, admissions: table expressions of the two tables (their rows as read).
        has_race: admissions has a ``race`` column.
        layout: the files' format as the user sees it (``csv.gz``, ``csv``, ``Parquet``).
    """
    v3 = scalar(con, f"SELECT EXISTS (SELECT 1 FROM {patients} WHERE anchor_year_group = '2020 - 2022') "
                     f"OR EXISTS (SELECT 1 FROM {admissions} WHERE insurance = 'Private')")
    version = "3.x" if v3 else "2.x" if has_race else "1.x"
    return f"MIMIC-IV {version}, {layout} tables"


def keep_adult_unit_stays(con: duckdb.DuckDBPyConnection, opts: EtlOptions, att: Attrition, n_label: int) -> None:
    """Age and care-unit filters of ``all_stays`` (known label and intime) -> temp table ``kept``.

    Adds the two attrition rows. Raises InputError when no stay is left.
    """
    units = sorted({CARE_UNITS.get(u, u) for u in opts.care_units})
    age = "label IS NOT NULL AND intime IS NOT NULL AND age BETWEEN ? AND ?"
    n_age = scalar(con, f"SELECT count(*) FROM all_stays WHERE {age}", [opts.min_age, opts.max_age])
    att.add(f"age {opts.min_age:g} to {opts.max_age:g}", n_label, n_age)
    con.execute(f"CREATE TEMP TABLE kept AS SELECT * FROM all_stays WHERE {age} "
                "AND care_unit IN (SELECT unnest(?::VARCHAR[]))", [opts.min_age, opts.max_age, units])
    n_unit = scalar(con, "SELECT count(*) FROM kept")
    att.add(f"care unit in {', '.join(units)}", n_age, n_unit)
    if n_unit == 0:
        raise InputError("empty cohort after the age and care-unit filters (check --care-units, --min-age, --max-age)")


def vitalsign_sql(chartevents: str) -> str:
    """Vital signs per (stay_id, vital, charttime) of a chartevents-shaped table expression
    (stay_id, charttime, itemid, valuenum): etl/sql/mimic/vital_rows.sql (valid vital rows,
    identical rows collapsed) under vitalsign.sql (one mean per charttime). No window here."""
    return concept_sql("mimic", "vitalsign", vital_rows=f"({concept_sql('mimic', 'vital_rows', chartevents=chartevents)})")


def cached_vitalsign_sql(chartevents: str) -> str:
    """What the chartevents cache stores (:func:`etl.chart_cache.use_cache`): :func:`vitalsign_sql`
    over the rows of ``chartevents`` inside the widest vital window any run can ask for,
    [intime + :data:`EARLIEST_VITALS_HOURS` h, intime + 24 h], of every stay of ``all_stays``
    (vital_window.sql). Every run's window lies inside it, so a run reads the same rows per
    charttime from the cache as from the file; the rest of the file is never needed."""
    rows = concept_sql("mimic", "vital_window", rows=chartevents, from_hours=EARLIEST_VITALS_HOURS, stays="all_stays")
    return vitalsign_sql(f"({rows})")


#: Order of the cached vitalsign rows: sorted rows compress 3.7x better and are read and joined
#: about 3x faster than unsorted ones (docs/benchmarks.md, ETL).
VITALSIGN_ORDER = "stay_id, charttime, vital"


def vital_per_stay_sql(vitalsign: str, opts: EtlOptions) -> str:
    """etl/sql/mimic/vital_per_stay.sql over the rows of ``vitalsign`` (vitals per charttime)
    inside the kept stays' windows (vital_window.sql)."""
    rel = concept_sql("mimic", "vital_window", rows=vitalsign, from_hours=float(opts.vitals_from_hours), stays="kept")
    return concept_sql("mimic", "vital_per_stay", vitalsign=f"({rel})")


def first_day_vitals(con: duckdb.DuckDBPyConnection, chartevents: str | None, opts: EtlOptions, att: Attrition,
                     dup_note: str, vitalsign: str | None = None, streamed: bool = False) -> pl.DataFrame:
    """The 21 first-day vital aggregates per stay of ``kept``, from the source or from the cache.

    Either ``chartevents``, a chartevents-shaped table expression (stay_id, charttime, itemid,
    valuenum): its rows in the window (etl/sql/mimic/vital_window.sql) go through
    :func:`vitalsign_sql`; or ``vitalsign``, the rows of :func:`cached_vitalsign_sql` (the
    chartevents cache), restricted to the window afterwards. Both give the same rows per
    charttime, since the window depends on a row's stay and charttime only. Then
    vital_per_stay.sql (mean / min / max per stay and vital) and first_day_vitalsign.sql (wide).
    Or ``streamed``: the temp table ``vital_per_stay`` was filled by the streamed pass
    (:func:`stream_vitals`). Identical rows collapsed are an attrition row ``dup_note`` (unit rows).
    """
    from_hours = float(opts.vitals_from_hours)
    if streamed:
        pass
    elif vitalsign is None:
        rel = vitalsign_sql(f"({concept_sql('mimic', 'vital_window', rows=chartevents, from_hours=from_hours, stays='kept')})")
        con.execute("CREATE TEMP TABLE vital_per_stay AS " + concept_sql("mimic", "vital_per_stay", vitalsign=f"({rel})"))
    else:
        con.execute("CREATE TEMP TABLE vital_per_stay AS " + vital_per_stay_sql(vitalsign, opts))
    n_rows, n_distinct = con.execute("SELECT coalesce(sum(n_rows), 0), coalesce(sum(n_distinct), 0) "
                                     "FROM vital_per_stay").fetchall()[0]
    if n_rows != n_distinct:
        att.add(dup_note, n_rows, n_distinct, unit="rows")
    return frame(con, concept_sql("mimic", "first_day_vitalsign"))


def stay_windows(con: duckdb.DuckDBPyConnection, stays: str, from_hours: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The vital windows of the stays of relation ``stays`` (stay_id, intime) as arrays for the
    streamed pass: ``(stay_id, start_us, end_us)``, sorted by stay_id: [intime + ``from_hours`` h,
    intime + 24 h], both bounds included, computed with vital_window.sql's own expressions."""
    w = con.execute(
        f"SELECT stay_id, epoch_us(intime + to_microseconds(CAST({float(from_hours)} * 3600e6 AS BIGINT))), "
        f"epoch_us(intime + INTERVAL 24 HOUR) FROM {stays} "
        "WHERE stay_id IS NOT NULL AND intime IS NOT NULL ORDER BY stay_id").fetchnumpy()
    return tuple(np.asarray(w[k], np.int64) for k in w)


def windows_sha256(window: tuple[np.ndarray, ...]) -> str:
    """SHA-256 of :func:`stay_windows` arrays: ties a cache entry to the stays and intimes it covers."""
    h = hashlib.sha256()
    for a in window:
        h.update(np.ascontiguousarray(a, "<i8").tobytes())
    return h.hexdigest()


def stream_vitals(con: duckdb.DuckDBPyConnection, table: Table, opts: EtlOptions, scratch: Path,
                  parquet: Path | None = None, timings: dict | None = None,
                  cache_window: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                  batches: chart_stream.ChartBatches | None = None) -> int:
    """One streamed pass over a CSV chartevents (:class:`etl.chart_stream.VitalPass`): the vitals
    per charttime of :func:`cached_vitalsign_sql` (rows inside ``cache_window``, the
    :func:`stay_windows` of ``all_stays`` from :data:`EARLIEST_VITALS_HOURS`), written to
    ``parquet`` (the cache entry) when given, and, in the same pass, the first-day aggregates of
    the kept stays into the temp table ``vital_per_stay`` (vital_window.sql + vital_per_stay.sql,
    partition by partition; each stay lies in one partition). Returns the rows of the relation
    (of the kept stays' windows when no ``parquet``); the pass's stage times go into ``timings``
    (``chartevents_read_s``, ``chartevents_reduce_write_s``). ``batches``: the file's reading when
    it was started early (:func:`start_chartevents`).

    Raises:
        etl.chart_stream.StreamUnreadable: the caller scans the file with DuckDB instead (the
            partial ``vital_per_stay`` is dropped first).
    """
    bounds = [r[0] for r in con.execute(
        f"SELECT DISTINCT unnest(quantile_disc(stay_id, [{', '.join(str(i / chart_stream.PARTITIONS) for i in range(1, chart_stream.PARTITIONS))}])) AS b "
        "FROM all_stays WHERE stay_id IS NOT NULL ORDER BY b").fetchall()]
    # the kept stays' windows, vital_window.sql's bounds to the microsecond: the only rows the
    # cohort needs. The stream drops the others while it reads, or, when it writes the cache
    # entry, keeps the cache's wider window and applies this one to each partition; the
    # partitions then go to vital_per_stay.sql without vital_window.sql's join.
    window = stay_windows(con, "kept", opts.vitals_from_hours)
    if parquet is not None and cache_window is None:
        raise ValueError("the cache entry needs the window of the rows it holds (cache_window)")
    vp = chart_stream.VitalPass(table, bounds, opts.memory_limit, scratch / "chartevents_spill",
                                progress=chart_stream.progress_wanted(),
                                items=chart_stream.vital_items(vitalsign_sql("chartevents")),
                                window=window if parquet is None else cache_window, batches=batches)
    # an empty table built from no batches: Schema.empty_table() imports pandas (0.3-0.4 s of this
    # thread, with the GIL held); the streamed pass builds its Arrow arrays without it
    con.register("chart_part", pa.Table.from_batches([], schema=chart_stream.SCHEMA))
    per_stay = concept_sql("mimic", "vital_per_stay", vitalsign="chart_part")
    con.execute("CREATE OR REPLACE TEMP TABLE vital_per_stay AS " + per_stay)
    # LZ4 and dictionaries on the repetitive columns: 45 % and 30 % less CPU to write and to read back
    # than zstd, at 1.5x the size (docs/decisions.md)
    # (no column statistics: the file is always read whole; 15 % less CPU to write)
    writer = (pq.ParquetWriter(parquet, chart_stream.SCHEMA, compression="lz4", write_statistics=False,
                               use_dictionary=["stay_id", "vital", "n_rows", "n_distinct"])
              if parquet is not None else None)
    # the cache file is written on its own thread (Arrow releases the GIL; one thread keeps the
    # partitions in order) while DuckDB aggregates the same partition's window
    pool = ThreadPoolExecutor(1)
    writes: list = []

    def sink(part):
        if writer is not None:
            writes.append(pool.submit(writer.write_table, part, row_group_size=1_000_000))
            part = chart_stream.in_window(part, window)
        con.register("chart_part", part)
        con.execute("INSERT INTO vital_per_stay " + per_stay)

    try:
        vp.run(sink)
        for f in writes:
            f.result()
    finally:
        pool.shutdown(wait=True)
        con.unregister("chart_part")
        if writer is not None:
            writer.close()
    if timings is not None:
        timings.update({f"chartevents_{k}": v for k, v in vp.seconds.items()})
    return vp.out_rows


def start_chartevents(table: Table, opts: EtlOptions) -> chart_stream.ChartBatches | None:
    """Start reading a CSV chartevents before the other tables are checked, when the run is going
    to read it (:class:`etl.chart_stream.ChartBatches` with ``early``): its inflating and parsing
    then use the cores the checks leave idle. None for a Parquet source, or when a cache entry for
    it may be valid (:func:`etl.chart_cache.may_hold`): a cached run reads no chartevents.
    The caller closes what it gets when the run ends before :func:`chartevents_vitals` takes it."""
    if not chart_stream.streamable(table) or may_hold(table, opts.chart_cache):
        return None
    return chart_stream.ChartBatches(table, opts.memory_limit, early=True)


def refuse_as_duckdb(con: duckdb.DuckDBPyConnection, table: Table, exc: chart_stream.StreamUnreadable,
                     types: dict[str, str], scratch: Path) -> None:
    """Raise the error DuckDB's scan of the whole file would raise, when DuckDB refuses the text
    the stream refused (``exc.text``: one parse job's rows behind the header), without DuckDB
    reading the file (on MIMIC-IV v3.1, a full scan to the last row and a second one to name
    the column). Return when there is no such text or DuckDB reads it: the caller then scans
    the file with DuckDB, which reads it or words its error.

    The message names the source file and, as :func:`etl.sources.wrap_duckdb_error` words it,
    the column (found in that text) or the line (counted in the whole file).

    Raises:
        InputError: DuckDB refuses the text.
    """
    if exc.text is None:
        return
    probe = scratch / "chartevents-unreadable.csv"
    probe.write_bytes(exc.text)
    part = replace(table, read_from=probe, loaded_as=None)
    try:
        con.execute(f"SELECT count(stay_id), count(charttime), count(itemid), sum(valuenum) "
                    f"FROM {part.scan_sql(types)}").fetchall()
    except duckdb.InterruptException:  # a Ctrl-C stays an interrupt (duckdb_errors)
        raise
    except duckdb.Error as err:
        wrapped = str(wrap_duckdb_error(err, [part], types))
        line = re.search(r"near line (\d+)", wrapped)
        if line:  # a line of the text -> its line in the file (both count the header as line 1)
            wrapped = wrapped.replace(line.group(0), f"near line {int(line.group(1)) + exc.rows_before}", 1)
        raise InputError(wrapped) from None
    finally:
        probe.unlink(missing_ok=True)


def chartevents_vitals(con: duckdb.DuckDBPyConnection, table: Table, scan: str, types: dict[str, str],
                       opts: EtlOptions, att: Attrition, note: str, scratch: Path, cache_info: dict | None,
                       timings: dict | None = None,
                       batches: chart_stream.ChartBatches | None = None) -> pl.DataFrame:
    """The first-day vitals of the kept stays from chartevents, reading the source at most once.

    A valid cache entry is read (:func:`etl.chart_cache.use_cache`); otherwise a CSV source is
    read by the streamed pass (:func:`stream_vitals`), which writes the cache entry when one is
    asked for; a Parquet source, or a file the stream cannot read, is scanned by DuckDB (the
    concept SQL, and DuckDB's one-line errors). ``batches``: the source's reading started by
    :func:`start_chartevents`, given to the first streamed pass (the caller closes it).
    """
    early = [batches] if batches is not None else []
    streamable = chart_stream.streamable(table)
    built: list[int] = []
    cache_window = stay_windows(con, "all_stays", EARLIEST_VITALS_HOURS) if opts.chart_cache != "off" else None

    def build(path: Path) -> int:
        built.append(stream_vitals(con, table, opts, scratch, parquet=path, timings=timings,
                                   cache_window=cache_window, batches=early.pop() if early else None))
        return built[-1]

    def cached(build=None):
        return use_cache(con, table, types, REQUIRED[("icu", "chartevents")], opts.chart_cache, cached_vitalsign_sql,
                         VITALSIGN_ORDER, build=build, scope=windows_sha256(cache_window) if cache_window is not None else "")

    try:
        cache = cached(build if streamable else None)
    except chart_stream.StreamUnreadable as exc:
        refuse_as_duckdb(con, table, exc, types, scratch)
        streamable, built = False, []
        con.execute("DROP TABLE IF EXISTS vital_per_stay")
        cache = cached()
    info = cache_info if cache_info is not None else {}
    info.update(status=cache.status, rows=cache.rows, seconds=round(cache.seconds, 3), reason=cache.reason)
    if built and cache.status in ("written", "rebuilt"):
        info["read_by"] = "stream"
        return first_day_vitals(con, None, opts, att, note, streamed=True)
    con.execute("DROP TABLE IF EXISTS vital_per_stay")
    if cache.relation is not None:
        info["read_by"] = "cache"
        return first_day_vitals(con, None, opts, att, note, vitalsign=cache.relation)
    if streamable:
        try:
            stream_vitals(con, table, opts, scratch, timings=timings, batches=early.pop() if early else None)
            info["read_by"] = "stream"
            return first_day_vitals(con, None, opts, att, note, streamed=True)
        except chart_stream.StreamUnreadable as exc:
            refuse_as_duckdb(con, table, exc, types, scratch)
            con.execute("DROP TABLE IF EXISTS vital_per_stay")
    info["read_by"] = "duckdb"
    return first_day_vitals(con, scan, opts, att, note)


def build_cohort(mimic_dir: str | Path, opts: EtlOptions, scratch: Path,
                 cache_info: dict | None = None) -> tuple[pl.DataFrame, Attrition, dict, dict, str]:
    """Run the concepts and return (cohort before partition, attrition, timings, inputs, release
    (:func:`mimic_release`)).

    The vitals per charttime come from the chartevents cache when ``opts.chart_cache`` asks for
    one (:func:`etl.chart_cache.use_cache` over :func:`vitalsign_sql`); what the cache did is written into ``cache_info``
    (status, rows, seconds, reason) when a dict is given.

    Raises:
        InputError: missing, ambiguous or unreadable table, missing / mistyped column,
            conflicting duplicate keys, or an empty cohort after a filter.
    """
    mimic_dir = Path(mimic_dir)
    types = {**TYPES, **column_types(opts.task, "mimic")}
    tables = _locate_all(mimic_dir, opts.task, types)
    inputs = {name: str(t.path.relative_to(mimic_dir)) for name, t in tables.items()}
    con = connect(opts.threads, opts.memory_limit, scratch)
    att = Attrition()
    timings: dict[str, float] = {}
    watched = list(tables.values())  # the tables an error may name (duckdb_errors)
    with contextlib.ExitStack() as stack, contextlib.closing(con), duckdb_errors(watched, types):
        t0 = time.perf_counter()
        # chartevents' reading starts now and runs beside the checks (closed at the end, if unused)
        batches = start_chartevents(tables["chartevents"], opts)
        if batches is not None:
            stack.callback(batches.close)
        progress.step("checking the input tables", 0)
        # each keyed table is read once, from a copy inflated by ISA-L (an error names the
        # source file): checked as read, then converted; the copies go once loaded
        for name in KEYS:
            text = inflated(tables[name], scratch / "inflated")
            watched.append(text)
            tables[name] = replace(load_checked(con, text, types, f"src_{name}", _checks(con, text)),
                                   read_from=tables[name].read_from)
            watched.remove(text)
        shutil.rmtree(scratch / "inflated", ignore_errors=True)
        require_rows(con, tables["chartevents"], "every first-day vital comes from it")
        for name, why in (("icustays", "every stay of the cohort is one of its rows"),
                          ("admissions", "every stay's outcome comes from its admission"),
                          ("patients", "every stay's age comes from its patient")):
            require_rows(con, tables[name], why)
        if not con.execute(f"SELECT 1 FROM {tables['diagnoses_icd'].loaded_as} LIMIT 1").fetchall():
            warnings.warn(InputWarning(f"{tables['diagnoses_icd'].path}: no data rows; every Charlson comorbidity "
                                       "of the cohort is 0"), stacklevel=1)
        tables = check_keys(con, tables, KEYS, types, att, mimic_dir)
        pat, adm = tables["patients"], tables["admissions"]
        release = mimic_release(con, pat.loaded_as, adm.loaded_as, "race" in adm.columns,
                                "Parquet" if pat.is_parquet else pat.path.name.split(".", 1)[1])
        timings["checks_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        s = {name: t.scan_sql(types) for name, t in tables.items()}
        con.execute("CREATE TEMP TABLE all_stays AS " + concept_sql(
            "mimic", "stays", icustays=s["icustays"], admissions=s["admissions"], patients=s["patients"],
            care_units=care_unit_rows()))
        relabel(con, "mimic", opts.task, s)
        n_icu = scalar(con, f"SELECT count(*) FROM {s['icustays']}")
        n_join = scalar(con, "SELECT count(*) FROM all_stays")
        att.add("ICU stays with admission and patient records", n_icu, n_join)
        if n_join == 0:
            raise InputError("empty cohort: no ICU stay joins an admission and a patient "
                             "(check icustays, admissions and patients)")
        n_label = scalar(con, "SELECT count(*) FROM all_stays WHERE label IS NOT NULL AND intime IS NOT NULL")
        known = "in-hospital outcome" if opts.task == DEFAULT_TASK else f"{opts.task} label"
        att.add(f"known {known} and intime", n_join, n_label)
        keep_adult_unit_stays(con, opts, att, n_label)
        timings["stays_s"] = time.perf_counter() - t0
        progress.step("first-day vitals (chartevents)")

        t0 = time.perf_counter()
        vitals = chartevents_vitals(
            con, tables["chartevents"], s["chartevents"], types, opts, att,
            f"identical duplicate rows collapsed in {inputs['chartevents']} (vital rows in the window)", scratch,
            cache_info, timings, batches)
        if batches is not None:
            batches.close()  # consumed, or not needed (a valid cache entry)
        timings["chartevents_s"] = time.perf_counter() - t0
        progress.step("Charlson comorbidities")

        t0 = time.perf_counter()
        cci = frame(con, charlson_sql(s["diagnoses_icd"], s["admissions"], opts.comorbidity_source))
        timings["charlson_s"] = time.perf_counter() - t0
        progress.step("centers, splits and outputs")
        kept = frame(con, "SELECT * FROM kept ORDER BY stay_id")

    return assemble(kept, vitals, cci), att, timings, inputs, release


def _report_sections(cache: dict, release: str):
    """extend_report hook: ``report["source_release"]`` (:func:`mimic_release`),
    ``report["chartevents_cache"]`` and one Markdown line on the cache."""

    def extend(report: dict, cohort: pl.DataFrame, centers: pl.DataFrame) -> str:
        report["source_release"] = release
        report["chartevents_cache"] = cache
        if cache.get("status", "off") == "off":
            return ""
        why = f"; {cache['reason']}" if cache.get("reason") else ""
        rows = f", {cache['rows']:,} rows" if cache.get("rows") is not None else ""
        return (f"\nchartevents Parquet cache: {cache['status']}{rows}{why} "
                f"({cache['seconds']:.1f} s checking / writing it; docs/etl.md).\n")

    return extend


def run_etl(mimic_dir: str | Path, out: str | Path, opts: EtlOptions | None = None) -> dict:
    """``abps etl``: build the cohort, partition it, split it, and write the four outputs.

    Args:
        mimic_dir: folder with ``hosp/`` and ``icu/`` tables (.csv.gz, .csv or .parquet; one
            file per table).
        out: output folder (created; its four files are replaced atomically).
        opts: options (defaults: careunit-year, 2-year windows, six units, age 18-95, >= 50 stays).

    Returns:
        The cohort report (a dict of cohort-level aggregates; also written as JSON and Markdown).

    Raises:
        InputError: bad input, or an empty cohort after a filter; nothing is written then.
    """
    opts = opts or EtlOptions()
    opts.validate("mimic")
    t_start = time.perf_counter()
    with atomic_output_dir(out) as tmp:
        cache: dict = {}
        cohort, att, timings, inputs, release = build_cohort(mimic_dir, opts, tmp, cache)
        return finish(cohort, att, opts, tmp, timings, source="mimic", inputs=inputs,
                      partition=opts.partition, t_start=t_start, extend_report=_report_sections(cache, release))

"""MIMIC-IV -> federated ICU-mortality cohort (ABPS paper Sec. 6.1 and Appendix A).

DuckDB does the heavy SQL over the raw files; Polars shapes the result. ``chartevents`` is
never loaded whole: one streaming scan keeps only the vital itemids inside each kept stay's
window, and the per-charttime averages are aggregated on the fly, so memory grows with the
number of kept stays, not with the size of the file.

Outputs (``docs/data_dictionary.md``): ``cohort.parquet``, ``centers.parquet``,
``cohort_report.json`` and ``cohort_report.md``, written to a temporary folder and renamed.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import polars as pl

from etl import charlson
from etl.errors import InputError
from etl.io import atomic_output_dir, atomic_write_text
from etl.partition import PARTITIONS, assign_centers, grouped_stratified_split
from etl.sources import Table, duckdb_errors, locate

#: Exact ``icustays.first_careunit`` strings -> short names (reference/mimic-iv-etl-facts.md).
CARE_UNITS: dict[str, str] = {
    "Medical Intensive Care Unit (MICU)": "MICU",
    "Medical/Surgical Intensive Care Unit (MICU/SICU)": "MICU/SICU",
    "Cardiac Vascular Intensive Care Unit (CVICU)": "CVICU",
    "Surgical Intensive Care Unit (SICU)": "SICU",
    "Coronary Care Unit (CCU)": "CCU",
    "Trauma SICU (TSICU)": "TSICU",
    "Neuro Intermediate": "Neuro Intermediate",
    "Neuro Surgical Intensive Care Unit (Neuro SICU)": "Neuro SICU",
    "Neuro Stepdown": "Neuro Stepdown",
}
#: The paper's six care units (Sec. 6.1).
DEFAULT_CARE_UNITS: tuple[str, ...] = ("MICU", "MICU/SICU", "CVICU", "SICU", "CCU", "TSICU")

#: First-24-h vitals: (name, itemid, lower bound (exclusive), upper bound, upper inclusive,
#: Fahrenheit -> Celsius). Ranges as in mimic-code's vitalsign concept.
VITAL_ITEMS: tuple[tuple[str, int, float, float, bool, bool], ...] = (
    ("heart_rate", 220045, 0, 300, False, False),
    ("sbp", 220179, 0, 400, False, False),
    ("sbp", 220050, 0, 400, False, False),
    ("sbp", 225309, 0, 400, False, False),
    ("dbp", 220180, 0, 300, False, False),
    ("dbp", 220051, 0, 300, False, False),
    ("dbp", 225310, 0, 300, False, False),
    ("mbp", 220181, 0, 300, False, False),
    ("mbp", 220052, 0, 300, False, False),
    ("mbp", 225312, 0, 300, False, False),
    ("resp_rate", 220210, 0, 70, False, False),
    ("resp_rate", 224690, 0, 70, False, False),
    ("spo2", 220277, 0, 100, True, False),
    ("temperature", 223761, 70, 120, False, True),
    ("temperature", 223762, 10, 50, False, False),
)
VITALS: tuple[str, ...] = ("heart_rate", "sbp", "dbp", "mbp", "resp_rate", "spo2", "temperature")
VITAL_COLUMNS: tuple[str, ...] = tuple(f"{v}_{a}" for v in VITALS for a in ("mean", "min", "max"))

CATEGORICAL = ("gender", "race", "admission_type", "admission_location", "insurance")
COMORBIDITY_SOURCES = ("same-admission", "earlier-admissions")

REQUIRED = {
    ("hosp", "patients"): ("subject_id", "gender", "anchor_age", "anchor_year", "anchor_year_group"),
    ("hosp", "admissions"): ("subject_id", "hadm_id", "admittime", "admission_type",
                             "admission_location", "insurance", "race", "hospital_expire_flag"),
    ("hosp", "diagnoses_icd"): ("hadm_id", "icd_code", "icd_version"),
    ("icu", "icustays"): ("subject_id", "hadm_id", "stay_id", "first_careunit", "intime"),
    ("icu", "chartevents"): ("stay_id", "charttime", "itemid", "valuenum"),
}
TYPES = {
    "subject_id": "BIGINT", "hadm_id": "BIGINT", "stay_id": "BIGINT", "anchor_age": "INTEGER",
    "anchor_year": "INTEGER", "admittime": "TIMESTAMP", "intime": "TIMESTAMP", "outtime": "TIMESTAMP",
    "charttime": "TIMESTAMP", "itemid": "INTEGER", "valuenum": "DOUBLE",
    "hospital_expire_flag": "INTEGER", "icd_version": "INTEGER",
}


@dataclass
class EtlOptions:
    """Options of ``abps etl`` (defaults documented in docs/etl.md).

    Attributes:
        partition: one of ``careunit-year`` (default), ``careunit-era``, ``dirichlet``, ``iid``.
        window_years: width of the shifted-year windows (careunit-year), 2 as in the paper.
        window_origin: a shifted year on a window boundary.
        care_units: short care-unit names kept (default: the paper's six).
        min_age, max_age: inclusive age filter in years (18 to 95, Sec. 6.1).
        min_center_stays: centers with fewer stays are dropped (default 50).
        vitals_from_hours: start of the vital window relative to intime in hours; 0 (default) gives
            [intime, intime + 24 h], -6 gives mimic-code's [intime - 6 h, intime + 24 h].
        comorbidity_source: ``same-admission`` (the paper) or ``earlier-admissions`` (leakage-free:
            only codes of the patient's admissions that started before this one).
        split_fractions: (train, val, test).
        n_centers, alpha: dirichlet / iid parameters.
        seed: seed of the split and of random partitions.
        threads, memory_limit: DuckDB resources.
    """

    partition: str = "careunit-year"
    window_years: int = 2
    window_origin: int = 2100
    care_units: tuple[str, ...] = DEFAULT_CARE_UNITS
    min_age: float = 18
    max_age: float = 95
    min_center_stays: int = 50
    vitals_from_hours: float = 0.0
    comorbidity_source: str = "same-admission"
    split_fractions: tuple[float, float, float] = (0.7, 0.15, 0.15)
    n_centers: int = 20
    alpha: float = 0.5
    seed: int = 0
    threads: int = 2
    memory_limit: str = "2GB"
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        """Raise InputError naming the first bad option."""
        if self.partition not in PARTITIONS:
            raise InputError(f"unknown --partition '{self.partition}' (choose from {', '.join(PARTITIONS)})")
        if self.comorbidity_source not in COMORBIDITY_SOURCES:
            raise InputError(f"unknown --comorbidity-source '{self.comorbidity_source}' "
                             f"(choose from {', '.join(COMORBIDITY_SOURCES)})")
        known = set(CARE_UNITS.values())
        for cu in self.care_units:
            if cu not in known and cu not in CARE_UNITS:
                raise InputError(f"unknown care unit '{cu}' in --care-units (known: {', '.join(sorted(known))})")
        if not self.min_age <= self.max_age:
            raise InputError(f"--min-age {self.min_age} is above --max-age {self.max_age}")
        if self.min_center_stays < 1:
            raise InputError(f"--min-center-stays must be >= 1, got {self.min_center_stays}")
        if not -48 <= self.vitals_from_hours < 24:
            raise InputError(f"--vitals-from-hours must be in [-48, 24), got {self.vitals_from_hours}")
        if self.threads < 1:
            raise InputError(f"--threads must be >= 1, got {self.threads}")
        if not re.fullmatch(r"\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", self.memory_limit.strip()):
            raise InputError(f"--memory-limit must look like 2GB or 512MB, got '{self.memory_limit}'")
        if self.seed < 0:
            raise InputError(f"--seed must be >= 0, got {self.seed}")
        if self.window_years < 1:
            raise InputError(f"--window-years must be >= 1, got {self.window_years}")


def _short_units(units: tuple[str, ...]) -> list[str]:
    return sorted({CARE_UNITS.get(u, u) for u in units})


def _frame(con: duckdb.DuckDBPyConnection, query: str) -> pl.DataFrame:
    """Run a parameterless SELECT and return it as a Polars frame (through Arrow)."""
    return pl.from_arrow(con.sql(query).to_arrow_table())


def _connect(opts: EtlOptions, tmp: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    con.execute(f"SET threads = {int(opts.threads)}")
    con.execute(f"SET memory_limit = '{opts.memory_limit.strip()}'")  # validated: digits + unit
    scratch = str(tmp / "duckdb_tmp").replace("'", "''")
    con.execute(f"SET temp_directory = '{scratch}'")
    con.execute("SET preserve_insertion_order = false")
    return con


def _locate_all(mimic_dir: Path) -> dict[str, Table]:
    if not mimic_dir.is_dir():
        raise InputError(f"--mimic-dir {mimic_dir}: not a directory")
    return {name: locate(mimic_dir, module, name, cols) for (module, name), cols in REQUIRED.items()}


def _stays_sql(t: dict[str, Table]) -> str:
    """All ICU stays with admission and patient fields, age, label, and care unit short name."""
    unit_case = "CASE i.first_careunit " + " ".join(
        f"WHEN '{k}' THEN '{v}'" for k, v in CARE_UNITS.items()) + " ELSE i.first_careunit END"
    race = """CASE
        WHEN upper(a.race) LIKE 'WHITE%' OR upper(a.race) IN ('PORTUGUESE') THEN 'WHITE'
        WHEN upper(a.race) LIKE 'BLACK%' THEN 'BLACK'
        WHEN upper(a.race) LIKE 'HISPANIC%' OR upper(a.race) = 'SOUTH AMERICAN' THEN 'HISPANIC'
        WHEN upper(a.race) LIKE 'ASIAN%' THEN 'ASIAN'
        WHEN a.race IS NULL OR upper(a.race) IN ('UNKNOWN', 'UNABLE TO OBTAIN', 'PATIENT DECLINED TO ANSWER')
             THEN 'UNKNOWN'
        ELSE 'OTHER' END"""
    return f"""
    SELECT i.stay_id, i.subject_id, i.hadm_id, i.first_careunit, {unit_case} AS care_unit,
           i.intime, CAST(year(i.intime) AS INTEGER) AS admit_year, a.admittime,
           p.anchor_year_group, p.gender,
           CAST(p.anchor_age + (year(a.admittime) - p.anchor_year) AS DOUBLE) AS age,
           {race} AS race,
           coalesce(a.admission_type, 'UNKNOWN') AS admission_type,
           coalesce(a.admission_location, 'UNKNOWN') AS admission_location,
           coalesce(a.insurance, 'UNKNOWN') AS insurance,
           CAST(a.hospital_expire_flag AS TINYINT) AS label
    FROM {t['icustays'].scan_sql(TYPES)} i
    JOIN {t['admissions'].scan_sql(TYPES)} a ON a.hadm_id = i.hadm_id
    JOIN {t['patients'].scan_sql(TYPES)} p ON p.subject_id = i.subject_id
    """


def _vitals_sql(t: dict[str, Table], from_hours: float) -> str:
    """One streaming pass over chartevents -> min / max / mean per stay and vital.

    Values of the same vital that share a charttime are averaged first (mimic-code), then the
    per-stay aggregates are taken over those per-charttime values.
    """
    rows = ", ".join(
        f"({item}, '{name}', {lo}, {hi}, {str(incl).lower()}, {str(f2c).lower()})"
        for name, item, lo, hi, incl, f2c in VITAL_ITEMS
    )
    per_time = f"""
    SELECT c.stay_id, m.vital, c.charttime,
           avg(CASE WHEN m.f2c THEN (c.valuenum - 32) / 1.8 ELSE c.valuenum END) AS v
    FROM {t['chartevents'].scan_sql(TYPES)} c
    JOIN (VALUES {rows}) m(itemid, vital, lo, hi, hi_incl, f2c) ON c.itemid = m.itemid
    JOIN win w ON c.stay_id = w.stay_id
    WHERE c.valuenum > m.lo AND (c.valuenum < m.hi OR (m.hi_incl AND c.valuenum = m.hi))
      AND c.charttime >= w.t0 AND c.charttime <= w.t1
    GROUP BY c.stay_id, m.vital, c.charttime
    """
    # Rounded to 1e-6 so that the thread-dependent order of floating-point sums cannot change
    # the output from run to run (same input, same bytes).
    aggs = ", ".join(
        f"round({fn}(v) FILTER (WHERE vital = '{v}'), 6) AS {v}_{a}"
        for v in VITALS for a, fn in (("mean", "avg"), ("min", "min"), ("max", "max"))
    )
    return f"SELECT stay_id, {aggs} FROM ({per_time}) GROUP BY stay_id"


def _charlson_sql(t: dict[str, Table], source: str) -> str:
    diag = t["diagnoses_icd"].scan_sql(TYPES)
    if source == "same-admission":
        rel = f"(SELECT d.hadm_id, d.icd_code, d.icd_version FROM {diag} d JOIN (SELECT DISTINCT hadm_id FROM kept) k USING (hadm_id))"
    else:
        adm = t["admissions"].scan_sql(TYPES)
        rel = f"""(SELECT cur.hadm_id AS hadm_id, d.icd_code, d.icd_version
                  FROM (SELECT DISTINCT hadm_id, subject_id, admittime FROM kept) cur
                  JOIN {adm} prev ON prev.subject_id = cur.subject_id AND prev.admittime < cur.admittime
                  JOIN {diag} d ON d.hadm_id = prev.hadm_id)"""
    return charlson.charlson_flags_sql(rel)


@dataclass
class Attrition:
    """Stays in and out at each filter (cohort report)."""

    rows: list[dict] = field(default_factory=list)

    def add(self, step: str, n_in: int, n_out: int) -> None:
        self.rows.append({"filter": step, "stays_in": int(n_in), "stays_removed": int(n_in - n_out),
                          "stays_out": int(n_out)})


def build_cohort(mimic_dir: str | Path, opts: EtlOptions, scratch: Path) -> tuple[pl.DataFrame, Attrition, dict]:
    """Run the SQL and return (cohort frame before partition, attrition, timings).

    Raises:
        InputError: missing table / column, unreadable file, or an empty cohort after a filter.
    """
    mimic_dir = Path(mimic_dir)
    tables = _locate_all(mimic_dir)
    con = _connect(opts, scratch)
    att = Attrition()
    timings: dict[str, float] = {}
    units = _short_units(opts.care_units)
    with contextlib.closing(con), duckdb_errors(list(tables.values())):
        t0 = time.perf_counter()
        for name, key in (("patients", "subject_id"), ("admissions", "hadm_id"), ("icustays", "stay_id")):
            dup = con.execute(f"SELECT count(*) - count(DISTINCT {key}) FROM {tables[name].scan_sql(TYPES)}").fetchall()[0][0]
            if dup:
                raise InputError(f"{tables[name].path}: column '{key}' is not unique ({dup} duplicate rows)")
        bad = con.execute(
            f"SELECT count(*) FROM {tables['admissions'].scan_sql(TYPES)} "
            "WHERE hospital_expire_flag IS NOT NULL AND hospital_expire_flag NOT IN (0, 1)").fetchall()[0][0]
        if bad:
            raise InputError(f"{tables['admissions'].path}: column 'hospital_expire_flag' must be 0 or 1 "
                             f"({bad} rows hold other values)")
        con.execute(f"CREATE TEMP TABLE all_stays AS {_stays_sql(tables)}")
        n_icu = con.execute(f"SELECT count(*) FROM {tables['icustays'].scan_sql(TYPES)}").fetchall()[0][0]
        n_join = con.execute("SELECT count(*) FROM all_stays").fetchall()[0][0]
        att.add("ICU stays with admission and patient records", n_icu, n_join)
        if n_join == 0:
            raise InputError("empty cohort: no ICU stay joins an admission and a patient "
                             "(check icustays, admissions and patients)")
        n_label = con.execute("SELECT count(*) FROM all_stays WHERE label IS NOT NULL AND intime IS NOT NULL").fetchall()[0][0]
        att.add("known in-hospital outcome and intime", n_join, n_label)
        n_age = con.execute(
            "SELECT count(*) FROM all_stays WHERE label IS NOT NULL AND intime IS NOT NULL AND age BETWEEN ? AND ?",
            [opts.min_age, opts.max_age]).fetchall()[0][0]
        att.add(f"age {opts.min_age:g} to {opts.max_age:g}", n_label, n_age)
        con.execute(
            "CREATE TEMP TABLE kept AS SELECT * FROM all_stays WHERE label IS NOT NULL AND intime IS NOT NULL "
            "AND age BETWEEN ? AND ? AND care_unit IN (SELECT unnest(?::VARCHAR[]))",
            [opts.min_age, opts.max_age, units])
        n_unit = con.execute("SELECT count(*) FROM kept").fetchall()[0][0]
        att.add(f"care unit in {', '.join(units)}", n_age, n_unit)
        if n_unit == 0:
            raise InputError("empty cohort after the age and care-unit filters (check --care-units, --min-age, --max-age)")
        timings["stays_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        h0 = float(opts.vitals_from_hours)
        con.execute(
            "CREATE TEMP TABLE win AS SELECT stay_id, intime + to_microseconds(CAST(? * 3600e6 AS BIGINT)) AS t0, "
            "intime + INTERVAL 24 HOUR AS t1 FROM kept", [h0])
        vitals = _frame(con, _vitals_sql(tables, h0))
        timings["chartevents_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        cci = _frame(con, _charlson_sql(tables, opts.comorbidity_source))
        timings["charlson_s"] = time.perf_counter() - t0
        kept = _frame(con, "SELECT * FROM kept ORDER BY stay_id")

    cohort = (
        kept.join(vitals, on="stay_id", how="left")
        .join(cci, on="hadm_id", how="left")
        .with_columns([pl.col(c).fill_null(0).cast(pl.Int8) for c in charlson.CCI_COLUMNS])
    )
    for c in VITAL_COLUMNS:
        if c not in cohort.columns:
            cohort = cohort.with_columns(pl.lit(None, dtype=pl.Float64).alias(c))
    return cohort, att, timings


def drop_small_centers(cohort: pl.DataFrame, min_stays: int, att: Attrition, noun: str = "center") -> pl.DataFrame:
    """Drop the stays of centers holding fewer than ``min_stays`` stays (an attrition row).

    Raises:
        InputError: no center is left (the message names the filter and the largest center).
    """
    sizes = cohort.group_by("center_id").len()
    keep = sizes.filter(pl.col("len") >= min_stays)["center_id"]
    out = cohort.filter(pl.col("center_id").is_in(keep.implode()))
    att.add(f"{noun}s with >= {min_stays} stays", cohort.height, out.height)
    if out.height == 0:
        raise InputError(f"empty cohort after the filter --min-center-stays {min_stays} "
                         f"(largest {noun} has {int(sizes['len'].max() or 0)} stays)")
    return out


def center_metadata(cohort: pl.DataFrame) -> pl.DataFrame:
    """Per-center table with split sizes and the metadata vector v_i (ABPS Sec. 4.1, 6.3).

    v_i = [positive rate (train), log n_train, mean admission year (train) / 2030] followed by the
    12 Charlson prevalences over the center's train split (15 dims). Only cohort-level
    aggregates: no row of any patient.
    """
    train = cohort.filter(pl.col("split") == "train")
    sizes = cohort.group_by("center_id").agg(
        pl.col("care_unit").first(),
        pl.col("window_start").first(),
        pl.col("window_end").first(),
        (pl.col("split") == "train").sum().cast(pl.Int64).alias("n_train"),
        (pl.col("split") == "val").sum().cast(pl.Int64).alias("n_val"),
        (pl.col("split") == "test").sum().cast(pl.Int64).alias("n_test"),
        pl.col("label").cast(pl.Float64).mean().alias("pos_rate"),
    )
    meta = train.group_by("center_id").agg(
        pl.col("label").cast(pl.Float64).mean().alias("meta_pos_rate"),
        pl.len().cast(pl.Float64).log().alias("meta_log_n_train"),
        (pl.col("admit_year").cast(pl.Float64).mean() / 2030.0).alias("meta_year"),
        *[pl.col(c).cast(pl.Float64).mean().alias(f"meta_{c}") for c in charlson.CCI_COLUMNS],
    )
    return sizes.join(meta, on="center_id", how="left").sort("center_id")


COHORT_COLUMNS: tuple[str, ...] = (
    "stay_id", "subject_id", "hadm_id", "center_id", "care_unit", "split", "label", "admit_year",
    "anchor_year_group", "age", *CATEGORICAL, *charlson.CCI_COLUMNS, *VITAL_COLUMNS,
)


def run_etl(mimic_dir: str | Path, out: str | Path, opts: EtlOptions | None = None) -> dict:
    """``abps etl``: build the cohort, partition it, split it, and write the four outputs.

    Args:
        mimic_dir: folder with ``hosp/`` and ``icu/`` tables (.csv.gz, .csv or .parquet).
        out: output folder (created; its four files are replaced atomically).
        opts: options (defaults: careunit-year, 2-year windows, six units, age 18-95, >= 50 stays).

    Returns:
        The cohort report (a dict of cohort-level aggregates; also written as JSON and Markdown).

    Raises:
        InputError: bad input, or an empty cohort after a filter; nothing is written then.
    """
    from etl.report import cohort_report, report_markdown

    opts = opts or EtlOptions()
    opts.validate()
    t_start = time.perf_counter()
    with atomic_output_dir(out) as tmp:
        cohort, att, timings = build_cohort(mimic_dir, opts, tmp)
        cohort = assign_centers(cohort, opts.partition, window_years=opts.window_years,
                                window_origin=opts.window_origin, n_centers=opts.n_centers,
                                alpha=opts.alpha, seed=opts.seed)
        cohort = drop_small_centers(cohort, opts.min_center_stays, att)
        cohort = cohort.with_columns(split=grouped_stratified_split(cohort, opts.split_fractions, opts.seed))
        centers = center_metadata(cohort)
        cohort = cohort.select(COHORT_COLUMNS).sort("stay_id")
        cohort.write_parquet(tmp / "cohort.parquet")
        centers.write_parquet(tmp / "centers.parquet")
        timings["total_s"] = time.perf_counter() - t_start
        report = cohort_report(cohort, centers, att.rows, opts, timings)
        import json

        atomic_write_text(tmp / "cohort_report.json", json.dumps(report, indent=2, default=_json_default))
        atomic_write_text(tmp / "cohort_report.md", report_markdown(report))
        _cleanup_scratch(tmp)
    return report


def _cleanup_scratch(tmp: Path) -> None:
    import shutil

    shutil.rmtree(tmp / "duckdb_tmp", ignore_errors=True)


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return None if math.isnan(o) else float(o)
    raise TypeError(type(o).__name__)

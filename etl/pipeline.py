"""What both ETL sources share: the options of ``abps etl``, the DuckDB connection, the SQL concept
files and the tail (partition, split, center metadata, the four outputs). Details: docs/etl.md,
"Module notes".
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import polars as pl

from etl import charlson
from etl.errors import InputError, check_fractions, check_number
from etl.io import atomic_write_text, cohort_digests
from etl.limits import MAX_THREADS
from etl.partition import PARTITIONS, assign_centers, grouped_stratified_split
from etl.report import cohort_report, report_markdown
from etl.schema import CARE_UNITS, COHORT_COLUMNS, DEFAULT_CARE_UNITS
from etl.sources import Table, check_key, connect
from etl.sql import concept_sql
from etl.tasks import DEFAULT_TASK, get_task

__all__ = ["EtlOptions", "connect", "concept_sql", "frame", "scalar", "Attrition", "check_keys",
           "drop_small_centers", "center_metadata", "finish"]

COMORBIDITY_SOURCES = ("same-admission", "earlier-admissions")
#: The earliest start of the vital window, hours from intime (``--vitals-from-hours`` at least this;
#: the chartevents cache holds the rows from here to intime + 24 h).
EARLIEST_VITALS_HOURS = -48.0
#: bounds of the year options (--window-years, --window-origin) and of --n-centers
MAX_YEAR = 10_000
MAX_CENTERS = 1_000_000
SOURCES = ("mimic", "eicu", "meds")


@dataclass
class EtlOptions:
    """Options of ``abps etl`` (defaults documented in docs/etl.md).

    Attributes:
        partition: one of ``careunit-year`` (default), ``careunit-era``, ``dirichlet``, ``iid``
            (MIMIC; eICU centers are hospitals).
        window_years: width of the shifted-year windows (careunit-year), 2 as in the paper.
        window_origin: a shifted year on a window boundary (careunit-year).
        care_units: short care-unit names kept (MIMIC; default: the paper's six).
        min_age, max_age: inclusive age filter in years (18 to 95, Sec. 6.1).
        min_center_stays: centers with fewer stays are dropped (default 50; eICU 10).
        vitals_from_hours: start of the vital window relative to intime in hours; 0 (default) gives
            [intime, intime + 24 h], -6 gives mimic-code's [intime - 6 h, intime + 24 h].
        comorbidity_source: ``same-admission`` (the paper) or ``earlier-admissions`` (leakage-free:
            only codes of the patient's admissions that started before this one).
        split_fractions: (train, val, test).
        n_centers, alpha: dirichlet / iid parameters.
        seed: seed of the split and of random partitions.
        threads, memory_limit: DuckDB resources (both sources).
        task: the outcome written to ``label`` (:data:`etl.tasks.TASKS`; docs/tasks.md).
        chart_cache: MIMIC ``chartevents`` Parquet cache: ``auto`` (default: cache a source of
            >= 64 MiB in the user's cache folder), ``off``, or a folder (:mod:`etl.chart_cache`).
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
    task: str = DEFAULT_TASK
    chart_cache: str = "auto"
    extra: dict = field(default_factory=dict)

    def validate(self, source: str = "mimic") -> None:
        """Raise InputError naming the first bad option, or an option that does not apply.

        An option left at its default is never refused; a changed option that the source or the
        partition does not use is (``--partition`` for eICU, ``--n-centers`` for careunit-year,
        ...): an option either works or is refused.
        """
        if source not in SOURCES:
            raise InputError(f"unknown --source '{source}' (choose from {', '.join(SOURCES)})")
        if self.partition not in PARTITIONS:
            raise InputError(f"unknown --partition '{self.partition}' (choose from {', '.join(PARTITIONS)})")
        if self.comorbidity_source not in COMORBIDITY_SOURCES:
            raise InputError(f"unknown --comorbidity-source '{self.comorbidity_source}' "
                             f"(choose from {', '.join(COMORBIDITY_SOURCES)})")
        known = set(CARE_UNITS.values())
        for cu in self.care_units:
            if cu not in known and cu not in CARE_UNITS:
                raise InputError(f"unknown care unit '{cu}' in --care-units (known: {', '.join(sorted(known))})")
        check_number("--min-age", self.min_age)
        check_number("--max-age", self.max_age)
        if not self.min_age <= self.max_age:
            raise InputError(f"--min-age {self.min_age} is above --max-age {self.max_age}")
        if self.min_center_stays < 1:
            raise InputError(f"--min-center-stays must be >= 1, got {self.min_center_stays}")
        check_number("--vitals-from-hours", self.vitals_from_hours, at_least=EARLIEST_VITALS_HOURS, below=24)
        check_number("--alpha", self.alpha, above=0)
        if len(self.split_fractions) != 3:
            raise InputError(f"--split: expected three fractions (train, val, test), got {len(self.split_fractions)}")
        check_fractions("--split", self.split_fractions)
        if not 1 <= self.threads <= MAX_THREADS:
            raise InputError(f"--threads must be between 1 and {MAX_THREADS}, got {self.threads}")
        if not re.fullmatch(r"\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", self.memory_limit.strip()):
            raise InputError(f"--memory-limit must look like 2GB or 512MB, got '{self.memory_limit}'")
        if self.seed < 0:
            raise InputError(f"--seed must be >= 0, got {self.seed}")
        # years and counts past these bounds mean nothing here and overflow the 32-bit columns
        for option, value, lo, hi in (("--window-years", self.window_years, 1, MAX_YEAR),
                                      ("--window-origin", self.window_origin, -MAX_YEAR, MAX_YEAR),
                                      ("--n-centers", self.n_centers, 1, MAX_CENTERS)):
            if not lo <= value <= hi:
                raise InputError(f"{option} must be between {lo} and {hi}, got {value}")
        get_task(self.task, source)
        cache = str(self.chart_cache).strip()
        if not cache:
            raise InputError("--chart-cache must be auto, off or a folder, got an empty value")
        if cache.lower() in ("auto", "off") and cache not in ("auto", "off"):
            raise InputError(f"--chart-cache {cache}: the settings are written auto and off; "
                             f"give ./{cache} for a folder of that name")
        self._refuse_unused(source)

    def _refuse_unused(self, source: str) -> None:
        d = EtlOptions()
        changed = {
            "--partition": self.partition != d.partition,
            "--window-years": self.window_years != d.window_years,
            "--window-origin": self.window_origin != d.window_origin,
            "--care-units": tuple(self.care_units) != tuple(d.care_units),
            "--n-centers": self.n_centers != d.n_centers,
            "--alpha": self.alpha != d.alpha,
            "--chart-cache": self.chart_cache != d.chart_cache,
        }
        if source == "eicu":
            unused = [k for k, v in changed.items() if v]
            why = "--source eicu (centers are hospitals, all unit types are kept)"
        else:
            uses = {"careunit-year": ("--window-years", "--window-origin"), "careunit-era": (),
                    "dirichlet": ("--n-centers", "--alpha"), "iid": ("--n-centers",)}[self.partition]
            unused = [k for k, v in changed.items()
                      if v and k not in uses + ("--partition", "--care-units", "--chart-cache")]
            why = f"--partition {self.partition}"
        if source == "meds" and changed["--chart-cache"]:
            unused, why = ["--chart-cache"], "--source meds (it reads MEDS Parquet, no chartevents file)"
        if source == "meds" and self.partition == "careunit-era":
            unused, why = ["--partition careunit-era"], "--source meds (MEDS does not carry anchor_year_group)"
        if unused:
            raise InputError(f"{unused[0]} does not apply to {why}; leave it out")


def frame(con: duckdb.DuckDBPyConnection, query: str) -> pl.DataFrame:
    """Run a parameterless SELECT and return it as a Polars frame (through Arrow)."""
    return pl.from_arrow(con.sql(query).to_arrow_table())


def scalar(con: duckdb.DuckDBPyConnection, query: str, params: list | None = None):
    """The single value of a one-row, one-column query."""
    return con.execute(query, params or []).fetchall()[0][0]


@dataclass
class Attrition:
    """Stays (or source rows, or centers) in and out at each step (the cohort report's table)."""

    rows: list[dict] = field(default_factory=list)

    def add(self, step: str, n_in: int, n_out: int, unit: str = "stays", **extra: int) -> None:
        self.rows.append({"filter": step, "unit": unit, f"{unit}_in": int(n_in),
                          f"{unit}_removed": int(n_in - n_out), f"{unit}_out": int(n_out),
                          **{k: int(v) for k, v in extra.items()}})


def check_keys(con: duckdb.DuckDBPyConnection, tables: dict[str, Table], keys: dict[str, tuple[str, ...]],
               types: dict[str, str], att: Attrition, root: Path) -> dict[str, Table]:
    """Check the key of every keyed table (:func:`etl.sources.check_key`), both sources.

    Identical duplicated rows are collapsed (the returned tables scan ``SELECT DISTINCT *``) and
    counted: one attrition row, unit ``rows``, per table that had any.

    Raises:
        InputError: conflicting duplicates (file and key column named, never a value).
    """
    out = dict(tables)
    for name, key in keys.items():
        out[name], n_in, n_out = check_key(con, tables[name], key, types)
        if n_in != n_out:
            att.add(f"identical duplicate rows collapsed in {tables[name].path.relative_to(root)} "
                    f"(key {', '.join(key)})", n_in, n_out, unit="rows")
    return out


def drop_small_centers(cohort: pl.DataFrame, min_stays: int, att: Attrition, noun: str = "center") -> pl.DataFrame:
    """Drop the stays of centers holding fewer than ``min_stays`` stays (an attrition row that
    also counts the centers in, removed and out).

    Raises:
        InputError: no center is left (the message names the filter and the largest center).
    """
    sizes = cohort.group_by("center_id").len()
    keep = sizes.filter(pl.col("len") >= min_stays)["center_id"]
    out = cohort.filter(pl.col("center_id").is_in(keep.implode()))
    att.add(f"{noun}s with >= {min_stays} stays", cohort.height, out.height,
            centers_in=sizes.height, centers_removed=sizes.height - keep.len(), centers_out=keep.len())
    if out.height == 0:
        largest = int(sizes["len"].max() or 0)
        wider = "--window-years 200 " if noun == "center" else ""
        raise InputError(f"empty cohort after the filter --min-center-stays {min_stays} "
                         f"(largest {noun} has {largest} stays of {cohort.height}); for a cohort this small "
                         f"(e.g. a demo) try {wider}--min-center-stays 1")
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


def finish(
    cohort: pl.DataFrame,
    att: Attrition,
    opts: EtlOptions,
    tmp: Path,
    timings: dict[str, float],
    *,
    source: str,
    inputs: dict[str, str],
    partition: str,
    noun: str = "center",
    decorate_centers: Callable[[pl.DataFrame, pl.DataFrame], pl.DataFrame] | None = None,
    extend_report: Callable[[dict, pl.DataFrame, pl.DataFrame], str] | None = None,
    t_start: float | None = None,
) -> dict:
    """The tail shared by both sources: partition -> small centers -> split -> metadata -> write.

    Args:
        cohort: one row per kept stay, all columns of :data:`etl.schema.COHORT_COLUMNS` except
            ``split`` (and ``center_id`` unless ``partition`` is ``"hospital"``), plus
            ``admit_year`` and the partition's inputs.
        partition: ``"hospital"`` (centers already assigned, eICU) or one of
            :data:`etl.partition.PARTITIONS` (applied here with the options' parameters).
        inputs: table name -> file read (relative to the source folder), recorded in the report.
        decorate_centers: ``f(cohort, centers) -> centers`` adding source-specific center columns.
        extend_report: ``f(report, cohort, centers) -> markdown`` adding source-specific sections
            (mutates ``report``; returns Markdown appended to the report's).

    Returns:
        The cohort report dict (also written as cohort_report.json / .md under ``tmp``).
    """
    t_tail = time.perf_counter()
    if partition != "hospital":
        cohort = assign_centers(cohort, partition, window_years=opts.window_years,
                                window_origin=opts.window_origin, n_centers=opts.n_centers,
                                alpha=opts.alpha, seed=opts.seed)
    n = cohort.height
    cohort = cohort.filter(pl.col("center_id").is_not_null())
    att.add(f"{noun} assigned ({partition})", n, cohort.height)
    cohort = drop_small_centers(cohort, opts.min_center_stays, att, noun=noun)
    cohort = cohort.with_columns(split=grouped_stratified_split(cohort, opts.split_fractions, opts.seed))
    centers = center_metadata(cohort)
    if decorate_centers is not None:
        centers = decorate_centers(cohort, centers)
    cohort = cohort.select(COHORT_COLUMNS).sort("stay_id")
    cohort.write_parquet(tmp / "cohort.parquet")
    centers.write_parquet(tmp / "centers.parquet")
    timings["centers_split_write_s"] = time.perf_counter() - t_tail
    if t_start is not None:
        timings["total_s"] = time.perf_counter() - t_start
    report = cohort_report(cohort, centers, att.rows, opts, timings)
    report["source"] = source
    report["task"] = opts.task
    report["options"]["partition"] = partition
    report["inputs"] = inputs
    report["chartevents_cache"] = {"status": "off"}  # MIMIC's hook says what its cache did
    report["source_release"] = None  # MIMIC's hook names the release it read (etl.mimic.mimic_release)
    report["files"] = cohort_digests(tmp)  # the report is written last: train checks the pair against it
    md = report_markdown(report)
    if extend_report is not None:
        md += extend_report(report, cohort, centers)
    atomic_write_text(tmp / "cohort_report.json", json.dumps(report, indent=2, default=_json_default))
    atomic_write_text(tmp / "cohort_report.md", md)
    shutil.rmtree(tmp / "duckdb_tmp", ignore_errors=True)
    return report


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return None if math.isnan(o) else float(o)
    raise TypeError(type(o).__name__)

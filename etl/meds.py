"""MEDS (Medical Event Data Standard) -> the federated ICU-mortality cohort: SQL concepts rebuild the
MIMIC-IV relations from the events, then the MIMIC-IV concepts and the shared tail run unchanged.
What MEDS drops or re-codes: docs/meds.md.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import warnings
from pathlib import Path

import polars as pl

from etl.errors import InputError, InputWarning
from etl.io import atomic_output_dir
from etl.mimic import assemble, care_unit_rows, charlson_sql, first_day_vitals, keep_adult_unit_stays
from etl.pipeline import Attrition, EtlOptions, concept_sql, connect, finish, frame, scalar
from etl.sources import Table, duckdb_errors, locate

__all__ = ["run_meds_etl", "build_meds_cohort", "REQUIRED", "OPTIONAL", "TYPES"]

#: Event columns every shard must hold: the MEDS core plus the MIMIC-IV MEDS ETL's stay keys.
REQUIRED: tuple[str, ...] = ("subject_id", "time", "code", "numeric_value", "hadm_id", "icustay_id")
#: Extra columns read when present (admission context of HOSPITAL_ADMISSION events).
OPTIONAL: tuple[str, ...] = ("insurance", "race")
#: Types the shards' columns must cast to (checked before any scan). ``numeric_value`` is read as
#: stored (float32 in MEDS; etl/sql/meds/chartevents.sql widens it through its decimal text).
TYPES = {"subject_id": "BIGINT", "time": "TIMESTAMP", "numeric_value": "DOUBLE", "hadm_id": "BIGINT",
         "icustay_id": "BIGINT"}
_SCAN_TYPES = {k: v for k, v in TYPES.items() if k != "numeric_value"}
_TEXT_KINDS = ("VARCHAR",)


def _check_text(t: Table, col: str) -> None:
    if col in t.columns:
        kind = t.kinds[t.columns.index(col)]
        if not kind.startswith(_TEXT_KINDS):
            raise InputError(f"{t.path}: column '{col}' is stored as {kind}, which cannot be read as VARCHAR")


#: MEDS releases whose event schema this reader follows (``subject_id``, ``time``, ``code``,
#: ``numeric_value``; before 0.3 the first two were ``patient_id`` and ``timestamp``).
KNOWN_MEDS = ((0, 3), (0, 4))


def _check_version(path: Path, meta: dict) -> None:
    """Refuse a ``meds_version`` that is not a version number, or one before 0.3 (other column
    names); warn for one this reader does not know (the columns are still checked as 0.3's)."""
    if "meds_version" not in meta:
        return
    v = meta["meds_version"]
    m = re.fullmatch(r"(\d+)\.(\d+)(\.\d+)?([.+-]?[0-9A-Za-z.+-]*)?", v) if isinstance(v, str) else None
    if m is None:
        raise InputError(f"{path}: meds_version {json.dumps(v)} is not a version number such as \"0.3.3\"")
    if (int(m[1]), int(m[2])) < KNOWN_MEDS[0]:
        raise InputError(f"{path}: meds_version {v} is older than MEDS 0.3, whose events this reader reads "
                         "(before 0.3 the columns were patient_id and timestamp)")
    if (int(m[1]), int(m[2])) not in KNOWN_MEDS:
        warnings.warn(InputWarning(f"{path}: meds_version {v} is not a MEDS release this reader knows "
                                   f"({', '.join(f'{a}.{b}' for a, b in KNOWN_MEDS)}); its events are read as "
                                   "MEDS 0.3's"), stacklevel=1)


def _check_time(t: Table) -> None:
    """Refuse a ``time`` column stored as a date: the time of day is what orders a stay's events
    and places them in the first-day window."""
    kind = t.kinds[t.columns.index("time")]
    if kind.startswith("DATE"):
        raise InputError(f"{t.path}: column 'time' is stored as {kind}, without the time of day (MEDS stores "
                         "a timestamp)")


def _read_metadata(root: Path) -> tuple[dict, Table]:
    path = root / "metadata" / "dataset.json"
    if not path.is_file():
        raise InputError(f"--source meds: missing {path} (a MEDS dataset has metadata/dataset.json)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc.__class__.__name__})") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: expected a JSON object")
    _check_version(path, meta)
    codes = locate(root, "metadata", "codes", ("code",))
    _check_text(codes, "code")
    return meta, codes


def _shards(root: Path, splits: tuple[str, ...] | None) -> tuple[dict[str, int], dict[str, list[Table]], int]:
    """Locate ``metadata/subject_splits.parquet`` and the shards of the splits read.

    Returns:
        (subjects per listed split, shards per split read, subjects listed in total).
    """
    spl = locate(root, "metadata", "subject_splits", ("subject_id", "split"), {"subject_id": "BIGINT"})
    _check_text(spl, "split")
    with contextlib.closing(connect()) as con, duckdb_errors([spl], {"subject_id": "BIGINT"}):
        rows = con.execute(f"SELECT split, count(DISTINCT subject_id) FROM {spl.scan_sql(_SCAN_TYPES)} "
                           "WHERE split IS NOT NULL GROUP BY split ORDER BY split").fetchall()
    listed = {str(s): int(n) for s, n in rows}
    if not listed:
        raise InputError(f"{spl.path}: no subject has a split")
    wanted = tuple(listed) if splits is None else splits
    for s in wanted:
        if s not in listed:
            raise InputError(f"--meds-splits: split '{s}' is not in {spl.path} "
                             f"(it lists {', '.join(listed)})")
        if s in ("", ".", "..") or any(c in s for c in "/\\\0"):  # a path would read outside the dataset
            raise InputError(f"{spl.path}: column 'split' holds {s!r}, which is not a folder name (the split's "
                             "shards are data/<split>/*.parquet)")
    shards: dict[str, list[Table]] = {}
    for s in wanted:
        folder = root / "data" / s
        files = sorted(folder.rglob("*.parquet")) if folder.is_dir() else []
        if not files:
            raise InputError(f"missing shard {folder}/*.parquet: {spl.path.relative_to(root)} lists "
                             f"{listed[s]} subjects in split '{s}' (read only the splits present "
                             "with --meds-splits)")
        shards[s] = []
        for f in files:
            module = str(f.parent.relative_to(root))
            t = locate(root, module, f.name[: -len(".parquet")], REQUIRED, TYPES)
            _check_text(t, "code")
            _check_time(t)
            for c in OPTIONAL:
                _check_text(t, c)
            shards[s].append(t)
    return listed, shards, sum(listed.values())


#: Identifier columns of the shards: positive integers (a negative or zero identifier would merge
#: or split stays silently), checked per shard so the error names the file.
_IDS = ("subject_id", "hadm_id", "icustay_id")


def _check_ids(con, t: Table) -> None:
    """Refuse a shard whose identifier column holds a value below 1 (naming the file and column)."""
    lows = con.execute(f"SELECT {', '.join(f'min({c})' for c in _IDS)} FROM {t.scan_sql(_SCAN_TYPES)}").fetchall()[0]
    for c, low in zip(_IDS, lows):
        if low is not None and low < 1:
            raise InputError(f"{t.path}: column '{c}' must hold positive identifiers (a value below 1 is stored)")


def _events_sql(shards: list[Table]) -> str:
    parts = []
    for t in shards:
        opt = ", ".join(c if c in t.columns else f"CAST(NULL AS VARCHAR) AS {c}" for c in OPTIONAL)
        parts.append(f"SELECT {', '.join(REQUIRED)}, {opt} FROM {t.scan_sql(_SCAN_TYPES)}")
    return "(" + " UNION ALL ".join(parts) + ")"


def _refuse_conflicts(con, view: str, key: str, what: str, where: str) -> None:
    n, n_keys = con.execute(f"SELECT count(*), count(DISTINCT {key}) FROM {view}").fetchall()[0]
    if n != n_keys:
        raise InputError(f"{where}: conflicting {what} events: {n - n_keys} repeat a value of '{key}' "
                         "with different fields")


def build_meds_cohort(data_dir: str | Path, opts: EtlOptions, scratch: Path,
                      splits: tuple[str, ...] | None = None) -> tuple[pl.DataFrame, Attrition, dict, dict]:
    """Run the MEDS concepts, then the MIMIC-IV cohort concepts; return the cohort before partition.

    Args:
        data_dir: MEDS root (``data/``, ``metadata/``).
        splits: MEDS splits to read (default: every split of ``subject_splits.parquet``).

    Returns:
        (cohort, attrition, timings, inputs): one row per kept stay with the columns
        :func:`etl.pipeline.finish` expects.

    Raises:
        InputError: missing metadata or shard, a missing or mistyped column, an identifier below
            1, conflicting events,
            no ICU events, or an empty cohort after a filter (the message names the file).
    """
    root = Path(data_dir)
    if not root.is_dir():
        raise InputError(f"--data-dir {root}: not a directory")
    meta, codes = _read_metadata(root)
    listed, shards, n_listed = _shards(root, splits)
    tables = [t for ts in shards.values() for t in ts]
    where = f"{root / 'data'}/{{{','.join(shards)}}}/*.parquet"
    inputs = {
        "dataset": "metadata/dataset.json", "codes": str(codes.path.relative_to(root)),
        "subject_splits": "metadata/subject_splits.parquet",
        "shards": ", ".join(str(t.path.relative_to(root)) for t in tables),
        "meds_version": str(meta.get("meds_version", "unknown")),
        "etl": f"{meta.get('etl_name', 'unknown')} {meta.get('etl_version', '')}".strip(),
    }
    att = Attrition()
    att.add(f"subjects in the MEDS splits read ({', '.join(shards)})", n_listed,
            sum(listed[s] for s in shards), unit="subjects")
    timings: dict[str, float] = {}
    con = connect(opts.threads, opts.memory_limit, scratch)
    with contextlib.closing(con), duckdb_errors(tables, TYPES):
        t0 = time.perf_counter()
        for t in tables:
            _check_ids(con, t)
        for s, ts in shards.items():  # every shard of a split empty: as missing as no shard at all
            files = [str(t.path) for t in ts]
            if not con.execute("SELECT coalesce(sum(num_rows), 0) FROM parquet_file_metadata(?)", [files]).fetchall()[0][0]:
                named = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
                raise InputError(f"{named}: no events in split '{s}', but metadata/subject_splits.parquet lists "
                                 f"{listed[s]} subjects in it (read only the splits present with --meds-splits)")
        con.execute(f"CREATE TEMP VIEW meds_events AS SELECT * FROM {_events_sql(tables)}")
        for name in ("icustays", "admissions", "patients", "diagnoses_icd"):
            con.execute(f"CREATE TEMP TABLE meds_{name} AS " + concept_sql("meds", name, events="meds_events"))
        con.execute("CREATE TEMP VIEW meds_chartevents AS " + concept_sql("meds", "chartevents", events="meds_events"))
        n_icu = scalar(con, "SELECT count(DISTINCT stay_id) FROM meds_icustays")
        if n_icu == 0:
            raise InputError(f"{where}: no ICU events (no ICU_ADMISSION//<care unit> event with an icustay_id)")
        _refuse_conflicts(con, "meds_icustays", "stay_id", "ICU_ADMISSION", where)
        _refuse_conflicts(con, "meds_admissions", "hadm_id", "HOSPITAL_ADMISSION", where)
        bad = scalar(con, "SELECT count(*) FROM meds_patients WHERE n_birth > 1 OR n_gender > 1")
        if bad:
            raise InputError(f"{where}: conflicting MEDS_BIRTH or GENDER events: {bad} subjects have more than one")
        con.execute("CREATE TEMP TABLE all_stays AS " + concept_sql(
            "mimic", "stays", icustays="meds_icustays", admissions="meds_admissions", patients="meds_patients",
            care_units=care_unit_rows()))
        n_join = scalar(con, "SELECT count(*) FROM all_stays")
        att.add("ICU stays with admission and birth events", n_icu, n_join)
        if n_join == 0:
            raise InputError(f"{where}: empty cohort: no ICU stay has a HOSPITAL_ADMISSION and a MEDS_BIRTH event")
        known = "label IS NOT NULL AND intime IS NOT NULL"
        n_label = scalar(con, f"SELECT count(*) FROM all_stays WHERE {known}")
        att.add("known in-hospital outcome (HOSPITAL_DISCHARGE event) and intime", n_join, n_label)
        keep_adult_unit_stays(con, opts, att, n_label)
        timings["stays_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        vitals = first_day_vitals(con, "meds_chartevents", opts, att,
                                  "identical duplicate vital events collapsed (in the window)")
        timings["events_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        cci = frame(con, charlson_sql("meds_diagnoses_icd", "meds_admissions", opts.comorbidity_source))
        timings["charlson_s"] = time.perf_counter() - t0
        kept = frame(con, "SELECT * FROM kept ORDER BY stay_id")

    return assemble(kept, vitals, cci), att, timings, inputs


def run_meds_etl(data_dir: str | Path, out: str | Path, opts: EtlOptions | None = None,
                 splits: tuple[str, ...] | None = None) -> dict:
    """``abps etl --source meds``: the same cohort contract, centers and report from MEDS shards.

    Args:
        data_dir: MEDS root with ``data/<split>/*.parquet`` and ``metadata/``.
        out: output folder (its four files are replaced atomically; nothing is written on error).
        opts: the options of the MIMIC source (``--partition careunit-era`` is refused: MEDS does
            not carry ``anchor_year_group``).
        splits: MEDS splits to read (``--meds-splits``; default all).

    Returns:
        The cohort report dict (``source`` = ``meds``).

    Raises:
        InputError: bad input (see :func:`build_meds_cohort`) or a bad option.
    """
    opts = opts or EtlOptions()
    opts.validate("meds")
    t_start = time.perf_counter()
    with atomic_output_dir(out) as tmp:
        cohort, att, timings, inputs = build_meds_cohort(data_dir, opts, tmp, splits)
        return finish(cohort, att, opts, tmp, timings, source="meds", inputs=inputs,
                      partition=opts.partition, t_start=t_start)

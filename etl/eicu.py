"""eICU-CRD -> federated ICU-mortality cohort whose centers are real hospitals
(``abps etl --source eicu``), in MIMIC's output contract. Field mapping: docs/eicu.md.
"""

from __future__ import annotations

import contextlib
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import polars as pl

from etl import charlson
from etl.errors import InputError, InputWarning
from etl.io import atomic_output_dir
from etl.pipeline import Attrition, EtlOptions, check_keys, concept_sql, connect, finish, frame, scalar
from etl.report import rate_table
from etl.sources import Table, check_flags, check_range, check_text, duckdb_errors, inflated, locate, require_rows
from etl.tasks import DEFAULT_TASK, column_types, relabel, required_columns

REQUIRED = {
    "patient": ("patientunitstayid", "patienthealthsystemstayid", "uniquepid", "gender", "age", "ethnicity",
                "hospitalid", "unittype", "unitadmitsource", "unitstaytype", "hospitaldischargeyear",
                "hospitaldischargestatus"),
    "hospital": ("hospitalid", "numbedscategory", "teachingstatus", "region"),
    "apacheApsVar": ("patientunitstayid", "heartrate", "meanbp", "respiratoryrate", "temperature"),
    "vitalAperiodic": ("vitalaperiodicid", "patientunitstayid", "observationoffset", "noninvasivesystolic",
                       "noninvasivediastolic", "noninvasivemean"),
    "diagnosis": ("diagnosisid", "patientunitstayid", "icd9code"),
    "pastHistory": ("pasthistoryid", "patientunitstayid", "pasthistorypath"),
    "apachePredVar": ("patientunitstayid", "aids", "hepaticfailure", "lymphoma", "metastaticcancer",
                      "leukemia", "cirrhosis"),
}
TYPES = {
    "patientunitstayid": "BIGINT", "patienthealthsystemstayid": "BIGINT", "hospitalid": "BIGINT",
    "hospitaldischargeyear": "INTEGER", "heartrate": "DOUBLE", "meanbp": "DOUBLE", "respiratoryrate": "DOUBLE",
    "temperature": "DOUBLE", "observationoffset": "BIGINT", "noninvasivesystolic": "DOUBLE",
    "noninvasivediastolic": "DOUBLE", "noninvasivemean": "DOUBLE", "aids": "INTEGER", "hepaticfailure": "INTEGER",
    "lymphoma": "INTEGER", "metastaticcancer": "INTEGER", "leukemia": "INTEGER", "cirrhosis": "INTEGER",
    "vitalaperiodicid": "BIGINT", "diagnosisid": "BIGINT", "pasthistoryid": "BIGINT",
}
#: The key of each table (eICU-CRD documentation): identical duplicated rows are collapsed and
#: counted, conflicting ones refused. apacheApsVar and apachePredVar hold one row per stay.
KEYS: dict[str, tuple[str, ...]] = {
    "patient": ("patientunitstayid",), "hospital": ("hospitalid",), "apacheApsVar": ("patientunitstayid",),
    "apachePredVar": ("patientunitstayid",), "vitalAperiodic": ("vitalaperiodicid",),
    "diagnosis": ("diagnosisid",), "pastHistory": ("pasthistoryid",),
}
DEFAULT_MIN_CENTER_STAYS = 10
#: tables the cohort can be built without, and what it lacks when one holds no data rows
HEADER_ONLY = {
    "hospital": "every hospital's region, bed count and teaching status is unknown",
    "vitalAperiodic": "no stay has a systolic or diastolic blood pressure",
    "diagnosis": "the Charlson comorbidities coded during the stay are all 0",
    "pastHistory": "the Charlson comorbidities of the past history are all 0",
    "apachePredVar": "the Charlson comorbidities of the APACHE chronic conditions are all 0",
}
_ID = (1, 2**62)
#: Bounds of numeric columns whose out-of-range values would drop or move stays silently (a
#: negative identifier or year); checked before any concept runs, with the text columns of the
#: same tables (a NUL byte refused): theirs are the values that reach the outputs.
RANGES: dict[str, dict[str, tuple[float, float]]] = {
    "patient": {"patientunitstayid": _ID, "patienthealthsystemstayid": _ID, "hospitalid": _ID,
                "hospitaldischargeyear": (1, 9999)},
    "hospital": {"hospitalid": _ID},
}
#: eICU's age column: a number of years, "> 89", or empty (unknown).
AGE_RANGE = (0, 89)


def _check_age(con, table: Table) -> None:
    """Refuse ``age`` text that is neither empty, "> 89" nor a number of years in :data:`AGE_RANGE`
    (``nan``, ``-3``, ``abc`` would otherwise drop the stay at the age filter without a word).

    Raises:
        InputError: naming the file, the column and how many rows hold other values.
    """
    v = "trim(CAST(age AS VARCHAR))"
    lo, hi = AGE_RANGE
    n = con.execute(f"SELECT count(*) FILTER (WHERE age IS NOT NULL AND {v} <> '' AND {v} <> '> 89' AND "
                    f"coalesce(TRY_CAST({v} AS DOUBLE) BETWEEN {lo} AND {hi}, false) = false) "
                    f"FROM {table.varchar_scan()}").fetchall()[0][0]
    if n:
        raise InputError(f"{table.path}: column 'age' must be a number of years in [{lo}, {hi}], '> 89' or empty "
                         f"({n} rows are not)")


#: The values eICU-CRD writes in the patient table's coded text columns (empty: not recorded);
#: another value (``alive``, ``MALE``, ``Dead``) would be read as unknown without a word.
CODED = {"hospitaldischargestatus": ("Alive", "Expired"), "unitdischargestatus": ("Alive", "Expired"),
         "gender": ("Male", "Female", "Unknown", "Other")}


def _check_patient(con, table: Table) -> None:
    """Refuse, in one scan of ``patient``, an empty ``uniquepid`` (stays are numbered into patients
    by it, so every empty one would become the same patient, kept in one split) and a coded column
    holding a value eICU does not write (:data:`CODED`).

    Raises:
        InputError: naming the file, the column and how many rows.
    """
    v = {c: f"trim(CAST({c} AS VARCHAR))" for c in CODED if c in table.columns}
    conds = ["count(*) FILTER (WHERE uniquepid IS NULL OR trim(CAST(uniquepid AS VARCHAR)) = '')"]
    conds += [f"count(*) FILTER (WHERE {e} <> '' AND {e} NOT IN ({', '.join(repr(x) for x in CODED[c])}))"
              for c, e in v.items()]
    empty, *bad = con.execute(f"SELECT {', '.join(conds)} FROM {table.varchar_scan()}").fetchall()[0]
    if empty:
        raise InputError(f"{table.path}: column 'uniquepid' is empty in {empty} row{'s' if empty != 1 else ''} "
                         "(every unit stay needs its patient's id)")
    for c, n in zip(v, bad):
        if n:
            raise InputError(f"{table.path}: column '{c}' must be {', '.join(CODED[c])} or empty, as eICU writes "
                             f"it ({n} row{'s hold' if n != 1 else ' holds'} other values)")


def _comorbidity_sql(s: dict[str, str], source: str) -> str:
    """etl/sql/eicu/comorbidity.sql; with ``earlier-admissions`` the stay's own diagnosis codes
    are left out (past history and APACHE chronic conditions are recorded at admission)."""
    icd = concept_sql("eicu", "diagnosis_icd", diagnosis=s["diagnosis"])
    if source != "same-admission":
        icd = f"SELECT * FROM ({icd}) WHERE false"
    return concept_sql("eicu", "comorbidity", pastHistory=s["pastHistory"], apachePredVar=s["apachePredVar"],
                       icd_flags=charlson.charlson_flags_sql(f"({icd})"))


def _decorate_centers(hosp: pl.DataFrame) -> Callable[[pl.DataFrame, pl.DataFrame], pl.DataFrame]:
    """A hospital's "care unit" is its most common unit type; hospital attributes are added."""

    def decorate(cohort: pl.DataFrame, centers: pl.DataFrame) -> pl.DataFrame:
        mode_unit = (cohort.group_by("center_id", "care_unit").len()
                     .sort(["center_id", "len", "care_unit"], descending=[False, True, False])
                     .group_by("center_id", maintain_order=True).first().select("center_id", "care_unit"))
        hid = cohort.group_by("center_id").agg(pl.col("hospitalid").first())
        return (centers.drop("care_unit").join(mode_unit, on="center_id").join(hid, on="center_id")
                .join(hosp, on="hospitalid", how="left").drop("hospitalid").sort("center_id"))

    return decorate


def _per_hospital(report: dict, cohort: pl.DataFrame, centers: pl.DataFrame) -> str:
    per_h = (rate_table(cohort, "center_id")
             .join(centers.select("center_id", "region", "numbedscategory", "teachingstatus"), on="center_id")
             .sort("center_id"))
    report["per_hospital"] = per_h.to_dicts()
    md = "\n## Per hospital\n\n| center_id | region | beds | teaching | stays | positives | label_rate |\n|---|---|---|---|---|---|---|\n"
    return md + "\n".join(f"| {r['center_id']} | {r['region']} | {r['numbedscategory']} | {r['teachingstatus']} | "
                          f"{r['stays']} | {r['positives']} | {r['label_rate']:.4f} |" for r in report["per_hospital"]) + "\n"


def run_eicu_etl(data_dir: str | Path, out: str | Path, opts: EtlOptions | None = None) -> dict:
    """``abps etl --source eicu``: eICU tables -> the same four outputs as the MIMIC ETL.

    Centers are hospitals (``hospitalid``); centers with fewer than ``opts.min_center_stays``
    stays are dropped (default for eICU: 10). ``--comorbidity-source earlier-admissions`` keeps
    only past-history and APACHE chronic-condition flags (recorded at admission) and drops the
    diagnosis codes of the stay itself. ``--threads`` and ``--memory-limit`` bound DuckDB as for
    MIMIC; options that do not apply to eICU (partition, windows, care units) are refused.

    Raises:
        InputError: a missing, ambiguous or unreadable table, a missing / mistyped column, an
            identifier, year or age out of range, conflicting duplicate keys, an option that does
            not apply, or an empty cohort.
    """
    opts = opts or EtlOptions(min_center_stays=DEFAULT_MIN_CENTER_STAYS)
    opts.validate("eicu")
    root = Path(data_dir)
    if not root.is_dir():
        raise InputError(f"--data-dir {root}: not a directory")
    types = {k.lower(): v for k, v in {**TYPES, **column_types(opts.task, "eicu")}.items()}
    tables: dict[str, Table] = {name: locate(root, "", name, cols + required_columns(opts.task, "eicu", name), types)
                                for name, cols in REQUIRED.items()}
    inputs = {name: str(t.path.relative_to(root)) for name, t in tables.items()}
    t_start = time.perf_counter()
    att = Attrition()
    with atomic_output_dir(out) as tmp:
        # each gzip table is read from a copy that ISA-L inflates (its CRC-32 and length checked, as
        # for MIMIC-IV's tables; DuckDB's reader checks neither), parsed on DuckDB's threads; an
        # error still names the source file. The copies go before the outputs are written.
        scratch = tmp / ".inflated"
        tables = {name: inflated(t, scratch) for name, t in tables.items()}
        con = connect(opts.threads, opts.memory_limit, tmp)
        with contextlib.closing(con), duckdb_errors(list(tables.values()), types):
            check_flags(con, tables["apachePredVar"], REQUIRED["apachePredVar"][1:])
            for name, bounds in RANGES.items():
                check_range(con, tables[name], bounds)
                check_text(con, tables[name], tuple(c for c in REQUIRED[name] if c not in TYPES))
            _check_age(con, tables["patient"])
            _check_patient(con, tables["patient"])
            require_rows(con, tables["patient"], "every stay of the cohort is one of its rows")
            require_rows(con, tables["apacheApsVar"], "the first-day vitals come from it")
            for name, what in HEADER_ONLY.items():  # readable, and what the cohort then lacks is said
                if not con.execute(f"SELECT 1 FROM {tables[name].scan_sql(types)} LIMIT 1").fetchall():
                    warnings.warn(InputWarning(f"{tables[name].path}: no data rows; {what}"), stacklevel=1)
            tables = check_keys(con, tables, KEYS, types, att, root)
            s = {k: v.scan_sql(types) for k, v in tables.items()}
            con.execute("CREATE TEMP TABLE all_stays AS " + concept_sql("eicu", "stays", patient=s["patient"]))
            relabel(con, "eicu", opts.task, s)
            n_all = scalar(con, "SELECT count(*) FROM all_stays")
            n_lab = scalar(con, "SELECT count(*) FROM all_stays WHERE label IS NOT NULL")
            att.add("unit stays", n_all, n_all)
            att.add("known hospital discharge status" if opts.task == DEFAULT_TASK else f"known {opts.task} label",
                    n_all, n_lab)
            con.execute("CREATE TEMP TABLE kept AS SELECT * FROM all_stays WHERE label IS NOT NULL AND age BETWEEN ? AND ?",
                        [opts.min_age, opts.max_age])
            n_age = scalar(con, "SELECT count(*) FROM kept")
            att.add(f"age {opts.min_age:g} to {opts.max_age:g}", n_lab, n_age)
            if n_age == 0:
                raise InputError("empty cohort after the age filter (check --min-age, --max-age)")
            vitals = frame(con, concept_sql("eicu", "first_day_vitals", apacheApsVar=s["apacheApsVar"],
                                            vitalAperiodic=s["vitalAperiodic"],
                                            from_minutes=float(opts.vitals_from_hours) * 60))
            cci = frame(con, _comorbidity_sql(s, opts.comorbidity_source))
            kept = frame(con, "SELECT * FROM kept ORDER BY stay_id")
            hosp = frame(con, f"SELECT CAST(hospitalid AS BIGINT) AS hospitalid, numbedscategory, teachingstatus, "
                              f"region FROM {s['hospital']}")
        shutil.rmtree(scratch, ignore_errors=True)
        cohort = (
            kept.join(vitals, on="stay_id", how="left").join(cci, on="stay_id", how="left")
            .with_columns([pl.col(c).fill_null(0).cast(pl.Int8) for c in charlson.CCI_COLUMNS])
            .with_columns(pl.col("admit_year").cast(pl.Int32), pl.col("age").cast(pl.Float64),
                          pl.col("subject_id").cast(pl.Int64), window_start=pl.lit(None, dtype=pl.Int32),
                          window_end=pl.lit(None, dtype=pl.Int32),
                          intime=pl.col("stay_id"))  # eICU has offsets only: stay order = stay_id order
        )
        return finish(cohort, att, opts, tmp, {}, source="eicu", inputs=inputs, partition="hospital",
                      noun="hospital", decorate_centers=_decorate_centers(hosp), extend_report=_per_hospital,
                      t_start=t_start)

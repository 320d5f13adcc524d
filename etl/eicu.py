"""eICU-CRD -> federated ICU-mortality cohort whose centers are real hospitals (`abps etl --source eicu`).

eICU (Pollard et al. 2018) covers unit stays from many US hospitals, so the federation is real:
center = ``hospitalid``. The output contract is MIMIC's (docs/data_dictionary.md), so the runtime
needs no change; the mapping of eICU fields onto it is documented in docs/eicu.md:

* stay_id = ``patientunitstayid``, hadm_id = ``patienthealthsystemstayid``, subject_id = the
  dense rank of ``uniquepid`` (an integer; eICU's pid is a string).
* label = ``hospitaldischargestatus`` = 'Expired' (stays with an empty status are dropped).
* age: eICU writes ages above 89 as the string "> 89", read as 90.
* care_unit = ``unittype``; admission_type = ``unitstaytype``; admission_location =
  ``unitadmitsource``; insurance is not recorded in eICU ('UNKNOWN').
* Vitals: first-day APACHE values from ``apacheApsVar`` (heart rate, mean BP, respiratory rate,
  temperature; -1 marks missing) and, where present, non-invasive BP from ``vitalAperiodic`` over
  the first 24 h of the unit stay. APACHE gives one (worst) value per stay, used for mean, min and
  max alike. SpO2 has no source in the demo (vitalPeriodic is not part of it) and stays null.
* Charlson flags: ICD-9 and ICD-10 codes in ``diagnosis.icd9code`` (both versions are listed in
  one string, e.g. "401.9, I10"), ``pastHistory`` paths, and ``apachePredVar`` flags, mapped to the
  12 updated-Charlson categories (docs/eicu.md gives the table).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import duckdb
import polars as pl

from etl import charlson
from etl.errors import InputError
from etl.io import atomic_output_dir, atomic_write_text
from etl.mimic import COHORT_COLUMNS, Attrition, drop_small_centers, EtlOptions, _frame, _json_default, center_metadata
from etl.partition import grouped_stratified_split
from etl.sources import Table, duckdb_errors, locate

REQUIRED = {
    "patient": ("patientunitstayid", "patienthealthsystemstayid", "uniquepid", "gender", "age", "ethnicity",
                "hospitalid", "unittype", "unitadmitsource", "unitstaytype", "hospitaldischargeyear",
                "hospitaldischargestatus"),
    "hospital": ("hospitalid", "numbedscategory", "teachingstatus", "region"),
    "apacheApsVar": ("patientunitstayid", "heartrate", "meanbp", "respiratoryrate", "temperature"),
    "vitalAperiodic": ("patientunitstayid", "observationoffset", "noninvasivesystolic",
                       "noninvasivediastolic", "noninvasivemean"),
    "diagnosis": ("patientunitstayid", "icd9code"),
    "pastHistory": ("patientunitstayid", "pasthistorypath"),
    "apachePredVar": ("patientunitstayid", "aids", "hepaticfailure", "lymphoma", "metastaticcancer",
                      "leukemia", "cirrhosis"),
}
TYPES = {
    "patientunitstayid": "BIGINT", "patienthealthsystemstayid": "BIGINT", "hospitalid": "BIGINT",
    "hospitaldischargeyear": "INTEGER", "heartrate": "DOUBLE", "meanbp": "DOUBLE", "respiratoryrate": "DOUBLE",
    "temperature": "DOUBLE", "observationoffset": "BIGINT", "noninvasivesystolic": "DOUBLE",
    "noninvasivediastolic": "DOUBLE", "noninvasivemean": "DOUBLE", "aids": "INTEGER", "hepaticfailure": "INTEGER",
    "lymphoma": "INTEGER", "metastaticcancer": "INTEGER", "leukemia": "INTEGER", "cirrhosis": "INTEGER",
}

#: pastHistory path fragments -> Charlson columns (docs/eicu.md). A path matches when it contains
#: the fragment; one path can set several columns.
PAST_HISTORY_MAP: tuple[tuple[str, str], ...] = (
    ("/Congestive Heart Failure/", "cci_chf"),
    ("/Neurologic/Dementia/", "cci_dementia"),
    ("/Pulmonary/COPD/", "cci_chronic_pulmonary"),
    ("/Pulmonary/Asthma/", "cci_chronic_pulmonary"),
    ("/Pulmonary/Restrictive Disease/", "cci_chronic_pulmonary"),
    ("/Rheumatic/Rheumatoid Arthritis/", "cci_rheumatic"),
    ("/Rheumatic/SLE/", "cci_rheumatic"),
    ("/Rheumatic/Scleroderma/", "cci_rheumatic"),
    ("/Cirrhosis/", "cci_mild_liver"),
    ("/Cirrhosis/varices", "cci_severe_liver"),
    ("/Cirrhosis/encephalopathy", "cci_severe_liver"),
    ("/Cirrhosis/ascites", "cci_severe_liver"),
    ("/Cirrhosis/UGI bleeding", "cci_severe_liver"),
    ("/Renal Failure/", "cci_renal"),
    ("/Renal Insufficiency/", "cci_renal"),
    ("/s/p Renal Transplant/", "cci_renal"),
    ("/Cancer/Cancer-Primary Site/", "cci_malignancy"),
    ("/Cancer/Hematologic Malignancy/", "cci_malignancy"),
    ("/Cancer/Metastases/", "cci_metastatic"),
    ("/HIV (only)", "cci_aids"),
)
#: apachePredVar flags -> Charlson columns.
APACHE_FLAG_MAP: tuple[tuple[str, str], ...] = (
    ("aids", "cci_aids"), ("hepaticfailure", "cci_severe_liver"), ("lymphoma", "cci_malignancy"),
    ("leukemia", "cci_malignancy"), ("metastaticcancer", "cci_metastatic"), ("cirrhosis", "cci_mild_liver"),
)
DEFAULT_MIN_CENTER_STAYS = 10


def _sql_tables(t: dict[str, Table]) -> dict[str, str]:
    types = {k.lower(): v for k, v in TYPES.items()}
    return {k: v.scan_sql(types) for k, v in t.items()}


def _stays_sql(s: dict[str, str]) -> str:
    return f"""
    SELECT p.patientunitstayid AS stay_id,
           dense_rank() OVER (ORDER BY p.uniquepid) AS subject_id,
           p.patienthealthsystemstayid AS hadm_id,
           p.hospitalid,
           'hosp-' || CAST(p.hospitalid AS VARCHAR) AS center_id,
           coalesce(nullif(p.unittype, ''), 'UNKNOWN') AS care_unit,
           p.hospitaldischargeyear AS admit_year,
           CAST(p.hospitaldischargeyear AS VARCHAR) AS anchor_year_group,
           CASE WHEN trim(p.age) = '> 89' THEN 90.0 ELSE TRY_CAST(p.age AS DOUBLE) END AS age,
           CASE p.gender WHEN 'Male' THEN 'M' WHEN 'Female' THEN 'F' ELSE 'UNKNOWN' END AS gender,
           CASE p.ethnicity WHEN 'Caucasian' THEN 'WHITE' WHEN 'African American' THEN 'BLACK'
                WHEN 'Hispanic' THEN 'HISPANIC' WHEN 'Asian' THEN 'ASIAN'
                WHEN 'Native American' THEN 'OTHER' WHEN 'Other/Unknown' THEN 'OTHER' ELSE 'UNKNOWN' END AS race,
           coalesce(nullif(p.unitstaytype, ''), 'UNKNOWN') AS admission_type,
           coalesce(nullif(p.unitadmitsource, ''), 'UNKNOWN') AS admission_location,
           'UNKNOWN' AS insurance,
           CASE p.hospitaldischargestatus WHEN 'Expired' THEN 1 WHEN 'Alive' THEN 0 END::TINYINT AS label
    FROM {s['patient']} p
    """


def _vitals_sql(s: dict[str, str], from_minutes: float) -> str:
    def ok(col: str, lo: float, hi: float) -> str:
        return f"CASE WHEN {col} > {lo} AND {col} < {hi} THEN {col} END"

    return f"""
    WITH aps AS (
        SELECT patientunitstayid AS stay_id,
               {ok('heartrate', 0, 300)} AS hr, {ok('meanbp', 0, 300)} AS mbp_aps,
               {ok('respiratoryrate', 0, 70)} AS rr, {ok('temperature', 10, 50)} AS temp
        FROM {s['apacheApsVar']}
    ), nibp AS (
        SELECT patientunitstayid AS stay_id,
               avg({ok('noninvasivesystolic', 0, 400)}) AS sbp_mean, min({ok('noninvasivesystolic', 0, 400)}) AS sbp_min,
               max({ok('noninvasivesystolic', 0, 400)}) AS sbp_max,
               avg({ok('noninvasivediastolic', 0, 300)}) AS dbp_mean, min({ok('noninvasivediastolic', 0, 300)}) AS dbp_min,
               max({ok('noninvasivediastolic', 0, 300)}) AS dbp_max,
               avg({ok('noninvasivemean', 0, 300)}) AS mbp_mean, min({ok('noninvasivemean', 0, 300)}) AS mbp_min,
               max({ok('noninvasivemean', 0, 300)}) AS mbp_max
        FROM {s['vitalAperiodic']}
        WHERE observationoffset >= {from_minutes} AND observationoffset <= 1440
        GROUP BY patientunitstayid
    )
    SELECT k.stay_id,
           round(a.hr, 6) AS heart_rate_mean, round(a.hr, 6) AS heart_rate_min, round(a.hr, 6) AS heart_rate_max,
           round(n.sbp_mean, 6) AS sbp_mean, round(n.sbp_min, 6) AS sbp_min, round(n.sbp_max, 6) AS sbp_max,
           round(n.dbp_mean, 6) AS dbp_mean, round(n.dbp_min, 6) AS dbp_min, round(n.dbp_max, 6) AS dbp_max,
           round(coalesce(n.mbp_mean, a.mbp_aps), 6) AS mbp_mean, round(coalesce(n.mbp_min, a.mbp_aps), 6) AS mbp_min,
           round(coalesce(n.mbp_max, a.mbp_aps), 6) AS mbp_max,
           round(a.rr, 6) AS resp_rate_mean, round(a.rr, 6) AS resp_rate_min, round(a.rr, 6) AS resp_rate_max,
           CAST(NULL AS DOUBLE) AS spo2_mean, CAST(NULL AS DOUBLE) AS spo2_min, CAST(NULL AS DOUBLE) AS spo2_max,
           round(a.temp, 6) AS temperature_mean, round(a.temp, 6) AS temperature_min, round(a.temp, 6) AS temperature_max
    FROM kept k LEFT JOIN aps a USING (stay_id) LEFT JOIN nibp n USING (stay_id)
    """


def _icd_relation(s: dict[str, str]) -> str:
    """diagnosis.icd9code "401.9, I10" -> rows (hadm_id := stay_id, icd_code, icd_version).

    A token starting with a digit is ICD-9; a token starting with V or E is ICD-9 when it is the
    first token of a string that also has a second token (eICU lists the ICD-9 code first), and
    ICD-10 otherwise; any other letter is ICD-10.
    """
    return f"""(
        SELECT stay_id AS hadm_id, replace(tok, '.', '') AS icd_code,
               CASE WHEN regexp_matches(tok, '^[0-9]') THEN 9
                    WHEN regexp_matches(tok, '^[VE]') AND pos = 1 AND n > 1 THEN 9
                    ELSE 10 END AS icd_version
        FROM (
            SELECT d.patientunitstayid AS stay_id, trim(t.tok) AS tok, t.pos, len(string_split(d.icd9code, ',')) AS n
            FROM {s['diagnosis']} d,
                 LATERAL (SELECT unnest(string_split(d.icd9code, ',')) AS tok,
                                 generate_subscripts(string_split(d.icd9code, ','), 1) AS pos) t
            WHERE d.icd9code IS NOT NULL AND d.icd9code <> ''
              AND d.patientunitstayid IN (SELECT stay_id FROM kept)
        ) WHERE tok <> ''
    )"""


def _comorbidity_sql(s: dict[str, str], source: str) -> str:
    """Union of ICD-coded, past-history and APACHE flags per stay (max over sources)."""
    def flag(conditions: list[str], column: str) -> str:
        cond = " OR ".join(conditions) or "false"
        return f"max(CASE WHEN {cond} THEN 1 ELSE 0 END)::TINYINT AS {column}"

    ph_cases = ", ".join(
        flag([f"contains(pasthistorypath, '{frag}')" for frag, col in PAST_HISTORY_MAP if col == c], c)
        for c in charlson.CCI_COLUMNS
    )
    ap_cases = ", ".join(
        flag([f"coalesce({name}, 0) = 1" for name, col in APACHE_FLAG_MAP if col == c], c)
        for c in charlson.CCI_COLUMNS
    )
    parts = [
        f"SELECT patientunitstayid AS stay_id, {ph_cases} FROM {s['pastHistory']} "
        f"WHERE patientunitstayid IN (SELECT stay_id FROM kept) GROUP BY patientunitstayid",
        f"SELECT patientunitstayid AS stay_id, {ap_cases} FROM {s['apachePredVar']} "
        f"WHERE patientunitstayid IN (SELECT stay_id FROM kept) GROUP BY patientunitstayid",
    ]
    if source == "same-admission":
        icd = charlson.charlson_flags_sql(_icd_relation(s))
        parts.append(f"SELECT hadm_id AS stay_id, {', '.join(charlson.CCI_COLUMNS)} FROM ({icd})")
    union = " UNION ALL ".join(f"({p})" for p in parts)
    cols = ", ".join(f"max({c})::TINYINT AS {c}" for c in charlson.CCI_COLUMNS)
    return f"SELECT stay_id, {cols} FROM ({union}) GROUP BY stay_id"


def run_eicu_etl(data_dir: str | Path, out: str | Path, opts: EtlOptions | None = None) -> dict:
    """``abps etl --source eicu``: eICU tables -> the same four outputs as the MIMIC ETL.

    Centers are hospitals (``hospitalid``); centers with fewer than ``opts.min_center_stays``
    stays are dropped (default for eICU: 10). ``--comorbidity-source earlier-admissions`` keeps
    only past-history and APACHE chronic-condition flags (recorded at admission) and drops the
    diagnosis codes of the stay itself.

    Raises:
        InputError: a missing table or column, an unreadable file, or an empty cohort.
    """
    from etl.report import cohort_report, report_markdown

    opts = opts or EtlOptions(min_center_stays=DEFAULT_MIN_CENTER_STAYS)
    opts.validate()
    root = Path(data_dir)
    if not root.is_dir():
        raise InputError(f"--data-dir {root}: not a directory")
    tables = {name: locate(root, "", name, cols) for name, cols in REQUIRED.items()}
    s = _sql_tables(tables)
    t_start = time.perf_counter()
    att = Attrition()
    with atomic_output_dir(out) as tmp:
        con = duckdb.connect(":memory:")
        con.execute(f"SET threads = {int(opts.threads)}")
        with contextlib.closing(con), duckdb_errors(list(tables.values())):
            con.execute(f"CREATE TEMP TABLE all_stays AS {_stays_sql(s)}")
            n_all = con.execute("SELECT count(*) FROM all_stays").fetchall()[0][0]
            n_lab = con.execute("SELECT count(*) FROM all_stays WHERE label IS NOT NULL").fetchall()[0][0]
            att.add("unit stays", n_all, n_all)
            att.add("known hospital discharge status", n_all, n_lab)
            con.execute("CREATE TEMP TABLE kept AS SELECT * FROM all_stays WHERE label IS NOT NULL AND age BETWEEN ? AND ?",
                        [opts.min_age, opts.max_age])
            n_age = con.execute("SELECT count(*) FROM kept").fetchall()[0][0]
            att.add(f"age {opts.min_age:g} to {opts.max_age:g}", n_lab, n_age)
            if n_age == 0:
                raise InputError("empty cohort after the age filter (check --min-age, --max-age)")
            vitals = _frame(con, _vitals_sql(s, opts.vitals_from_hours * 60))
            cci = _frame(con, _comorbidity_sql(s, opts.comorbidity_source))
            kept = _frame(con, "SELECT * FROM kept ORDER BY stay_id")
            hosp = _frame(con, f"SELECT CAST(hospitalid AS BIGINT) AS hospitalid, numbedscategory, teachingstatus, region FROM {s['hospital']}")
        cohort = (
            kept.join(vitals, on="stay_id", how="left").join(cci, on="stay_id", how="left")
            .with_columns([pl.col(c).fill_null(0).cast(pl.Int8) for c in charlson.CCI_COLUMNS])
            .with_columns(pl.col("admit_year").cast(pl.Int32), pl.col("age").cast(pl.Float64),
                          pl.col("subject_id").cast(pl.Int64), window_start=pl.lit(None, dtype=pl.Int32),
                          window_end=pl.lit(None, dtype=pl.Int32), intime=pl.col("stay_id"))
        )
        cohort = drop_small_centers(cohort, opts.min_center_stays, att, noun="hospital")
        cohort = cohort.with_columns(split=grouped_stratified_split(cohort, opts.split_fractions, opts.seed))
        centers = center_metadata(cohort)
        # A hospital's "care unit" is its most common unit type; hospital attributes are added.
        mode_unit = (cohort.group_by("center_id", "care_unit").len()
                     .sort(["center_id", "len", "care_unit"], descending=[False, True, False])
                     .group_by("center_id", maintain_order=True).first().select("center_id", "care_unit"))
        hid = cohort.group_by("center_id").agg(pl.col("hospitalid").first())
        centers = (centers.drop("care_unit").join(mode_unit, on="center_id").join(hid, on="center_id")
                   .join(hosp, on="hospitalid", how="left").drop("hospitalid").sort("center_id"))
        cohort = cohort.select(COHORT_COLUMNS).sort("stay_id")
        cohort.write_parquet(tmp / "cohort.parquet")
        centers.write_parquet(tmp / "centers.parquet")
        report = cohort_report(cohort, centers, att.rows, opts, {"total_s": time.perf_counter() - t_start})
        report["source"] = "eicu"
        report["options"]["partition"] = "hospital"
        per_h = (cohort.group_by("center_id").agg(pl.len().alias("stays"), pl.col("label").sum().cast(pl.Int64).alias("deaths"))
                 .with_columns((pl.col("deaths") / pl.col("stays")).alias("mortality"))
                 .join(centers.select("center_id", "region", "numbedscategory", "teachingstatus"), on="center_id")
                 .sort("center_id"))
        report["per_hospital"] = per_h.to_dicts()
        md = report_markdown(report)
        md += "\n## Per hospital\n\n| center_id | region | beds | teaching | stays | deaths | mortality |\n|---|---|---|---|---|---|---|\n"
        md += "\n".join(f"| {r['center_id']} | {r['region']} | {r['numbedscategory']} | {r['teachingstatus']} | "
                        f"{r['stays']} | {r['deaths']} | {r['mortality']:.4f} |" for r in report["per_hospital"]) + "\n"
        atomic_write_text(tmp / "cohort_report.json", json.dumps(report, indent=2, default=_json_default))
        atomic_write_text(tmp / "cohort_report.md", md)
    return report

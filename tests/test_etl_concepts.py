"""One known-value test per SQL concept file (etl/sql/**), run on the real demos.

Each concept is run on its own through the one connection function, over all stays of the demo
(no cohort filter), and checked against numbers computed independently with Polars from the raw
CSV files (the computation is given in each comment) - the mimic-code practice of a test per
concept.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from etl import charlson, eicu, mimic
from etl.pipeline import concept_sql, connect, frame, scalar
from etl.schema import CCI_COLUMNS, VITAL_COLUMNS
from etl.sources import locate

SQL = Path(mimic.__file__).resolve().parent / "sql"


def test_every_concept_file_cites_its_source_and_ships():
    files = sorted(SQL.rglob("*.sql"))
    assert {f.relative_to(SQL).as_posix() for f in files} == {
        "charlson.sql", "mimic/stays.sql", "mimic/vital_rows.sql", "mimic/vitalsign.sql",
        "mimic/vital_window.sql", "mimic/vital_per_stay.sql", "mimic/first_day_vitalsign.sql", "mimic/diagnoses_same_admission.sql",
        "mimic/diagnoses_earlier_admissions.sql", "eicu/stays.sql", "eicu/first_day_vitals.sql",
        "eicu/diagnosis_icd.sql", "eicu/comorbidity.sql", "meds/icustays.sql", "meds/admissions.sql",
        "meds/patients.sql", "meds/chartevents.sql", "meds/diagnoses_icd.sql",
        "mimic/task_icu_mortality.sql", "mimic/task_los.sql", "eicu/task_icu_mortality.sql", "eicu/task_los.sql",
        "mimic/task_decompensation.sql", "eicu/task_decompensation.sql"}
    for f in files:
        head = f.read_text().split("\n\n")[0]
        assert head.startswith("-- Concept: ") and "Source: " in head, f
    pyproject = (SQL.parents[1] / "pyproject.toml").read_text()
    assert '"sql/*.sql", "sql/mimic/*.sql", "sql/eicu/*.sql", "sql/meds/*.sql"' in pyproject


@pytest.fixture(scope="module")
def mimic_con(mimic_demo_dir, tmp_path_factory):
    t = {name: locate(mimic_demo_dir, module, name, cols, mimic.TYPES) for (module, name), cols in mimic.REQUIRED.items()}
    s = {k: v.scan_sql(mimic.TYPES) for k, v in t.items()}
    con = connect(2, "2GB", tmp_path_factory.mktemp("duck"))
    con.execute("CREATE TEMP TABLE kept AS " + concept_sql(
        "mimic", "stays", icustays=s["icustays"], admissions=s["admissions"], patients=s["patients"],
        care_units=", ".join(f"('{k}', '{v}')" for k, v in mimic.CARE_UNITS.items())))
    with contextlib.closing(con):
        yield con, s


def test_mimic_stays(mimic_con):
    con, _ = mimic_con
    # Polars: icustays x admissions x patients on the demo: 140 stays, 20 in-hospital deaths,
    # age = anchor_age + year(admittime) - anchor_year in [21, 92] with mean 62.928571
    assert scalar(con, "SELECT count(*) FROM kept") == 140
    assert scalar(con, "SELECT sum(label) FROM kept") == 20
    assert con.execute("SELECT min(age), max(age), round(avg(age), 6) FROM kept").fetchall()[0] == (21, 92, 62.928571)
    units = dict(con.execute("SELECT care_unit, count(*) FROM kept GROUP BY 1").fetchall())
    assert units == {"CVICU": 25, "CCU": 13, "MICU": 29, "MICU/SICU": 23, "Neuro Intermediate": 1,
                     "Neuro Stepdown": 1, "Neuro SICU": 3, "SICU": 29, "TSICU": 16}


def test_mimic_vital_rows_vitalsign_first_day(mimic_con):
    con, s = mimic_con
    in_window = concept_sql("mimic", "vital_window", rows=s["chartevents"], from_hours=0.0, stays="kept")
    con.execute("CREATE OR REPLACE TEMP TABLE vital_rows AS " + concept_sql(
        "mimic", "vital_rows", chartevents=f"({in_window})"))
    con.execute("CREATE OR REPLACE TEMP TABLE vitalsign AS " + concept_sql("mimic", "vitalsign", vital_rows="vital_rows"))
    # Polars: heart-rate rows (itemid 220045, 0 < value < 300) in [intime, intime + 24 h]: 3812
    # rows at 3812 distinct charttimes, over all 140 stays; no duplicated row
    assert con.execute("SELECT count(*), sum(n_rows) FROM vital_rows WHERE vital = 'heart_rate'").fetchall()[0] == (3812, 3812)
    assert con.execute("SELECT count(*), sum(n_rows), sum(n_distinct) FROM vitalsign "
                       "WHERE vital = 'heart_rate'").fetchall()[0] == (3812, 3812, 3812)
    con.execute("CREATE OR REPLACE TEMP TABLE vital_per_stay AS " + concept_sql("mimic", "vital_per_stay", vitalsign="vitalsign"))
    assert con.execute("SELECT count(*), sum(n_rows) FROM vital_per_stay WHERE vital = 'heart_rate'").fetchall()[0] == (140, 3812)
    first = frame(con, concept_sql("mimic", "first_day_vitalsign"))
    assert first.columns == ["stay_id", *VITAL_COLUMNS]
    assert first.height == 140 and first["heart_rate_max"].max() == 160.0
    # Polars: mean over stays of the per-stay mean of per-charttime heart rates = 89.754069
    assert round(first["heart_rate_mean"].mean(), 6) == pytest.approx(89.754069, abs=1e-6)


#: The first-day vitals as they were computed before the concepts were restructured (window applied
#: inside the distinct-row aggregation, then one value per charttime, then 21 filtered aggregates
#: per stay): the reference the restructured concepts must equal, bit for bit.
_OLD_VITALS = """
WITH vital_item(itemid, vital, lo, hi, hi_incl, f2c) AS (VALUES
    (220045, 'heart_rate', 0, 300, false, false), (220179, 'sbp', 0, 400, false, false),
    (220050, 'sbp', 0, 400, false, false), (225309, 'sbp', 0, 400, false, false),
    (220180, 'dbp', 0, 300, false, false), (220051, 'dbp', 0, 300, false, false),
    (225310, 'dbp', 0, 300, false, false), (220181, 'mbp', 0, 300, false, false),
    (220052, 'mbp', 0, 300, false, false), (225312, 'mbp', 0, 300, false, false),
    (220210, 'resp_rate', 0, 70, false, false), (224690, 'resp_rate', 0, 70, false, false),
    (220277, 'spo2', 0, 100, true, false), (223761, 'temperature', 70, 120, false, true),
    (223762, 'temperature', 10, 50, false, false)),
win AS (SELECT stay_id, intime + to_microseconds(CAST({h} * 3600e6 AS BIGINT)) AS t0,
               intime + INTERVAL 24 HOUR AS t1 FROM kept),
distinct_rows AS (
    SELECT c.stay_id, c.charttime, c.itemid, c.valuenum, count(*) AS n_rows
    FROM {ce} c JOIN vital_item m ON c.itemid = m.itemid JOIN win w ON c.stay_id = w.stay_id
    WHERE c.valuenum > m.lo AND (c.valuenum < m.hi OR (m.hi_incl AND c.valuenum = m.hi))
      AND c.charttime >= w.t0 AND c.charttime <= w.t1
    GROUP BY c.stay_id, c.charttime, c.itemid, c.valuenum),
vr AS (SELECT r.stay_id, m.vital, r.charttime, CASE WHEN m.f2c THEN (r.valuenum - 32) / 1.8 ELSE r.valuenum END AS v,
              r.n_rows FROM distinct_rows r JOIN vital_item m ON r.itemid = m.itemid),
vs AS (SELECT stay_id, vital, charttime, avg(v) AS v, sum(n_rows) AS n_rows, count(*) AS n_distinct
       FROM vr GROUP BY stay_id, vital, charttime)
SELECT stay_id, {cols}, sum(n_rows) AS n_rows, sum(n_distinct) AS n_distinct FROM vs GROUP BY stay_id ORDER BY stay_id
"""


@pytest.mark.parametrize("from_hours", [0.0, -6.0])
def test_restructured_vitals_equal_the_previous_concepts(mimic_con, tmp_path, from_hours):
    """Window before the aggregation (uncached) and after it (the cache's rows), one group per
    (stay, vital) turned wide: the same bytes as the previous two-aggregation, 21-filter form."""
    con, s = mimic_con
    # the demo with identical copies of a third of its heart-rate rows (collapsed and counted) and
    # a second, different SBP value at every SBP charttime (averaged per charttime)
    base = f"(SELECT stay_id, charttime, itemid, valuenum FROM {s['chartevents']})"
    ce = (f"({base} UNION ALL (SELECT * FROM {base} WHERE itemid = 220045 AND stay_id % 3 = 0) "
          f"UNION ALL (SELECT stay_id, charttime, itemid, valuenum + 1.5 FROM {base} WHERE itemid IN (220179, 220050)))")
    cols = ", ".join(f"round({agg}(v) FILTER (WHERE vital = '{c.rsplit('_', 1)[0]}'), 6) AS {c}"
                     for c in VITAL_COLUMNS for agg in [{"mean": "avg", "min": "min", "max": "max"}[c.rsplit("_", 1)[1]]])
    old = frame(con, _OLD_VITALS.format(h=from_hours, ce=ce, cols=cols))
    assert old["n_rows"].sum() > old["n_distinct"].sum() > 0  # the collapse is exercised
    opts = mimic.EtlOptions(vitals_from_hours=from_hours)
    cached = tmp_path / "vitalsign.parquet"
    con.execute(f"COPY ({mimic.vitalsign_sql(ce)}) TO '{cached}' (FORMAT parquet)")
    for source in ("uncached", "cached"):
        att = mimic.Attrition()
        con.execute("DROP TABLE IF EXISTS vital_per_stay")
        if source == "uncached":
            new = mimic.first_day_vitals(con, ce, opts, att, "dup")
        else:
            new = mimic.first_day_vitals(con, None, opts, att, "dup", vitalsign=f"read_parquet('{cached}')")
        assert new.sort("stay_id").equals(old.drop("n_rows", "n_distinct")), source
        n_rows, n_distinct = int(old["n_rows"].sum()), int(old["n_distinct"].sum())
        assert [(r["rows_in"], r["rows_out"]) for r in att.rows] == [(n_rows, n_distinct)]


def test_mimic_diagnoses_relations(mimic_con):
    con, s = mimic_con
    # Polars: diagnoses_icd rows of the stays' admissions: 2329; of their earlier admissions: 2518
    same = concept_sql("mimic", "diagnoses_same_admission", diagnoses_icd=s["diagnoses_icd"])
    assert scalar(con, f"SELECT count(*) FROM ({same})") == 2329
    early = concept_sql("mimic", "diagnoses_earlier_admissions", diagnoses_icd=s["diagnoses_icd"],
                        admissions=s["admissions"])
    assert scalar(con, f"SELECT count(*) FROM ({early})") == 2518


def test_charlson_concept_counts(mimic_con):
    con, s = mimic_con
    same = concept_sql("mimic", "diagnoses_same_admission", diagnoses_icd=s["diagnoses_icd"])
    flags = frame(con, charlson.charlson_flags_sql(f"({same})"))
    assert flags.columns == ["hadm_id", *CCI_COLUMNS]
    # independent: the Python mapping of the same codes, per admission
    codes = frame(con, f"SELECT hadm_id, icd_code, icd_version FROM ({same})")
    want: dict[str, int] = dict.fromkeys(CCI_COLUMNS, 0)
    for _, grp in codes.group_by("hadm_id"):
        for c, v in charlson.flags_for_codes(zip(grp["icd_code"], grp["icd_version"])).items():
            want[c] += v
    assert {c: int(flags[c].sum()) for c in CCI_COLUMNS} == want
    assert flags.height == codes["hadm_id"].n_unique() and want["cci_chf"] > 0


@pytest.fixture(scope="module")
def eicu_con(eicu_demo_dir, tmp_path_factory):
    types = {k.lower(): v for k, v in eicu.TYPES.items()}
    t = {name: locate(eicu_demo_dir, "", name, cols, types) for name, cols in eicu.REQUIRED.items()}
    s = {k: v.scan_sql(types) for k, v in t.items()}
    con = connect(2, "2GB", tmp_path_factory.mktemp("duck"))
    con.execute("CREATE TEMP TABLE kept AS " + concept_sql("eicu", "stays", patient=s["patient"]))
    with contextlib.closing(con):
        yield con, s


def test_eicu_stays(eicu_con):
    con, _ = eicu_con
    # Polars: patient.csv.gz has 2520 unit stays: 2280 'Alive', 212 'Expired', 28 empty
    assert scalar(con, "SELECT count(*) FROM kept") == 2520
    assert dict(con.execute("SELECT label, count(*) FROM kept GROUP BY 1").fetchall()) == {0: 2280, 1: 212, None: 28}
    assert scalar(con, "SELECT count(*) FROM kept WHERE age = 90") > 0  # "> 89"


def test_eicu_first_day_vitals(eicu_con):
    con, s = eicu_con
    v = frame(con, concept_sql("eicu", "first_day_vitals", apacheApsVar=s["apacheApsVar"],
                               vitalAperiodic=s["vitalAperiodic"], from_minutes=0.0))
    assert v.columns == ["stay_id", *VITAL_COLUMNS] and v.height == 2520
    # Polars: 2205 apacheApsVar rows, 2163 with 0 < heartrate < 300
    assert v["heart_rate_mean"].is_not_null().sum() == 2163
    assert v["spo2_mean"].is_null().all()


def test_eicu_diagnosis_icd_and_comorbidity(eicu_con):
    con, s = eicu_con
    icd = concept_sql("eicu", "diagnosis_icd", diagnosis=s["diagnosis"])
    # Polars: non-empty comma-separated tokens of diagnosis.icd9code: 42135
    assert scalar(con, f"SELECT count(*) FROM ({icd})") == 42135
    cci = frame(con, concept_sql("eicu", "comorbidity", pastHistory=s["pastHistory"],
                                 apachePredVar=s["apachePredVar"], icd_flags=charlson.charlson_flags_sql(f"({icd})")))
    assert cci.columns == ["stay_id", *CCI_COLUMNS]
    # Polars: 330 stays have a pastHistory path containing '/Congestive Heart Failure/'; every one
    # is flagged, and ICD codes add more
    chf = set(cci.filter(cci["cci_chf"] == 1)["stay_id"])
    ph = set(r[0] for r in con.execute(
        f"SELECT DISTINCT patientunitstayid FROM {s['pastHistory']} "
        "WHERE contains(pasthistorypath, '/Congestive Heart Failure/')").fetchall())
    assert len(ph) == 330 and ph <= chf and len(chf) > 330

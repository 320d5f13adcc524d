"""`abps etl --source meds` on the real MIMIC-IV demo in MEDS form, against the CSV path.

The MEDS copy (../shared/data/mimic-iv-demo-extra/meds-official) is the PhysioNet release
``mimic-iv-demo-meds`` 0.0.1 without its train shard (SOURCE.txt): the tuning and held_out
shards hold 20 of the 100 demo subjects. Every difference to the CSV cohort on those subjects is
listed in docs/meds.md and asserted here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

from etl import charlson
from etl.errors import InputError
from etl.meds import run_meds_etl
from etl.mimic import EtlOptions, run_etl
from etl.schema import COHORT_COLUMNS, VITAL_COLUMNS

PRESENT = ("tuning", "held_out")
#: Columns the two paths must agree on exactly (everything but the split, which depends on the
#: cohort's size, and anchor_year_group, which MEDS does not carry).
SAME = tuple(c for c in COHORT_COLUMNS if c not in ("split", "anchor_year_group", *VITAL_COLUMNS))


@pytest.fixture(scope="session")
def meds_demo_dir(mimic_demo_dir) -> Path:
    d = mimic_demo_dir.parent / "mimic-iv-demo-extra" / "meds-official"
    assert (d / "metadata" / "subject_splits.parquet").is_file(), f"MEDS demo not found at {d}"
    return d


@pytest.fixture(scope="module")
def both(meds_demo_dir, mimic_demo_dir, tmp_path_factory):
    """Both paths with the same options; the CSV cohort restricted to the MEDS subjects."""
    base = tmp_path_factory.mktemp("meds")
    opts = EtlOptions(min_center_stays=1, seed=3)
    rep_m = run_meds_etl(meds_demo_dir, base / "meds", opts, splits=PRESENT)
    rep_c = run_etl(mimic_demo_dir, base / "csv", opts)
    m = pl.read_parquet(base / "meds" / "cohort.parquet")
    c = pl.read_parquet(base / "csv" / "cohort.parquet")
    subjects = pl.read_parquet(meds_demo_dir / "data" / "*" / "*.parquet", columns=["subject_id"])["subject_id"].unique()
    return m, c.filter(pl.col("subject_id").is_in(subjects.implode())), rep_m, rep_c, subjects


def test_same_stays_labels_and_fields_as_the_csv_path(both, mimic_demo_dir):
    m, c, rep_m, _, subjects = both
    assert subjects.len() == 20
    assert m.columns == list(COHORT_COLUMNS)
    assert m.height == c.height == 27
    assert m["stay_id"].to_list() == c["stay_id"].to_list()  # both sorted by stay_id
    j = m.join(c, on="stay_id", suffix="_csv")
    for col in SAME:
        if col == "stay_id":
            continue
        assert (j[col] == j[f"{col}_csv"]).all(), col
    # independent of the ETL: the CSV icustays of the 20 subjects are the MEDS ICU stays
    icu = pl.read_csv(mimic_demo_dir / "icu" / "icustays.csv.gz", columns=["subject_id", "stay_id"])
    assert icu.filter(pl.col("subject_id").is_in(subjects.implode())).height == 27
    assert rep_m["attrition"][1]["stays_in"] == 27
    assert int(m["label"].sum()) == 4
    # the split is the shared tail's, grouped by subject (docs/meds.md: not MEDS's subject_splits)
    assert m.group_by("subject_id").agg(pl.col("split").n_unique())["split"].max() == 1
    assert set(m[charlson.CCI_COLUMNS[0]].unique().to_list()) <= {0, 1}


def test_label_rule_holds_on_the_csv_admissions(mimic_demo_dir):
    """MEDS keeps the discharge location, not hospital_expire_flag: the flag is 1 exactly when
    the location is DIED (all 275 demo admissions), so HOSPITAL_DISCHARGE//DIED is the label."""
    adm = pl.read_csv(mimic_demo_dir / "hosp" / "admissions.csv.gz",
                      columns=["hospital_expire_flag", "discharge_location"])
    died = (adm["discharge_location"] == "DIED").fill_null(False).cast(pl.Int64)
    assert adm.height == 275
    assert (died == adm["hospital_expire_flag"]).all()


def test_vital_aggregates_agree_with_the_csv_path(both):
    m, c, *_ = both
    j = m.join(c, on="stay_id", suffix="_csv")
    n_values = 0
    for col in VITAL_COLUMNS:
        a = j[col].to_numpy().astype(float)
        b = j[f"{col}_csv"].to_numpy().astype(float)
        assert np.array_equal(np.isnan(a), np.isnan(b)), col
        assert np.allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=0, atol=1e-6), col
        n_values += int((~np.isnan(a)).sum())
    assert n_values > 27 * 18  # nearly every stay charts every vital


def test_float32_values_are_read_through_their_decimal_text():
    """numeric_value is float32 in MEDS: widened directly, 97.8 F would become 97.80000305."""
    con = duckdb.connect()
    from etl.sql import concept_sql

    ev = ("(SELECT 1::BIGINT AS subject_id, TIMESTAMP '2150-01-01 10:00' AS time, "
          "'LAB//223761//°F' AS code, 97.8::FLOAT AS numeric_value, 2::BIGINT AS icustay_id)")
    v = con.sql(concept_sql("meds", "chartevents", events=ev)).fetchall()
    assert v == [(2, v[0][1], 223761, 97.8)]
    assert con.sql("SELECT 97.8::FLOAT::DOUBLE").fetchall()[0][0] != 97.8


def test_only_anchor_year_group_is_lost_and_the_report_has_the_same_form(both):
    m, c, rep_m, rep_c, _ = both
    assert m["anchor_year_group"].null_count() == m.height
    assert c["anchor_year_group"].null_count() == 0
    assert rep_m["partition_statistics"]["cramers_v_window_vs_anchor_year_group"] is None
    assert rep_m["source"] == "meds" and rep_c["source"] == "mimic"
    assert set(rep_m) == set(rep_c)
    assert rep_m["inputs"]["meds_version"] == "0.3.3"
    assert rep_m["attrition"][0] == {"filter": "subjects in the MEDS splits read (tuning, held_out)",
                                     "unit": "subjects", "subjects_in": 100, "subjects_removed": 80,
                                     "subjects_out": 20}


def test_each_meds_concept_equals_the_csv_table(meds_demo_dir, mimic_demo_dir):
    """Known-value test per etl/sql/meds concept: on the 20 MEDS subjects each rebuilt relation
    equals the raw CSV table (DuckDB EXCEPT both ways, counts asserted)."""
    from etl.sql import concept_sql

    con = duckdb.connect()
    ev = f"read_parquet('{meds_demo_dir}/data/*/*.parquet', union_by_name=true)"
    con.execute(f"CREATE TABLE subj AS SELECT DISTINCT subject_id FROM {ev}")

    def csv(rel: str) -> str:
        return f"(SELECT * FROM read_csv_auto('{mimic_demo_dir / rel}') WHERE subject_id IN (SELECT subject_id FROM subj))"

    def same(a: str, b: str) -> int:
        assert con.sql(f"SELECT count(*) FROM (({a}) EXCEPT ALL ({b}))").fetchall()[0][0] == 0
        assert con.sql(f"SELECT count(*) FROM (({b}) EXCEPT ALL ({a}))").fetchall()[0][0] == 0
        return con.sql(f"SELECT count(*) FROM ({a})").fetchall()[0][0]

    m = {k: f"({concept_sql('meds', k, events=ev)})" for k in
         ("icustays", "admissions", "patients", "chartevents", "diagnoses_icd")}
    assert same(f"SELECT stay_id, subject_id, hadm_id, first_careunit, intime FROM {m['icustays']}",
                f"SELECT stay_id, subject_id, hadm_id, first_careunit, intime FROM {csv('icu/icustays.csv.gz')}") == 27
    cols = "hadm_id, subject_id, admittime, admission_type, admission_location, insurance, race, hospital_expire_flag"
    assert same(f"SELECT {cols} FROM {m['admissions']}", f"SELECT {cols} FROM {csv('hosp/admissions.csv.gz')}") == 37
    assert same(f"SELECT subject_id, gender, anchor_year - anchor_age FROM {m['patients']}",
                f"SELECT subject_id, gender, anchor_year - anchor_age FROM {csv('hosp/patients.csv.gz')}") == 20
    assert same(f"SELECT DISTINCT hadm_id, icd_code, icd_version FROM {m['diagnoses_icd']}",
                "SELECT DISTINCT hadm_id, icd_code, icd_version FROM "
                f"(SELECT d.* FROM read_csv_auto('{mimic_demo_dir / 'hosp/diagnoses_icd.csv.gz'}', "
                "types={'icd_code': 'VARCHAR'}) d WHERE subject_id IN (SELECT subject_id FROM subj))") > 400
    vit = "itemid IN (220045, 220179, 220050, 225309, 220180, 220051, 225310, 220181, 220052, 225312, " \
          "220210, 224690, 220277, 223761, 223762) AND valuenum IS NOT NULL"
    con.execute(f"CREATE TABLE mv AS SELECT stay_id, charttime, itemid, valuenum FROM {m['chartevents']} WHERE {vit}")
    con.execute(f"CREATE TABLE cv AS SELECT stay_id, charttime, itemid, valuenum FROM {csv('icu/chartevents.csv.gz')} "
                f"WHERE {vit}")
    # the same vital events (time, item, value) ...
    assert same("SELECT charttime, itemid, valuenum FROM mv", "SELECT charttime, itemid, valuenum FROM cv") > 9000
    # ... but 16 sit in another stay: the shared CSV chartevents is rebuilt from this MEDS release
    # with stay_id = the nearest stay (its PROVENANCE.md), MEDS keeps the published icustay_id.
    # All 16 lie outside [intime, intime + 24 h] of both stays (no effect on the default window)
    # and inside the 6 h before the CSV stay's intime (the CSV path's -6 h window only).
    con.execute("CREATE TABLE moved AS SELECT a.stay_id AS meds_stay, b.stay_id AS csv_stay, a.charttime "
                "FROM ((SELECT * FROM mv) EXCEPT ALL (SELECT * FROM cv)) a "
                "JOIN ((SELECT * FROM cv) EXCEPT ALL (SELECT * FROM mv)) b USING (charttime, itemid, valuenum)")
    icu = f"read_csv_auto('{mimic_demo_dir / 'icu/icustays.csv.gz'}')"
    n, in_day, before = con.sql(
        "SELECT count(*), "
        "count(*) FILTER (WHERE mv.charttime BETWEEN i.intime AND i.intime + INTERVAL 24 HOUR "
        "                 OR mv.charttime BETWEEN j.intime AND j.intime + INTERVAL 24 HOUR), "
        "count(*) FILTER (WHERE mv.charttime >= j.intime - INTERVAL 6 HOUR AND mv.charttime < j.intime) "
        f"FROM moved mv JOIN {icu} i ON i.stay_id = mv.meds_stay JOIN {icu} j ON j.stay_id = mv.csv_stay").fetchall()[0]
    assert (n, in_day, before) == (16, 0, 16)
    assert con.sql("SELECT count(DISTINCT csv_stay) FROM moved").fetchall()[0][0] == 2


# ---- bad input: one line naming the file, nothing written ----------------------------------------

def _copy(meds_demo_dir: Path, dst: Path, shard_sql: str | None = None) -> Path:
    """A one-split (tuning) copy of the MEDS demo; ``shard_sql`` rewrites its shard."""
    (dst / "metadata").mkdir(parents=True)
    (dst / "data" / "tuning").mkdir(parents=True)
    for f in ("dataset.json", "codes.parquet"):
        shutil.copy(meds_demo_dir / "metadata" / f, dst / "metadata" / f)
    con = duckdb.connect()
    src = meds_demo_dir / "metadata" / "subject_splits.parquet"
    con.execute(f"COPY (SELECT * FROM '{src}' WHERE split = 'tuning') TO '{dst / 'metadata' / 'subject_splits.parquet'}'")
    shard = meds_demo_dir / "data" / "tuning" / "0.parquet"
    sql = (shard_sql or "SELECT * FROM shard").replace("shard", f"'{shard}'")
    con.execute(f"COPY ({sql}) TO '{dst / 'data' / 'tuning' / '0.parquet'}'")
    return dst


def _refused(src: Path, out: Path, match: str, **kw) -> None:
    out.mkdir()
    (out / "keep.txt").write_text("old")
    with pytest.raises(InputError, match=match):
        run_meds_etl(src, out, EtlOptions(min_center_stays=1), **kw)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp")]


def test_missing_shard_names_the_file(meds_demo_dir, tmp_path):
    _refused(meds_demo_dir, tmp_path / "o", r"missing shard .*data/train/\*\.parquet.*80 subjects")


def test_wrong_column_type_names_file_and_column(meds_demo_dir, tmp_path):
    src = _copy(meds_demo_dir, tmp_path / "m", "SELECT * REPLACE (epoch(time)::BIGINT AS time) FROM shard")
    _refused(src, tmp_path / "o", r"data/tuning/0\.parquet: column 'time' is stored as BIGINT")


def test_split_subject_ids_that_are_not_integers_name_the_file_and_column(meds_demo_dir, tmp_path):
    src = _copy(meds_demo_dir, tmp_path / "m")
    duckdb.execute(f"COPY (SELECT 'a' || subject_id::VARCHAR AS subject_id, split FROM "
                   f"'{meds_demo_dir / 'metadata' / 'subject_splits.parquet'}' WHERE split = 'tuning') "
                   f"TO '{src / 'metadata' / 'subject_splits.parquet'}'")
    _refused(src, tmp_path / "o", r"metadata/subject_splits\.parquet: column 'subject_id' holds values that are not "
                                  r"BIGINT \(ConversionException\)$")


def test_no_icu_events(meds_demo_dir, tmp_path):
    src = _copy(meds_demo_dir, tmp_path / "m", "SELECT * FROM shard WHERE NOT starts_with(code, 'ICU_')")
    _refused(src, tmp_path / "o", r"data/\{tuning\}/\*\.parquet: no ICU events")


def test_missing_stay_column_and_derived_file_without_metadata(meds_demo_dir, tmp_path):
    src = _copy(meds_demo_dir, tmp_path / "m", "SELECT * EXCLUDE (icustay_id) FROM shard")
    _refused(src, tmp_path / "o", r"data/tuning/0\.parquet: missing column 'icustay_id'")
    derived = meds_demo_dir.parent / "meds-quickstart-derived"
    _refused(derived, tmp_path / "o2", r"missing .*metadata/dataset\.json")


def test_conflicting_icu_admissions_and_bad_options(meds_demo_dir, tmp_path):
    src = _copy(meds_demo_dir, tmp_path / "m",
                "SELECT * FROM shard UNION ALL SELECT * REPLACE (time + INTERVAL 1 HOUR AS time) FROM shard "
                "WHERE starts_with(code, 'ICU_ADMISSION//')")
    _refused(src, tmp_path / "o", r"conflicting ICU_ADMISSION events: 1\d* repeat a value of 'stay_id'")
    _refused(meds_demo_dir, tmp_path / "o2", r"split 'train2' is not in", splits=("train2",))
    with pytest.raises(InputError, match="careunit-era does not apply to --source meds"):
        run_meds_etl(meds_demo_dir, tmp_path / "o3", EtlOptions(partition="careunit-era"), splits=PRESENT)


def test_cli_one_line_error_and_success(meds_demo_dir, tmp_path, capsys):
    """The console entry point in-process (cli.app.main, as the ``abps`` script runs it)."""
    from cli.app import main

    with pytest.raises(SystemExit) as exc:
        main(["etl", "--source", "meds", "--data-dir", str(meds_demo_dir), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.strip().count("\n") == 0 and err.startswith("error: missing shard") and "Traceback" not in err
    assert not (tmp_path / "o").exists()
    main(["etl", "--source", "meds", "--data-dir", str(meds_demo_dir), "--meds-splits", "tuning,held_out",
          "--min-center-stays", "1", "--out", str(tmp_path / "o")])
    assert "cohort: 27 stays" in capsys.readouterr().out
    rep = json.loads((tmp_path / "o" / "cohort_report.json").read_text())
    assert rep["stays"] == 27 and rep["source"] == "meds"
    with pytest.raises(SystemExit):
        main(["etl", "--data-dir", str(meds_demo_dir), "--meds-splits", "tuning", "--out", str(tmp_path / "p")])
    assert "--meds-splits does not apply to --source mimic" in capsys.readouterr().err

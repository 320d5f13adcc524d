"""`abps etl --source eicu` on the real eICU demo, checked against independent Polars queries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from etl import charlson
from etl.eicu import run_eicu_etl
from etl.mimic import EtlOptions

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def eicu_out(eicu_demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("eicu") / "cohort"
    rep = run_eicu_etl(eicu_demo_dir, out, EtlOptions(min_center_stays=10, seed=1))
    return out, rep


@pytest.fixture(scope="module")
def patient(eicu_demo_dir):
    return pl.read_csv(eicu_demo_dir / "patient.csv.gz", infer_schema_length=0)


def test_counts_and_labels(eicu_out, patient):
    out, rep = eicu_out
    cohort = pl.read_parquet(out / "cohort.parquet")
    p = patient.with_columns(
        age=pl.when(pl.col("age") == "> 89").then(pl.lit("90")).otherwise(pl.col("age")).cast(pl.Float64, strict=False),
        stay_id=pl.col("patientunitstayid").cast(pl.Int64),
    ).filter(pl.col("hospitaldischargestatus").is_in(["Alive", "Expired"]) & pl.col("age").is_between(18, 95))
    big = p.group_by("hospitalid").len().filter(pl.col("len") >= 10)["hospitalid"]
    p = p.filter(pl.col("hospitalid").is_in(big.implode()))
    assert cohort.height == p.height
    assert set(cohort["stay_id"]) == set(p["stay_id"])
    assert cohort["center_id"].n_unique() == big.len() == rep["centers"]
    lab = cohort.join(p.select("stay_id", "hospitaldischargestatus", "hospitalid", "age"), on="stay_id")
    assert ((lab["label"] == 1) == (lab["hospitaldischargestatus"] == "Expired")).all()
    assert (lab["center_id"] == ("hosp-" + lab["hospitalid"])).all()
    assert np.allclose(lab["age"].to_numpy(), lab["age_right"].to_numpy())
    assert (lab.filter(pl.col("age") == 90).height) > 0  # "> 89" read as 90
    # 28 stays with empty discharge status are dropped at their own attrition step
    assert rep["attrition"][1]["stays_removed"] == 28


def test_vitals_from_apache_and_aperiodic(eicu_out, eicu_demo_dir):
    cohort = pl.read_parquet(eicu_out[0] / "cohort.parquet")
    aps = pl.read_csv(eicu_demo_dir / "apacheApsVar.csv.gz", infer_schema_length=0).select(
        pl.col("patientunitstayid").cast(pl.Int64).alias("stay_id"),
        pl.col("heartrate").cast(pl.Float64), pl.col("temperature").cast(pl.Float64))
    got = cohort.select("stay_id", "heart_rate_max", "temperature_min").join(aps, on="stay_id")
    hr = got["heartrate"].to_numpy().astype(float)
    valid = (hr > 0) & (hr < 300)
    assert np.allclose(got["heart_rate_max"].to_numpy()[valid], hr[valid])
    assert got.filter(pl.col("heartrate") == -1)["heart_rate_max"].null_count() == got.filter(pl.col("heartrate") == -1).height
    ap = pl.read_csv(eicu_demo_dir / "vitalAperiodic.csv.gz", infer_schema_length=0).with_columns(
        pl.col("patientunitstayid").cast(pl.Int64), pl.col("observationoffset").cast(pl.Int64),
        pl.col("noninvasivesystolic").cast(pl.Float64)).filter(
        pl.col("observationoffset").is_between(0, 1440) & (pl.col("noninvasivesystolic") > 0) & (pl.col("noninvasivesystolic") < 400))
    truth = ap.group_by(pl.col("patientunitstayid").alias("stay_id")).agg(
        pl.col("noninvasivesystolic").mean().alias("m"), pl.col("noninvasivesystolic").max().alias("mx"))
    both = cohort.select("stay_id", "sbp_mean", "sbp_max").join(truth, on="stay_id")
    assert both.height > 500
    assert np.allclose(both["sbp_mean"].to_numpy(), both["m"].to_numpy(), atol=1e-6)
    assert np.allclose(both["sbp_max"].to_numpy(), both["mx"].to_numpy())


def test_comorbidities_from_three_sources(eicu_out, eicu_demo_dir):
    cohort = pl.read_parquet(eicu_out[0] / "cohort.parquet")
    ph = pl.read_csv(eicu_demo_dir / "pastHistory.csv.gz", infer_schema_length=0)
    chf = set(ph.filter(pl.col("pasthistorypath").str.contains("/Congestive Heart Failure/", literal=True))
              ["patientunitstayid"].cast(pl.Int64))
    flagged = set(cohort.filter(pl.col("cci_chf") == 1)["stay_id"])
    assert chf & set(cohort["stay_id"]) <= flagged
    # ICD codes: a stay whose diagnosis list holds an ICD-9 CHF code is flagged
    dx = pl.read_csv(eicu_demo_dir / "diagnosis.csv.gz", infer_schema_length=0).filter(pl.col("icd9code").is_not_null())
    rows = dx.filter(pl.col("icd9code").str.starts_with("428."))
    assert rows.height > 0
    ids = set(rows["patientunitstayid"].cast(pl.Int64)) & set(cohort["stay_id"])
    assert ids and ids <= flagged
    # an independent Python pass over the ICD strings, for every stay and flag, is a subset of ours
    per_stay: dict[int, list] = {}
    for sid, codes in dx.select("patientunitstayid", "icd9code").iter_rows():
        toks = [t.strip() for t in codes.split(",") if t.strip()]
        for k, t in enumerate(toks):
            v = 9 if t[0].isdigit() or (t[0] in "VE" and k == 0 and len(toks) > 1) else 10
            per_stay.setdefault(int(sid), []).append((t.replace(".", ""), v))
    ours = {r["stay_id"]: r for r in cohort.select("stay_id", *charlson.CCI_COLUMNS).iter_rows(named=True)}
    for sid, codes in per_stay.items():
        if sid in ours:
            f = charlson.flags_for_codes(codes)
            assert all(ours[sid][c] >= f[c] for c in charlson.CCI_COLUMNS)


def test_centers_have_hospital_attributes_and_report(eicu_out):
    out, _ = eicu_out
    centers = pl.read_parquet(out / "centers.parquet")
    for col in ("region", "numbedscategory", "teachingstatus", "meta_pos_rate", "meta_cci_chf"):
        assert col in centers.columns
    rep = json.loads((out / "cohort_report.json").read_text())
    assert rep["options"]["partition"] == "hospital" and len(rep["per_hospital"]) == centers.height
    assert "## Per hospital" in (out / "cohort_report.md").read_text()


def test_cli_missing_table_is_one_line_error(tmp_path):
    p = subprocess.run([sys.executable, "-c", "from cli.app import main; main()", "etl", "--source", "eicu",
                        "--data-dir", str(tmp_path), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error: missing table patient")
    assert len(p.stderr.strip().splitlines()) == 1

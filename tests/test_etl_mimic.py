"""`abps etl` on the real MIMIC-IV demo, checked against independent Polars computations."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from etl import charlson
from etl.errors import InputError
from etl.mimic import VITAL_COLUMNS, EtlOptions, run_etl

REPO = Path(__file__).resolve().parents[1]
ABPS = [sys.executable, "-c", "from cli.app import main; main()"]
SIX = {
    "Medical Intensive Care Unit (MICU)": "MICU",
    "Medical/Surgical Intensive Care Unit (MICU/SICU)": "MICU/SICU",
    "Cardiac Vascular Intensive Care Unit (CVICU)": "CVICU",
    "Surgical Intensive Care Unit (SICU)": "SICU",
    "Coronary Care Unit (CCU)": "CCU",
    "Trauma SICU (TSICU)": "TSICU",
}


def _read(demo: Path, rel: str) -> pl.DataFrame:
    return pl.read_csv(demo / rel, infer_schema_length=0)  # all Utf8: our own casts below


@pytest.fixture(scope="module")
def demo_tables(mimic_demo_dir):
    icu = _read(mimic_demo_dir, "icu/icustays.csv.gz").with_columns(
        pl.col("stay_id", "subject_id", "hadm_id").cast(pl.Int64),
        pl.col("intime").str.to_datetime("%Y-%m-%d %H:%M:%S"),
    )
    adm = _read(mimic_demo_dir, "hosp/admissions.csv.gz").with_columns(
        pl.col("hadm_id", "subject_id").cast(pl.Int64),
        pl.col("hospital_expire_flag").cast(pl.Int8),
        pl.col("admittime").str.to_datetime("%Y-%m-%d %H:%M:%S"),
    )
    pat = _read(mimic_demo_dir, "hosp/patients.csv.gz").with_columns(
        pl.col("subject_id").cast(pl.Int64), pl.col("anchor_age", "anchor_year").cast(pl.Int64)
    )
    chart = _read(mimic_demo_dir, "icu/chartevents.csv.gz").with_columns(
        pl.col("stay_id").cast(pl.Int64),
        pl.col("itemid").cast(pl.Int64),
        pl.col("valuenum").cast(pl.Float64),
        pl.col("charttime").str.to_datetime("%Y-%m-%d %H:%M:%S"),
    )
    diag = _read(mimic_demo_dir, "hosp/diagnoses_icd.csv.gz").with_columns(
        pl.col("hadm_id").cast(pl.Int64), pl.col("icd_version").cast(pl.Int64)
    )
    return {"icu": icu, "adm": adm, "pat": pat, "chart": chart, "diag": diag}


@pytest.fixture(scope="module")
def demo_out(mimic_demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("etl") / "cohort"
    # The demo has 140 stays: wide windows and no minimum so every unit-window keeps its stays.
    rep = run_etl(mimic_demo_dir, out, EtlOptions(window_years=20, min_center_stays=1, seed=7))
    return out, rep


def _expected_stays(t) -> pl.DataFrame:
    s = (
        t["icu"].join(t["adm"].select("hadm_id", "admittime", "hospital_expire_flag"), on="hadm_id")
        .join(t["pat"], on="subject_id")
        .with_columns(age=pl.col("anchor_age") + pl.col("admittime").dt.year() - pl.col("anchor_year"))
        .filter(pl.col("age").is_between(18, 95) & pl.col("first_careunit").is_in(list(SIX)))
    )
    return s.with_columns(care_unit=pl.col("first_careunit").replace_strict(SIX))


def test_counts_per_unit_and_labels(demo_out, demo_tables):
    out, rep = demo_out
    cohort = pl.read_parquet(out / "cohort.parquet")
    exp = _expected_stays(demo_tables)
    assert cohort.height == exp.height == 136 - 1 + 0 or cohort.height == exp.height
    assert sorted(cohort["stay_id"].to_list()) == sorted(exp["stay_id"].to_list())
    got = dict(cohort.group_by("care_unit").len().iter_rows())
    want = dict(exp.group_by("care_unit").len().iter_rows())
    assert got == want
    assert got == {"CCU": 13, "CVICU": 25, "MICU": 29, "MICU/SICU": 23, "SICU": 29, "TSICU": 16}
    lab = cohort.select("stay_id", "label").join(exp.select("stay_id", "hospital_expire_flag"), on="stay_id")
    assert (lab["label"] == lab["hospital_expire_flag"]).all()
    assert int(cohort["label"].sum()) == int(exp["hospital_expire_flag"].sum()) == 19
    ages = cohort.select("stay_id", "age").join(exp.select("stay_id", "age"), on="stay_id")
    assert np.allclose(ages["age"].to_numpy(), ages["age_right"].to_numpy())
    assert rep["stays"] == cohort.height


def _vital_truth(t, stay_ids, items, lo, hi, hi_incl=False, f2c_items=(), from_h=0.0) -> pl.DataFrame:
    ch = t["chart"].filter(pl.col("itemid").is_in(list(items)) & pl.col("valuenum").is_not_null())
    ok = (pl.col("valuenum") > pl.col("lo")) & ((pl.col("valuenum") < pl.col("hi")) | (pl.lit(hi_incl) & (pl.col("valuenum") == pl.col("hi"))))
    bounds = pl.DataFrame({"itemid": list(items), "lo": [lo[i] for i in items], "hi": [hi[i] for i in items]})
    ch = ch.join(bounds, on="itemid").filter(ok)
    ch = ch.with_columns(
        v=pl.when(pl.col("itemid").is_in(list(f2c_items))).then((pl.col("valuenum") - 32) / 1.8).otherwise(pl.col("valuenum"))
    )
    win = t["icu"].filter(pl.col("stay_id").is_in(stay_ids)).select("stay_id", "intime")
    ch = ch.join(win, on="stay_id").filter(
        (pl.col("charttime") >= pl.col("intime") + pl.duration(minutes=int(from_h * 60)))
        & (pl.col("charttime") <= pl.col("intime") + pl.duration(hours=24))
    )
    per_time = ch.group_by("stay_id", "charttime").agg(pl.col("v").mean())
    return per_time.group_by("stay_id").agg(
        pl.col("v").mean().alias("mean"), pl.col("v").min().alias("min"), pl.col("v").max().alias("max")
    )


@pytest.mark.parametrize(
    "vital,items,lo,hi,incl,f2c",
    [
        ("heart_rate", (220045,), {220045: 0}, {220045: 300}, False, ()),
        ("sbp", (220179, 220050, 225309), dict.fromkeys((220179, 220050, 225309), 0),
         dict.fromkeys((220179, 220050, 225309), 400), False, ()),
        ("spo2", (220277,), {220277: 0}, {220277: 100}, True, ()),
        ("temperature", (223761, 223762), {223761: 70, 223762: 10}, {223761: 120, 223762: 50}, False, (223761,)),
    ],
)
def test_vital_aggregates_match_independent_computation(demo_out, demo_tables, vital, items, lo, hi, incl, f2c):
    out, _ = demo_out
    cohort = pl.read_parquet(out / "cohort.parquet")
    truth = _vital_truth(demo_tables, cohort["stay_id"].to_list(), items, lo, hi, incl, f2c)
    got = cohort.select("stay_id", f"{vital}_mean", f"{vital}_min", f"{vital}_max").join(truth, on="stay_id", how="left")
    assert truth.height > 100  # most demo stays chart this vital
    for agg in ("mean", "min", "max"):
        a = got[f"{vital}_{agg}"].to_numpy().astype(float)
        b = got[agg].to_numpy().astype(float)
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert np.allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=0, atol=1e-6)


def test_mimic_code_window_option_widens_the_window(mimic_demo_dir, demo_tables, tmp_path):
    run_etl(mimic_demo_dir, tmp_path / "c6", EtlOptions(window_years=20, min_center_stays=1, vitals_from_hours=-6))
    cohort = pl.read_parquet(tmp_path / "c6" / "cohort.parquet")
    truth = _vital_truth(demo_tables, cohort["stay_id"].to_list(), (220045,), {220045: 0}, {220045: 300}, from_h=-6)
    got = cohort.select("stay_id", "heart_rate_max").join(truth, on="stay_id")
    assert np.allclose(got["heart_rate_max"].to_numpy(), got["max"].to_numpy())


def test_out_of_range_values_never_reach_an_aggregate(demo_out):
    cohort = pl.read_parquet(demo_out[0] / "cohort.parquet")
    assert cohort["heart_rate_max"].max() < 300 and cohort["heart_rate_min"].min() > 0
    assert cohort["spo2_max"].max() <= 100
    assert 10 < cohort["temperature_min"].min() and cohort["temperature_max"].max() < 50
    assert cohort["resp_rate_max"].max() < 70


def test_charlson_flags_match_python_mapping(demo_out, demo_tables):
    cohort = pl.read_parquet(demo_out[0] / "cohort.parquet")
    codes = demo_tables["diag"].group_by("hadm_id").agg(pl.col("icd_code"), pl.col("icd_version"))
    by_hadm = {r["hadm_id"]: charlson.flags_for_codes(zip(r["icd_code"], r["icd_version"])) for r in codes.iter_rows(named=True)}
    empty = dict.fromkeys(charlson.CCI_COLUMNS, 0)
    for row in cohort.select("hadm_id", *charlson.CCI_COLUMNS).iter_rows(named=True):
        want = by_hadm.get(row["hadm_id"], empty)
        assert {c: row[c] for c in charlson.CCI_COLUMNS} == want
    assert cohort["cci_chf"].sum() > 0 and cohort["cci_renal"].sum() > 0


def test_leakage_free_comorbidities_use_only_earlier_admissions(mimic_demo_dir, demo_tables, tmp_path):
    run_etl(mimic_demo_dir, tmp_path / "lf",
            EtlOptions(window_years=20, min_center_stays=1, comorbidity_source="earlier-admissions"))
    cohort = pl.read_parquet(tmp_path / "lf" / "cohort.parquet")
    adm = demo_tables["adm"].select("subject_id", "hadm_id", "admittime")
    codes = demo_tables["diag"].drop("subject_id").join(adm, on="hadm_id")
    for row in cohort.select("subject_id", "hadm_id", *charlson.CCI_COLUMNS).iter_rows(named=True):
        t_cur = adm.filter(pl.col("hadm_id") == row["hadm_id"])["admittime"][0]
        prior = codes.filter((pl.col("subject_id") == row["subject_id"]) & (pl.col("admittime") < t_cur))
        want = charlson.flags_for_codes(zip(prior["icd_code"], prior["icd_version"]))
        assert {c: row[c] for c in charlson.CCI_COLUMNS} == want
    # first admissions carry no history: strictly fewer flags than the same-admission default
    assert cohort.select(charlson.CCI_COLUMNS).sum().sum_horizontal()[0] > 0


def test_split_grouped_by_subject_and_centers_metadata(demo_out):
    out, _ = demo_out
    cohort = pl.read_parquet(out / "cohort.parquet")
    per_subject = cohort.group_by("subject_id").agg(pl.col("split").n_unique())
    assert (per_subject["split"] == 1).all()
    frac = cohort["split"].value_counts(normalize=True)
    share = dict(zip(frac["split"], frac["proportion"]))
    assert 0.6 < share["train"] < 0.85
    centers = pl.read_parquet(out / "centers.parquet")
    assert set(centers["center_id"]) == set(cohort["center_id"])
    c0 = centers.sort("n_train", descending=True).row(0, named=True)
    tr = cohort.filter((pl.col("center_id") == c0["center_id"]) & (pl.col("split") == "train"))
    assert c0["n_train"] == tr.height
    assert c0["meta_pos_rate"] == pytest.approx(tr["label"].mean())
    assert c0["meta_log_n_train"] == pytest.approx(np.log(tr.height))
    assert c0["meta_year"] == pytest.approx(tr["admit_year"].mean() / 2030)
    assert c0["meta_cci_renal"] == pytest.approx(tr["cci_renal"].mean())
    unit, span = c0["center_id"].split("|")
    assert unit == c0["care_unit"] and span == f"{c0['window_start']}-{c0['window_end']}"
    assert c0["window_end"] - c0["window_start"] == 19 and (c0["window_start"] - 2100) % 20 == 0


def test_report_has_attrition_and_no_identifiers(demo_out):
    out, rep = demo_out
    data = json.loads((out / "cohort_report.json").read_text())
    steps = [r["filter"] for r in data["attrition"]]
    assert steps[0].startswith("ICU stays") and data["attrition"][0]["stays_in"] == 140
    assert data["attrition"][-1]["stays_out"] == data["stays"]
    cohort = pl.read_parquet(out / "cohort.parquet")
    text = (out / "cohort_report.json").read_text() + (out / "cohort_report.md").read_text()
    for ident in ("stay_id", "subject_id", "hadm_id"):
        for v in cohort[ident].to_list():
            assert str(v) not in text
    stats = data["partition_statistics"]
    assert 0 <= stats["cramers_v_window_vs_anchor_year_group"] <= 1
    assert stats["jsd_mortality_across_care_units_nats"] >= 0


def test_same_seed_same_output(mimic_demo_dir, tmp_path):
    a = run_etl(mimic_demo_dir, tmp_path / "a", EtlOptions(window_years=20, min_center_stays=1, seed=3))
    b = run_etl(mimic_demo_dir, tmp_path / "b", EtlOptions(window_years=20, min_center_stays=1, seed=3))
    assert pl.read_parquet(tmp_path / "a" / "cohort.parquet").equals(pl.read_parquet(tmp_path / "b" / "cohort.parquet"))
    assert a["splits"] == b["splits"]


def test_parquet_and_csv_layouts_agree(mimic_demo_dir, tmp_path):
    import duckdb

    pq = tmp_path / "pq"
    for rel in ("hosp/patients", "hosp/admissions", "hosp/diagnoses_icd", "icu/icustays", "icu/chartevents"):
        (pq / rel).parent.mkdir(parents=True, exist_ok=True)
        duckdb.sql(f"COPY (SELECT * FROM read_csv('{mimic_demo_dir / rel}.csv.gz', all_varchar=true)) "
                   f"TO '{pq / rel}.parquet' (FORMAT parquet)")
    run_etl(pq, tmp_path / "o1", EtlOptions(window_years=20, min_center_stays=1))
    run_etl(mimic_demo_dir, tmp_path / "o2", EtlOptions(window_years=20, min_center_stays=1))
    a = pl.read_parquet(tmp_path / "o1" / "cohort.parquet")
    b = pl.read_parquet(tmp_path / "o2" / "cohort.parquet")
    va, vb = a.select(VITAL_COLUMNS).to_numpy(), b.select(VITAL_COLUMNS).to_numpy()
    assert np.array_equal(np.isnan(va), np.isnan(vb))
    assert np.array_equal(np.nan_to_num(va), np.nan_to_num(vb))
    assert a["label"].equals(b["label"])


# ---------------------------------------------------------------- bad input through the CLI


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ABPS, *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def _copy_demo(src: Path, dst: Path) -> Path:
    for rel in ("hosp/patients", "hosp/admissions", "hosp/diagnoses_icd", "icu/icustays", "icu/chartevents"):
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / f"{rel}.csv.gz", dst / f"{rel}.csv.gz")
    return dst


def _assert_one_line_error(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_table_is_one_line_error_and_writes_nothing(mimic_demo_dir, tmp_path):
    src = _copy_demo(mimic_demo_dir, tmp_path / "m")
    (src / "icu" / "chartevents.csv.gz").unlink()
    out = tmp_path / "out"
    p = _run_cli("etl", "--mimic-dir", str(src), "--out", str(out))
    _assert_one_line_error(p, "icu/chartevents")
    assert not out.exists()
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".out.tmp")]


def test_missing_column_names_file_and_column(mimic_demo_dir, tmp_path):
    src = _copy_demo(mimic_demo_dir, tmp_path / "m")
    path = src / "hosp" / "admissions.csv.gz"
    text = gzip.decompress(path.read_bytes()).decode().replace("hospital_expire_flag", "expire_flag", 1)
    path.write_bytes(gzip.compress(text.encode()))
    p = _run_cli("etl", "--mimic-dir", str(src), "--out", str(tmp_path / "out"))
    _assert_one_line_error(p, "admissions.csv.gz", "hospital_expire_flag")


def test_corrupt_gzip_keeps_previous_output(mimic_demo_dir, tmp_path):
    out = tmp_path / "out"
    run_etl(mimic_demo_dir, out, EtlOptions(window_years=20, min_center_stays=1))
    before = (out / "cohort.parquet").read_bytes()
    src = _copy_demo(mimic_demo_dir, tmp_path / "m")
    path = src / "icu" / "chartevents.csv.gz"
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2] + b"\x00garbage" * 100 + raw[len(raw) // 2 + 800:])
    p = _run_cli("etl", "--mimic-dir", str(src), "--out", str(out), "--window-years", "20", "--min-center-stays", "1")
    _assert_one_line_error(p, "chartevents.csv.gz")
    assert (out / "cohort.parquet").read_bytes() == before


def test_empty_cohort_after_filter_names_the_filter(mimic_demo_dir, tmp_path):
    p = _run_cli("etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(tmp_path / "o"))
    _assert_one_line_error(p, "--min-center-stays")  # default 50 is more than any demo center holds
    p = _run_cli("etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(tmp_path / "o"), "--min-age", "99", "--max-age", "120")
    _assert_one_line_error(p, "empty cohort")
    assert not (tmp_path / "o").exists()


def test_unknown_option_values(mimic_demo_dir, tmp_path):
    p = _run_cli("etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(tmp_path / "o"), "--partition", "bogus")
    _assert_one_line_error(p, "--partition", "bogus")
    p = _run_cli("etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(tmp_path / "o"), "--care-units", "MICU,XYZ")
    _assert_one_line_error(p, "XYZ")
    p = _run_cli("etl", "--mimic-dir", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    _assert_one_line_error(p, "not a directory")


def test_input_error_is_raised_in_process(mimic_demo_dir, tmp_path):
    with pytest.raises(InputError, match="comorbidity"):
        run_etl(mimic_demo_dir, tmp_path / "x", EtlOptions(comorbidity_source="future"))

"""`abps etl --task` on the real MIMIC-IV and eICU demos: each task's label, stay by stay, equals
an independent Polars computation from the raw files; the default task's outputs are unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from etl.eicu import run_eicu_etl
from etl.errors import InputError
from etl.mimic import EtlOptions, run_etl
from etl.tasks import TASKS, get_task

REPO = Path(__file__).resolve().parents[1]
NEW_TASKS = ("icu-mortality", "los-3", "los-7", "decompensation")
TS = "%Y-%m-%d %H:%M:%S"


def _read(path: Path) -> pl.DataFrame:
    return pl.read_csv(path, infer_schema_length=0)  # all Utf8: our own casts below


@pytest.fixture(scope="module")
def mimic_truth(mimic_demo_dir) -> pl.DataFrame:
    """stay_id -> label of each new task, from icustays / admissions / patients with Polars."""
    icu = _read(mimic_demo_dir / "icu/icustays.csv.gz").with_columns(
        pl.col("stay_id", "subject_id", "hadm_id").cast(pl.Int64), pl.col("los").cast(pl.Float64),
        pl.col("intime", "outtime").str.to_datetime(TS))
    adm = _read(mimic_demo_dir / "hosp/admissions.csv.gz").select(
        pl.col("hadm_id").cast(pl.Int64), pl.col("deathtime").str.to_datetime(TS),
        pl.col("hospital_expire_flag").cast(pl.Int8))
    pat = _read(mimic_demo_dir / "hosp/patients.csv.gz").select(
        pl.col("subject_id").cast(pl.Int64), pl.col("dod").str.to_date("%Y-%m-%d"))
    t = icu.join(adm, on="hadm_id").join(pat, on="subject_id")
    by_deathtime = (t["deathtime"] >= t["intime"]) & (t["deathtime"] <= t["outtime"])
    by_dod = (t["dod"] >= t["intime"].dt.date()) & (t["dod"] <= t["outtime"].dt.date())
    icu_mort = [int(dt if d is not None else (dd if o is not None else False) or False)
                for d, dt, o, dd in zip(t["deathtime"], by_deathtime, t["dod"], by_dod)]
    # decompensation (Harutyunyan et al. 2019 at t = 24 h): hours lived and hours in the ICU
    lived = (pl.col("deathtime") - pl.col("intime")).dt.total_minutes() / 60
    in_icu = (pl.col("outtime") - pl.col("intime")).dt.total_minutes() / 60
    decomp = (pl.when(in_icu.is_null() | (in_icu < 24) | (lived < 24) | ((pl.col("hospital_expire_flag") == 1) & lived.is_null()))
              .then(None).when(pl.col("hospital_expire_flag") == 1).then(lived < 48).otherwise(False))
    return t.select("stay_id", pl.Series("icu-mortality", icu_mort, dtype=pl.Int8),
                    (pl.col("los") > 3).cast(pl.Int8).alias("los-3"), (pl.col("los") > 7).cast(pl.Int8).alias("los-7"),
                    decomp.cast(pl.Int8).alias("decompensation"))


@pytest.fixture(scope="module")
def eicu_truth(eicu_demo_dir) -> pl.DataFrame:
    p = _read(eicu_demo_dir / "patient.csv.gz").select(
        pl.col("patientunitstayid").cast(pl.Int64).alias("stay_id"), "unitdischargestatus", "hospitalid",
        "hospitaldischargestatus", pl.col("unitdischargeoffset", "hospitaldischargeoffset").cast(pl.Int64),
        pl.when(pl.col("age") == "> 89").then(pl.lit("90")).otherwise(pl.col("age"))
        .cast(pl.Float64, strict=False).alias("age"),
        (pl.col("unitdischargeoffset").cast(pl.Float64) / 1440).alias("los"))
    death = (pl.when(pl.col("unitdischargestatus") == "Expired").then(pl.col("unitdischargeoffset"))
             .when(pl.col("hospitaldischargestatus") == "Expired").then(pl.col("hospitaldischargeoffset")))
    decomp = (pl.when(pl.col("unitdischargeoffset").is_null() | (pl.col("unitdischargeoffset") < 1440) | (death < 1440)).then(None)
              .when(death.is_not_null()).then(death < 2880)
              .when(pl.col("hospitaldischargestatus") == "Alive").then(False))
    return p.select(
        "stay_id", "hospitalid", "age", decomp.cast(pl.Int8).alias("decompensation"),
        pl.when(pl.col("unitdischargestatus") == "Expired").then(1)
        .when(pl.col("unitdischargestatus") == "Alive").then(0).cast(pl.Int8).alias("icu-mortality"),
        (pl.col("los") > 3).cast(pl.Int8).alias("los-3"), (pl.col("los") > 7).cast(pl.Int8).alias("los-7"))


def _run(source: str, demo: Path, out: Path, task: str) -> dict:
    if source == "mimic":
        return run_etl(demo, out, EtlOptions(window_years=20, min_center_stays=1, seed=7, task=task))
    return run_eicu_etl(demo, out, EtlOptions(min_center_stays=10, seed=1, task=task))


@pytest.fixture(scope="module")
def runs(mimic_demo_dir, eicu_demo_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("tasks")
    out = {}
    for source, demo in (("mimic", mimic_demo_dir), ("eicu", eicu_demo_dir)):
        for task in ("in-hospital-mortality",) + NEW_TASKS:
            d = base / f"{source}-{task}"
            out[source, task] = (d, _run(source, demo, d, task))
    return out


@pytest.mark.parametrize("source", ["mimic", "eicu"])
@pytest.mark.parametrize("task", NEW_TASKS)
def test_task_label_matches_raw_files(runs, mimic_truth, eicu_truth, source, task):
    out, rep = runs[source, task]
    cohort = pl.read_parquet(out / "cohort.parquet")
    truth = (mimic_truth if source == "mimic" else eicu_truth).select("stay_id", pl.col(task).alias("truth"))
    got = cohort.join(truth, on="stay_id", how="left")
    assert got["truth"].null_count() == 0
    assert (got["label"] == got["truth"]).all()
    # same stays as the default task, less those whose task label is unknown
    base = pl.read_parquet(runs[source, "in-hospital-mortality"][0] / "cohort.parquet")
    unknown = set(truth.filter(pl.col("truth").is_null())["stay_id"])
    if source == "mimic":  # every demo stay fills the default cohort
        assert set(cohort["stay_id"]) == set(base["stay_id"]) - unknown
    else:  # eICU: known task label, age 18-95, hospitals keeping >= 10 such stays
        keep = eicu_truth.filter(pl.col(task).is_not_null() & pl.col("age").is_between(18, 95))
        big = keep.group_by("hospitalid").len().filter(pl.col("len") >= 10)["hospitalid"]
        assert set(cohort["stay_id"]) == set(keep.filter(pl.col("hospitalid").is_in(big.implode()))["stay_id"])
    # features do not depend on the task
    cols = [c for c in base.columns if c not in ("label", "split")]
    both = base.select(cols).join(cohort.select(cols), on="stay_id", how="inner")
    assert both.height >= 0.95 * min(base.height, cohort.height)
    assert both.select(cols).equals(cohort.select(cols).filter(pl.col("stay_id").is_in(both["stay_id"].implode())))
    # the report: task, overall rate, rate per care unit and the split stratified on this label
    assert rep["task"] == task and rep["options"]["task"] == task
    assert rep["label_rate"] == pytest.approx(float(got["truth"].mean()))
    per_unit = got.group_by("care_unit").agg(pl.len().alias("stays"), pl.col("truth").sum().alias("positives"))
    want = {r["care_unit"]: (r["stays"], r["positives"]) for r in per_unit.to_dicts()}
    assert {r["care_unit"]: (r["stays"], r["positives"]) for r in rep["per_care_unit"]} == want
    for r in rep["per_care_unit"]:
        assert r["label_rate"] == pytest.approx(r["positives"] / r["stays"])
    key = "per_window" if source == "mimic" else "per_hospital"
    assert sum(r["positives"] for r in rep[key]) == int(got["truth"].sum())
    assert f"Task: `{task}`" in (out / "cohort_report.md").read_text()


def test_known_label_rates_on_the_demos(runs):
    """Figures of docs/tasks.md (MIMIC-IV demo: 135 stays of the six units; eICU demo: hospitals
    with >= 10 stays)."""
    rates = {k: (rep["stays"], round(rep["label_rate"], 4)) for k, (_, rep) in runs.items()}
    assert rates["mimic", "icu-mortality"] == (135, 0.0815)
    assert rates["mimic", "los-3"] == (135, 0.3778)
    assert rates["mimic", "los-7"] == (135, 0.1333)
    assert rates["eicu", "icu-mortality"] == (2492, 0.0498)
    assert rates["eicu", "los-3"] == (2494, 0.2189)
    assert rates["eicu", "los-7"] == (2494, 0.0581)
    assert rates["mimic", "decompensation"] == (113, 0.0088)
    assert rates["eicu", "decompensation"] == (740, 0.0122)


def test_default_task_recorded_and_split_stratified(runs):
    for source in ("mimic", "eicu"):
        out, rep = runs[source, "in-hospital-mortality"]
        assert rep["task"] == "in-hospital-mortality"
        c = pl.read_parquet(runs[source, "los-3"][0] / "cohort.parquet")
        rates = c.group_by("split").agg(pl.col("label").cast(pl.Float64).mean())["label"]
        assert float(rates.max() - rates.min()) < 0.12  # stratified on the task's label


def test_unknown_task_and_source_without_it_are_refused(mimic_demo_dir, tmp_path):
    with pytest.raises(InputError, match="unknown --task 'los-5'"):
        run_etl(mimic_demo_dir, tmp_path / "x", EtlOptions(task="los-5"))
    with pytest.raises(InputError, match="--task los-3 is not defined for --source meds"):
        EtlOptions(task="los-3").validate("meds")
    assert get_task("in-hospital-mortality", "meds") is TASKS["in-hospital-mortality"]
    assert not (tmp_path / "x").exists()


def test_missing_task_column_names_file_and_column(mimic_demo_dir, tmp_path):
    import shutil

    demo = tmp_path / "demo"
    shutil.copytree(mimic_demo_dir, demo)
    icu = pl.read_csv(demo / "icu/icustays.csv.gz", infer_schema_length=0).drop("los")
    (demo / "icu/icustays.csv.gz").unlink()
    icu.write_csv(demo / "icu/icustays.csv")
    run_etl(demo, tmp_path / "ok", EtlOptions(window_years=20, min_center_stays=1))  # the default needs no los
    with pytest.raises(InputError, match=r"icustays.csv: missing column 'los'"):
        run_etl(demo, tmp_path / "los", EtlOptions(window_years=20, min_center_stays=1, task="los-3"))


def test_cli_task_option(mimic_demo_dir, tmp_path):
    cmd = [sys.executable, "-c", "from cli.app import main; main()", "etl", "--mimic-dir", str(mimic_demo_dir),
           "--out", str(tmp_path / "o"), "--window-years", "20", "--min-center-stays", "1", "--task", "los-7"]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "los-7 rate 0.133" in p.stdout
    p = subprocess.run(cmd[:-1] + ["los-9"], cwd=REPO, capture_output=True, text=True)
    assert p.returncode != 0 and "unknown --task 'los-9'" in p.stderr

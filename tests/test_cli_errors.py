"""Bad input anywhere in the CLI: one `error:` line, exit 2, no traceback, nothing lost."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import mlflow

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from cli.app import main; main()"]


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "ABPS_STATE": os.environ["ABPS_STATE"]})


def one_line_error(p: subprocess.CompletedProcess, *needles: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr[-800:])
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("args,needle", [
    (("train", "--method", "fedavg", "--cohort", "x", "--rounds", "0"), "--rounds"),
    (("train", "--method", "fedavg", "--cohort", "x", "--seeds", "a"), "--seeds"),
    (("etl", "--bogus"), "--bogus"),
    (("etl", "--out", "o", "--mimic-dir", "m", "--window-years", "abc"), "--window-years"),
    (("nosuchcommand",), "nosuchcommand"),
])
def test_usage_errors_are_one_line_exit_2(args, needle):
    one_line_error(run(*args), needle)


@pytest.fixture(scope="module")
def tiny_cohort(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fp") / "cohort"
    p = run("synth", "fedprox", "--out", str(out), "--centers", "6", "--seed", "1")
    assert p.returncode == 0, p.stderr
    return out


def _copy_mimic(src: Path, dst: Path) -> Path:
    for rel in ("hosp/patients", "hosp/admissions", "hosp/diagnoses_icd", "icu/icustays", "icu/chartevents"):
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / f"{rel}.csv.gz", dst / f"{rel}.csv.gz")
    return dst


def _edit_gz(path: Path, fn) -> None:
    path.write_bytes(gzip.compress(fn(gzip.decompress(path.read_bytes()).decode()).encode()))


def test_etl_rejects_out_file_injection_bad_labels_and_duplicates(mimic_demo_dir, tmp_path):
    wide = ("--window-years", "20", "--min-center-stays", "1")
    (tmp_path / "afile").write_text("keep me")
    one_line_error(run("etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(tmp_path / "afile"), *wide),
                   "not a directory")
    assert (tmp_path / "afile").read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    one_line_error(run("etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(tmp_path / "o"), *wide,
                       "--memory-limit", "2GB'; COPY (SELECT 1) TO 'pwn.csv'; SET memory_limit='2GB"),
                   "--memory-limit")
    one_line_error(run("etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(tmp_path / "o"), *wide,
                       "--threads", "0"), "--threads")
    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    _edit_gz(src / "hosp" / "admissions.csv.gz", lambda t: t.replace(",0\n", ",7\n", 1))
    one_line_error(run("etl", "--mimic-dir", str(src), "--out", str(tmp_path / "o"), *wide),
                   "hospital_expire_flag", "0 or 1")
    src2 = _copy_mimic(mimic_demo_dir, tmp_path / "m2")
    # a repeated subject_id whose rows differ (identical duplicates are collapsed)
    _edit_gz(src2 / "hosp" / "patients.csv.gz",
             lambda t: t + t.splitlines()[1].replace(",M,", ",X,").replace(",F,", ",X,") + "\n")
    one_line_error(run("etl", "--mimic-dir", str(src2), "--out", str(tmp_path / "o"), *wide),
                   "patients.csv.gz", "subject_id", "conflicting duplicates")
    assert not (tmp_path / "o").exists()


def test_train_rejects_bad_cohort_values(tiny_cohort, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ("--method", "fedavg", "--seeds", "1", "--rounds", "1", "--tracking-uri", uri, "--no-progress")
    for name, edit, needle in [
        ("nulllabel", lambda c: c.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(None)
                                               .otherwise(pl.col("label")).alias("label")), "'label'"),
        ("label7", lambda c: c.with_columns(pl.col("label") * 7), "'label'"),
        ("infage", lambda c: c.with_columns(pl.lit(float("inf")).alias("age")), "'age'"),
        ("intcenter", lambda c: c.with_columns(pl.col("center_id").rank("dense").cast(pl.Int64)), "center_id"),
        # a split value the contract lacks is named as such, not as a centers.parquet count mismatch
        ("Train", lambda c: c.with_columns(pl.col("split").replace({"train": "Train"})),
         "column 'split' holds"),
        ("intsplit", lambda c: c.with_columns(pl.col("split").rank("dense")), "column 'split' must be text"),
    ]:
        d = tmp_path / name
        shutil.copytree(tiny_cohort, d)
        edit(pl.read_parquet(d / "cohort.parquet")).write_parquet(d / "cohort.parquet")
        (d / "fedprox_manifest.json").unlink()  # a cohort written by hand: no manifest to hold it to
        one_line_error(run("train", *common, "--cohort", str(d), "--output", str(tmp_path / "r.json")), needle)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_cohort, broken)
    (broken / "cohort.parquet").write_text("not parquet")
    (broken / "fedprox_manifest.json").unlink()
    one_line_error(run("train", *common, "--cohort", str(broken)), "cohort.parquet", "Parquet")
    before = (tiny_cohort / "cohort.parquet").read_bytes()
    one_line_error(run("train", *common, "--cohort", str(tiny_cohort), "--output",
                       str(tiny_cohort / "cohort.parquet")), "overwrite")
    assert (tiny_cohort / "cohort.parquet").read_bytes() == before
    assert not (tmp_path / "r.json").exists()


def test_bad_method_parameter_fails_before_any_mlflow_run(tiny_cohort, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    one_line_error(run("train", "--method", "abps", "--param", "kappa=-2", "--cohort", str(tiny_cohort),
                       "--seeds", "1", "--rounds", "1", "--tracking-uri", uri, "--experiment", "bad",
                       "--no-progress"), "kappa")
    exp = mlflow.MlflowClient(tracking_uri=uri).get_experiment_by_name("bad")
    assert exp is None or not mlflow.MlflowClient(tracking_uri=uri).search_runs([exp.experiment_id])


def test_synth_fedprox_refuses_a_foreign_folder(tiny_cohort, tmp_path):
    other = tmp_path / "etl_out"
    other.mkdir()
    (other / "cohort_report.md").write_text("an earlier ETL report")
    one_line_error(run("synth", "fedprox", "--out", str(other), "--centers", "3"), "not empty")
    assert (other / "cohort_report.md").read_text() == "an earlier ETL report"
    # an earlier fedprox output may be replaced
    assert run("synth", "fedprox", "--out", str(tiny_cohort), "--centers", "6", "--seed", "1").returncode == 0


def test_undefined_auroc_is_null_in_strict_json(tiny_cohort, tmp_path):
    from federation.run.tracking import finite

    doc = finite({"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": 2}})
    assert json.loads(json.dumps(doc, allow_nan=False)) == {"a": None, "b": [1.0, None], "c": {"d": 2}}


def test_seeds_yaml_and_sweep_address_errors(tiny_cohort, tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    one_line_error(run("train", "--method", "abps", "--cohort", str(tiny_cohort), "--seeds", "-5", "--rounds", "1",
                       "--tracking-uri", uri), "--seeds")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    one_line_error(run("sweep", "--config", str(binary), "--cohort", str(tiny_cohort), "--tracking-uri", uri),
                   "UTF-8")
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: s\nseeds: [1]\nrounds: 1\nmethods: [fedavg]\n")
    one_line_error(run("sweep", "--config", str(sweep), "--cohort", str(tiny_cohort), "--tracking-uri", uri,
                       "--address", "127.0.0.1:1"), "--address")
    one_line_error(run("sweep", "--config", str(sweep), "--cohort", str(tiny_cohort), "--tracking-uri", uri,
                       "--executor", "ray", "--address", "127.0.0.1:1"), "cannot reach")
    with socket.socket() as silent:  # accepts connections and never answers: not a Ray cluster
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        one_line_error(run("sweep", "--config", str(sweep), "--cohort", str(tiny_cohort), "--tracking-uri", uri,
                           "--executor", "ray", "--address", f"ray://127.0.0.1:{port}"),
                       "is not a Ray cluster (no gRPC handshake within 5 s)")
    bad = tmp_path / "badcohort"
    bad.mkdir()
    (bad / "cohort.parquet").write_text("junk")
    (bad / "centers.parquet").write_text("junk")
    one_line_error(run("sweep", "--config", str(sweep), "--cohort", str(bad), "--tracking-uri", uri), "Parquet")
    exp = mlflow.MlflowClient(tracking_uri=uri).get_experiment_by_name("s")
    assert exp is None or not mlflow.MlflowClient(tracking_uri=uri).search_runs([exp.experiment_id])


def test_cifar_loader_refuses_code_in_pickles(tmp_path):
    import os
    import pickle

    from etl.errors import InputError
    from etl.images import load_cifar10

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'PWNED'}",))

    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (tmp_path / name).write_bytes(pickle.dumps({b"data": Evil(), b"labels": [0]}))
    with pytest.raises(InputError, match="not a CIFAR-10 python batch"):
        load_cifar10(tmp_path)
    assert not (tmp_path / "PWNED").exists()


def _train_options():
    """Every option of `abps train`, read from the typer app itself (a new option is covered here
    without anyone listing it)."""
    import typer.main

    from cli.app import _register, app

    _register()
    cmd = typer.main.get_command(app).commands["train"]
    return [p for p in cmd.params if getattr(p, "opts", None) and p.name != "help"]


def _unapplied_by_benchmarks():
    from cli.train_cmd import _BENCHMARK_OPTIONS

    return [p.name for p in _train_options() if p.name not in _BENCHMARK_OPTIONS]


@pytest.mark.parametrize("opt", _unapplied_by_benchmarks())
def test_benchmark_configs_refuse_every_option_they_do_not_apply(opt, tmp_path):
    """`abps train --config <benchmark config>` applies only some options
    (cli.train_cmd._BENCHMARK_OPTIONS); every other option of the command, as the typer app lists
    them, is refused with a one-line error naming it, never dropped."""
    p = next(x for x in _train_options() if x.name == opt)
    flag = max(p.opts, key=len)
    cfg = tmp_path / "bench.yaml"
    cfg.write_text("benchmark: sage\nname: t\n")
    value = [] if getattr(p, "is_flag", False) else ["a=1" if opt == "param" else "1"]
    one_line_error(run("train", "--config", str(cfg), flag, *value, "--rounds", "1",
                       "--output", str(tmp_path / "r.json")), flag, "not used by a sage benchmark config")
    assert not (tmp_path / "r.json").exists()

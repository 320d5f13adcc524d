"""concurrent use of one new MLflow store never crashes and never loses a run.

On main, three ``abps train`` processes started at once on a new ``sqlite:///.../new.db`` raced
on the schema creation: two exited 1 with a SQLAlchemy traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from federation.data.synthetic import write_fedprox_cohort
from federation.run import tracking

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from cli.app import main; main()"]


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    return write_fedprox_cohort(tmp_path_factory.mktemp("trk") / "cohort", n_centers=4, seed=2, mean_size=60.0)


def test_three_parallel_trains_on_a_new_store_all_succeed(cohort, tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/new.db"
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "ABPS_STATE": os.environ["ABPS_STATE"], "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([*CLI, "train", "--method", "fedavg", "--cohort", str(cohort), "--seeds", str(seed),
                               "--rounds", "2", "--no-progress", "--tracking-uri", uri, "--experiment", "par",
                               "--output", str(tmp_path / f"r{seed}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
             for seed in (1, 2, 3)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0 and "Traceback" not in err, err[-1500:]
    client = MlflowClient(uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "par"]  # created once
    runs = client.search_runs([exp.experiment_id], max_results=100)
    kids = [r for r in runs if r.data.tags.get(tracking.KIND_TAG) == tracking.KIND_RUN]
    parents = [r for r in runs if r.data.tags.get(tracking.KIND_TAG) == tracking.KIND_TRAIN]
    assert sorted(int(r.data.tags[tracking.SEED_TAG]) for r in kids) == [1, 2, 3]
    assert len(parents) == 3 and all(r.info.status == "FINISHED" for r in runs)
    assert {r.data.tags["mlflow.parentRunId"] for r in kids} == {r.info.run_id for r in parents}
    assert all("final_auroc_mean" in r.data.metrics for r in kids)


def test_retry_waits_out_a_locked_database_only():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return "ok"

    assert tracking._retry(flaky, first_wait_s=0.001) == "ok" and len(calls) == 3

    def broken():
        calls.append(1)
        raise RuntimeError("no such table: runs")

    calls.clear()
    with pytest.raises(RuntimeError, match="no such table"):
        tracking._retry(broken, first_wait_s=0.001)
    assert len(calls) == 1  # other errors are not retried


def test_tag_names_are_spelled_only_in_tracking():
    """One tag schema: no module but federation/run/tracking.py spells an `abps.*` tag name."""
    import re

    offenders = []
    for p in [*REPO.glob("federation/**/*.py"), *REPO.glob("cli/*.py"), *REPO.glob("abps/**/*.py")]:
        if p.name == "tracking.py" and p.parent.name == "run":
            continue
        for m in re.finditer(r"[\"']abps\.(kind|config_hash|cohort_id|cohort|label|sweep_hash|cell_seconds|executor|engine_step|platform\.)[\"'.]",
                             p.read_text()):
            offenders.append(f"{p.relative_to(REPO)}: {m.group(0)}")
    assert offenders == []


@pytest.mark.parametrize("bench,key", [("sage", "num_threads"), ("vv", "threads")])
def test_threads_option_reaches_the_image_benchmarks(tmp_path, monkeypatch, bench, key):
    from cli.app import main
    from federation.benchmark import BENCHMARKS

    got = {}
    monkeypatch.setattr(BENCHMARKS[bench], "run", lambda cfg, *a, **k: got.update(cfg))
    cfg = tmp_path / "b.yaml"
    cfg.write_text(f"benchmark: {bench}\nname: t\n")
    main(["train", "--config", str(cfg), "--threads", "3", "--output", str(tmp_path / "r.json")])
    assert got[key] == 3


def test_mlflow_logs_no_traceback_once_quieted():
    """MLflow logs the database error it is about to raise with its traceback (a store on a full
    disk printed 40 lines before the command's own one-line error): quiet_mlflow drops records
    that carry an exception, and keeps other errors and warnings."""
    code = ("import logging, mlflow; from federation.run.tracking import quiet_mlflow\n"
            "n = lambda: sum(len(h.filters) for h in logging.getLogger('mlflow').handlers)\n"
            "a = n(); quiet_mlflow(); b = n(); quiet_mlflow(); print(b - a, n() - b)\n"
            "log = logging.getLogger('mlflow.store.db.utils')\n"
            "try:\n    1 / 0\nexcept ZeroDivisionError:\n    log.exception('caught before raising')\n"
            "log.error('an error without a traceback'); log.warning('a warning')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-800:]
    assert "Traceback" not in r.stderr and "caught before raising" not in r.stderr, r.stderr
    assert "an error without a traceback" in r.stderr and "a warning" in r.stderr, r.stderr
    assert r.stdout.split() == ["1", "0"]  # one filter, however often it is called


def test_a_folder_store_is_refused_with_the_way_out_in_one_line(tmp_path, monkeypatch):
    """MLflow 3 refuses ``file:`` stores with advice that runs past the 300 characters a store error
    keeps; the line names the store and the sqlite URI to give instead. MLflow's own opt-out
    (MLFLOW_ALLOW_FILE_STORE) is honoured, and an MLflow that still writes folder stores opens one."""
    from etl.errors import InputError

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    uri = f"file:{tmp_path}/mlruns"
    try:
        tracking.open_client(uri)
    except InputError as err:
        msg = str(err)
        assert "\n" not in msg and msg.startswith(f"MLflow store {uri}: ")
        assert "--tracking-uri sqlite:///" in msg and "MLFLOW_ALLOW_FILE_STORE=true" in msg
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert tracking.open_client(uri).search_experiments(max_results=1) is not None

"""The MLflow UI's compare view works on a sweep: a real `mlflow server` on loopback, queried through its
REST API, shows every cell run with the same param keys, the per-round metrics and the final ones."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
MLFLOW = Path(sys.executable).with_name("mlflow")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(base: str, path: str, **query: str) -> dict:
    url = f"{base}{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _post(base: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture()
def filled_store(tmp_path):
    from federation.data.synthetic import write_fedprox_cohort
    from federation.sweep import SweepSpec, run_sweep

    # large enough that every center's test split holds both classes (a defined headline mean)
    cohort = write_fedprox_cohort(tmp_path / "cohort", n_centers=5, seed=4, mean_size=200.0, shared=0.8)
    db = tmp_path / "ml.db"
    spec = SweepSpec.model_validate({"name": "ui", "seeds": [1, 2], "rounds": 2, "methods": ["fedavg", "abps"]})
    out = run_sweep(spec, CONFIGS, cohort, tracking_uri=f"sqlite:///{db}", progress=False)
    return db, out


def test_mlflow_server_rest_api_lines_up_sweep_runs(filled_store, tmp_path):
    db, out = filled_store
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen([str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{db}", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "mlflow server did not answer within 90 s"
            time.sleep(0.5)

        exp = _get(base, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="ui")["experiment"]
        assert exp["experiment_id"] == out.experiment_id
        found = _post(base, "/api/2.0/mlflow/runs/search",
                      {"experiment_ids": [exp["experiment_id"]], "filter": "tags.`abps.kind` = 'cell'",
                       "max_results": 100})["runs"]
        assert len(found) == 4
        keys = [sorted(p["key"] for p in r["data"]["params"]) for r in found]
        assert all(k == keys[0] for k in keys)  # same param keys: the compare view lines them up
        assert {"method", "seed", "rounds", "params.kappa", "exchange.head_layers"} <= set(keys[0])
        by_id = {c_run: key for key, c_run in out.ran.items()}
        for r in found:
            rid = r["info"]["run_id"]
            assert r["info"]["status"] == "FINISHED"
            tags = {t["key"]: t["value"] for t in r["data"]["tags"]}
            assert tags["mlflow.parentRunId"] == out.parent_run_id
            params = {p["key"]: p["value"] for p in r["data"]["params"]}
            assert params["method"] == tags["method"]
            if tags["method"] == "fedavg":
                assert params["params.kappa"] == "none"
            else:
                assert params["params.kappa"] == "3"
            metrics = {m["key"]: m["value"] for m in r["data"]["metrics"]}
            assert metrics["final_auroc_mean"] == pytest.approx(out.summaries[by_id[rid]]["final_auroc_mean"])
            hist = _get(base, "/api/2.0/mlflow/metrics/get-history", run_id=rid, metric_key="test_auroc_mean")
            assert sorted(int(m["step"]) for m in hist["metrics"]) == [1, 2]
        parent = _get(base, "/api/2.0/mlflow/runs/get", run_id=out.parent_run_id)["run"]
        assert parent["info"]["status"] == "FINISHED"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn workers (our own session)
            proc.wait(timeout=15)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        log.close()
    assert proc.poll() is not None

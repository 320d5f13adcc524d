"""The whole clinical path on small real-format data: synth -> etl (checked against the
generator's ground truth) -> abps train, and the eICU hospital federation -> abps train."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import mlflow
from etl import charlson
from etl.mimic import VITAL_COLUMNS

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from cli.app import main; main()"]


def _abps(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    p = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=600,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "ABPS_STATE": os.environ["ABPS_STATE"]})
    assert p.returncode == 0, p.stderr[-2000:]
    return p


@pytest.fixture(scope="module")
def synth_cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipe")
    _abps("synth", "mimic", "--out", str(root / "raw"), "--stays", "6000", "--seed", "3")
    _abps("etl", "--mimic-dir", str(root / "raw"), "--out", str(root / "cohort"), "--min-center-stays", "20")
    return root


def test_etl_reproduces_the_generators_ground_truth(synth_cohort):
    cohort = pl.read_parquet(synth_cohort / "cohort" / "cohort.parquet")
    truth = pl.read_parquet(synth_cohort / "raw" / "ground_truth.parquet")
    both = cohort.join(truth, on="stay_id", suffix="_t")
    assert both.height == cohort.height > 1000
    assert (both["label"] == both["label_t"]).all()
    assert np.allclose(both["age"].to_numpy(), both["age_t"].to_numpy())
    for c in charlson.CCI_COLUMNS:
        assert (both[c] == both[f"{c}_t"]).all(), c
    for c in VITAL_COLUMNS:
        a, b = both[c].to_numpy().astype(float), both[f"{c}_t"].to_numpy().astype(float)
        assert np.array_equal(np.isnan(a), np.isnan(b)), c
        assert np.allclose(a[~np.isnan(a)], b[~np.isnan(b)], atol=1e-6), c


def test_train_fedavg_and_abps_diversity_on_the_synthetic_cohort(synth_cohort, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cohort = str(synth_cohort / "cohort")
    _abps("train", "--method", "fedavg", "--cohort", cohort, "--seeds", "11", "--rounds", "2",
          "--output", str(tmp_path / "fedavg.json"), "--tracking-uri", uri, "--no-progress", cwd=tmp_path)
    _abps("train", "--method", "abps", "--goal", "diversity", "--cohort", cohort, "--seeds", "11", "--rounds", "4",
          "--output", str(tmp_path / "abps.json"), "--tracking-uri", uri, "--no-progress", cwd=tmp_path)
    fed = json.loads((tmp_path / "fedavg.json").read_text())["seeds"]["11"]
    assert fed["rel_bandwidth"] == pytest.approx(2 / 50)  # 2 of FedAvg's 50 reference rounds
    assert 0.5 < fed["final_auroc_mean"] <= 1.0
    doc = json.loads((tmp_path / "abps.json").read_text())
    assert doc["config"]["params"]["goal"] == "diversity"
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("abps")
    runs = client.search_runs([exp.experiment_id])
    child = [r for r in runs if r.data.params.get("method") == "abps" and "isolation_rate" in r.data.metrics]
    assert child, "ABPS child run with isolation_rate"
    hist = client.get_metric_history(child[0].info.run_id, "isolation_rate")
    partners = client.get_metric_history(child[0].info.run_id, "mean_partners")
    assert len(hist) == 4 and all(0.0 <= m.value <= 1.0 for m in hist)
    assert all(0.0 <= m.value <= 3.0 for m in partners)  # kappa = 3
    # the goal-aware filter ran: each center's 15-dim metadata vector crossed the network once
    n_centers = pl.read_parquet(synth_cohort / "cohort" / "centers.parquet").height
    # plus, once, the federated encoding's aggregates when the centers are small (data.preprocessing auto)
    from federation.data.tensors import FederatedData

    enc = FederatedData.from_cohort(synth_cohort / "cohort").encoding_bytes
    assert doc["seeds"]["11"]["metadata_bytes"] == n_centers * 15 * 4 + enc
    # privacy: no identifier values in params or metrics keys
    ids = set(map(str, pl.read_parquet(synth_cohort / "cohort" / "cohort.parquet")["stay_id"].head(200)))
    for r in runs:
        assert not ids & set(r.data.params.values())


def test_eicu_hospital_federation_trains(eicu_demo_dir, tmp_path):
    _abps("etl", "--source", "eicu", "--data-dir", str(eicu_demo_dir), "--out", str(tmp_path / "eicu"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for method in ("fedavg", "abps"):
        _abps("train", "--method", method, "--cohort", str(tmp_path / "eicu"), "--seeds", "11", "--rounds", "2",
              "--output", str(tmp_path / f"{method}.json"), "--tracking-uri", uri, "--experiment", "eicu",
              "--no-progress", cwd=tmp_path)
        res = json.loads((tmp_path / f"{method}.json").read_text())["seeds"]["11"]
        assert res["rounds_run"] == 2 and res["total_bytes"] > 0
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("eicu")
    assert len(client.search_runs([exp.experiment_id])) >= 4  # 2 parents + 2 children

"""End to end on real Fashion-MNIST: ``cli_run`` learns above chance, writes results, logs to MLflow."""

import json

import numpy as np
import pytest
import torch

from etl.images import FASHION_MNIST_DIR
from federation.gossip import cli_run


@pytest.mark.slow
def test_end_to_end_on_fashion_mnist_learns_and_is_tracked(tmp_path, capsys):
    assert FASHION_MNIST_DIR.is_dir(), "Fashion-MNIST IDX files not installed"
    torch.set_num_threads(1)
    cfg = {"benchmark": "vv", "name": "vv-tiny",
           "simulation": {"n_nodes": 8, "degree": 2, "ticks": 80, "t_acquisition": 1, "eval_every": 40,
                          "test_subset": 200, "target_accuracy": 0.5},
           "arms": [{"name": "variance_corrected", "averaging": "variance_corrected"}],
           "tracking": {"experiment": "vv-test"}}
    uri = f"sqlite:///{tmp_path}/ml/mlflow.db"
    (tmp_path / "ml").mkdir()
    doc = cli_run(cfg, rounds=None, seeds=[0], output=str(tmp_path / "out"), tracking_uri=uri, experiment=None,
                  progress=True)
    shown = capsys.readouterr().out   # the bar: the one run, and its 80 ticks
    assert "vv-tiny runs" in shown and "1/1" in shown and "variance_corrected" in shown and "80/80" in shown
    run = doc["runs"][0]
    acc = np.array(run["curves"]["accuracy"])
    assert acc.shape == (3, 8)
    assert acc[0].mean() < 0.25 and acc[-1].mean() > 0.5  # chance is 0.1
    assert run["summary"]["first_reach"] is not None
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["runs"][0]["summary"] == run["summary"]
    from mlflow.tracking import MlflowClient
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("vv-test")
    runs = client.search_runs([exp.experiment_id])
    child = [r for r in runs if r.data.tags.get("arm") == "variance_corrected"]
    assert len(runs) == 2 and len(child) == 1
    hist = client.get_metric_history(child[0].info.run_id, "acc_mean")
    assert [m.step for m in hist] == [0, 40, 80]

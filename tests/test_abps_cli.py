"""End to end through the CLI: `abps train` with ABPS presets logs isolation, partners, acceptance and
bytes to MLflow and writes results.json; a goal set through --config reaches the filter."""

from __future__ import annotations

import json

import pytest

import cli.train_cmd  # noqa: F401  (registers `abps train`)
from cli.app import main
from federation.data.synthetic import write_fedprox_cohort


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    return write_fedprox_cohort(tmp_path_factory.mktemp("abps_cli") / "cohort", n_centers=24, seed=1, mean_size=200.0)


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    """One MLflow store for the module (creating a SQLite store costs seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('abps_mlflow')}/ml.db"


def _child_runs(uri: str, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    return client, [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def test_train_abps_div_logs_isolation_to_mlflow(cohort, uri, tmp_path):
    out = tmp_path / "results.json"
    main(["train", "--method", "abps-div", "--cohort", str(cohort), "--rounds", "3", "--seeds", "11",
          "--output", str(out), "--tracking-uri", uri, "--experiment", "abps", "--no-progress"])
    doc = json.loads(out.read_text())
    s = doc["seeds"]["11"]
    assert s["rounds_run"] == 3 and s["metadata_bytes"] == 24 * 15 * 4
    assert doc["config"]["params"]["goal"] == "diversity" and doc["config"]["params"]["kappa"] == 1
    client, children = _child_runs(uri, "abps")
    assert len(children) == 1
    run = children[0]
    for key in ("isolation_rate", "mean_partners", "acceptance_rate", "cum_bytes", "rel_bandwidth", "val_auroc_mean"):
        assert key in run.data.metrics, key
    iso = client.get_metric_history(run.info.run_id, "isolation_rate")
    assert sorted(m.step for m in iso) == [1, 2, 3]
    assert max(m.value for m in iso) > 0.0  # intentional rest under the diversity goal
    assert run.data.params["params.goal"] == "diversity"


def test_goal_through_config_on_base_preset(cohort, uri, tmp_path):
    """`abps train --method abps` with ``params: {goal: diversity}`` in --config: the base preset
    (kappa 3) filtered by the diversity goal keeps 25 % of pairs, so centers hold fewer partners."""
    cfg = tmp_path / "div.yaml"
    cfg.write_text("method: abps\nparams:\n  goal: diversity\n")
    out = tmp_path / "results.json"
    main(["train", "--method", "abps", "--config", str(cfg), "--cohort", str(cohort), "--rounds", "2",
          "--output", str(out), "--tracking-uri", uri, "--experiment", "abps-goal", "--no-progress"])
    doc = json.loads(out.read_text())
    assert doc["config"]["params"]["goal"] == "diversity" and doc["config"]["method"] == "abps"
    client, children = _child_runs(uri, "abps-goal")
    mp = client.get_metric_history(children[0].info.run_id, "mean_partners")
    assert all(m.value < 3.0 for m in mp)
    # a bad goal is a one-line config error (exit 2)
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: abps\nparams:\n  goal: novelty\n")
    with pytest.raises(SystemExit) as exc:
        main(["train", "--method", "abps", "--config", str(bad), "--cohort", str(cohort), "--rounds", "1",
              "--output", str(out), "--tracking-uri", uri, "--no-progress"])
    assert exc.value.code == 2

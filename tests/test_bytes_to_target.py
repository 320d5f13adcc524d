"""Bytes to target (ABPS paper Sec. 7): the first round and cumulative bytes at which the mean
validation AUROC reaches a target, by hand on crafted curves; the config key; results.json, MLflow
and the `abps report` table "bytes to target" with ratios to FedAvg, by hand and end to end."""

from __future__ import annotations

import csv
import json
import math

import pytest
from pydantic import ValidationError

from federation.core.config import RunConfig, TargetsConfig, build_config, config_hash
from federation.core.targets import curve_of, first_reach, reach_all, relative_targets

NAN = math.nan


def test_first_reach_by_hand():
    rounds, auroc, cum = [1, 2, 3, 4, 5], [0.60, NAN, 0.72, 0.70, 0.75], [100.0, 200.0, 300.0, 400.0, 500.0]
    assert first_reach(rounds, auroc, cum, 0.60) == (1, 100.0)   # reached exactly (>=)
    assert first_reach(rounds, auroc, cum, 0.65) == (3, 300.0)   # the NaN round 2 reaches nothing
    assert first_reach(rounds, auroc, cum, 0.71) == (3, 300.0)   # the later dip to 0.70 does not matter
    assert first_reach(rounds, auroc, cum, 0.73) == (5, 500.0)
    assert first_reach(rounds, auroc, cum, 0.76) == (None, None)  # never reached: no round, no bytes (not 0)
    with pytest.raises(ValueError, match="curve lengths differ"):
        first_reach(rounds, auroc[:3], cum, 0.7)


def test_curve_counts_every_byte_and_relative_targets_are_the_papers():
    history = [{"round": 1.0, "val_auroc_mean": 0.6, "cum_bytes": 1000.0, "cum_probe_bytes": 10.0,
                "cum_metadata_bytes": 5.0},
               {"round": 2.0, "val_auroc_mean": 0.7, "cum_bytes": 2000.0, "cum_probe_bytes": 20.0,
                "cum_metadata_bytes": 5.0}]
    curve = curve_of(history)
    assert curve == {"round": [1, 2], "val_auroc_mean": [0.6, 0.7], "cum_total_bytes": [1015.0, 2025.0]}
    assert reach_all(curve, [0.65, 0.9]) == [{"auroc": 0.65, "round": 2, "bytes": 2025.0},
                                             {"auroc": 0.9, "round": None, "bytes": None}]
    # the paper's 0.750 / 0.770 / 0.785 are its FedAvg 0.813 less the default offsets
    assert relative_targets(0.813, TargetsConfig().below_fedavg) == pytest.approx([0.750, 0.770, 0.785], abs=1e-12)


def test_targets_config_validates_and_stays_out_of_the_hash():
    assert TargetsConfig().below_fedavg == (0.063, 0.043, 0.028) and TargetsConfig().auroc == ()
    assert TargetsConfig(auroc=(0.8, 0.7, 0.8)).auroc == (0.7, 0.8)
    for bad in ({"auroc": (0.0,)}, {"auroc": (1.2,)}, {"below_fedavg": (-0.1,)}, {"auroc": (0.7501, 0.7502)}):
        with pytest.raises(ValidationError, match="targets"):
            TargetsConfig(**bad)
    a = RunConfig(method="fedavg")
    b = RunConfig(method="fedavg", targets={"auroc": [0.7], "below_fedavg": [0.01]})
    assert config_hash(a, "c") == config_hash(b, "c")  # measurement only: the same trained configuration
    assert config_hash(a, "c") != config_hash(RunConfig(method="fedavg", rounds=7), "c")


# ---- the report table by hand ---------------------------------------------------------------

def _run(client, exp_id, label, method, seed, val, cum, probe=None, final_val=None, params=None, t=1000):
    run = client.create_run(exp_id, start_time=t + seed, tags={"abps.kind": "cell", "abps.label": label,
                                                               "method": method, "seed": str(seed)})
    rid = run.info.run_id
    for i, (v, b) in enumerate(zip(val, cum), start=1):
        client.log_metric(rid, "val_auroc_mean", v, step=i)
        client.log_metric(rid, "cum_bytes", b, step=i)
        if probe is not None:
            client.log_metric(rid, "cum_probe_bytes", probe[i - 1], step=i)
    client.log_metric(rid, "final_auroc_mean", 0.5, step=len(val))
    client.log_metric(rid, "final_val_auroc_mean", val[-1] if final_val is None else final_val, step=len(val))
    for k, v in (params or {}).items():
        client.log_param(rid, k, v)
    client.set_terminated(rid, "FINISHED")


def test_report_bytes_to_target_by_hand(tmp_path):
    from mlflow.tracking import MlflowClient

    from federation import report as rp

    uri = f"sqlite:///{tmp_path}/ml.db"
    client = MlflowClient(uri)
    exp_id = client.create_experiment("btt", artifact_location=(tmp_path / "art").as_uri())
    below = {"targets.below_fedavg": "[0.1, 0.05]", "targets.auroc": "[]"}
    # FedAvg: final val 0.80 and 0.78 -> level 0.79 -> targets 0.69 and 0.74
    _run(client, exp_id, "fedavg", "fedavg", 1, [0.60, 0.70, 0.75, 0.80], [100, 200, 300, 400], params=below)
    _run(client, exp_id, "fedavg", "fedavg", 2, [0.65, 0.695, 0.72, 0.78], [100, 200, 300, 400], params=below)
    # ABPS-X: probe bytes count; seed 2 never reaches 0.74; its runs also ask for the absolute target 0.7
    ax = {**below, "targets.auroc": "[0.7]"}
    _run(client, exp_id, "abps-x", "abps-x", 1, [0.70, 0.72, 0.745, 0.75], [10, 20, 30, 40], [1, 2, 3, 4], params=ax)
    _run(client, exp_id, "abps-x", "abps-x", 2, [0.60, 0.68, 0.70, 0.71], [10, 20, 30, 40], [1, 2, 3, 4], params=ax)
    _run(client, exp_id, "local", "local", 1, [0.50, 0.55, 0.60, 0.62], [0, 0, 0, 0], params=below)

    out = tmp_path / "rep"
    doc = rp.write_report("btt", out, uri)
    sec = doc["sections"]["bytes_to_target"]
    assert sec["fedavg_label"] == "fedavg" and sec["fedavg_level"] == pytest.approx(0.79)
    assert [t for t, _ in sec["targets"]] == pytest.approx([0.69, 0.70, 0.74])
    assert [p for _, p in sec["targets"]] == ["FedAvg − 0.100", "absolute", "FedAvg − 0.050"]
    rows = {(r["label"], round(r["target"], 3)): r for r in sec["rows"]}
    # FedAvg: 0.69 at rounds 2, 2 (200 B); 0.70 at rounds 2, 3; 0.74 at rounds 3, 4
    assert (rows["fedavg", 0.69]["round_mean"], rows["fedavg", 0.69]["bytes_mean"]) == (2.0, 200.0)
    assert (rows["fedavg", 0.7]["round_mean"], rows["fedavg", 0.7]["bytes_mean"]) == (2.5, 250.0)
    assert (rows["fedavg", 0.74]["round_mean"], rows["fedavg", 0.74]["bytes_mean"]) == (3.5, 350.0)
    assert rows["fedavg", 0.74]["x_fedavg"] == 1.0
    # ABPS-X: 0.69 at rounds 1 (11 B) and 3 (33 B); 0.70 at 1 and 3; 0.74 only seed 1, round 3 (33 B)
    r = rows["abps-x", 0.69]
    assert (r["n_reached"], r["round_mean"], r["bytes_mean"]) == (2, 2.0, 22.0)
    assert r["x_fedavg"] == pytest.approx(22.0 / 200.0)
    assert rows["abps-x", 0.7]["x_fedavg"] == pytest.approx(22.0 / 250.0)
    r = rows["abps-x", 0.74]
    assert (r["n_reached"], r["round_mean"], r["bytes_mean"]) == (1, 3.0, 33.0)
    assert r["x_fedavg"] == pytest.approx(33.0 / 350.0)
    # Local never reaches: no round, no bytes, no ratio (never 0)
    assert all(rows["local", t]["n_reached"] == 0 and math.isnan(rows["local", t]["bytes_mean"])
               and math.isnan(rows["local", t]["x_fedavg"]) for t in (0.69, 0.7, 0.74))

    md = (out / "bytes_to_target.md").read_text()
    assert "| Method | Seeds | 0.690 (FedAvg − 0.100) | 0.700 (absolute) | 0.740 (FedAvg − 0.050) |" in md
    assert "| FedAvg | 2 | round 2.0 · 200 B · 1.00× | round 2.5 · 250 B · 1.00× | round 3.5 · 350 B · 1.00× |" in md
    assert "round 3.0 · 33 B · 0.09× (1/2 seeds)" in md
    assert "| Local-only (lower bound) | 1 | not reached (0/1 seeds) | not reached (0/1 seeds) | not reached (0/1 seeds) |" in md
    with open(out / "bytes_to_target.csv") as fh:
        got = [r for r in csv.DictReader(fh) if r["label"] == "local"]
    assert {r["bytes_mean"] for r in got} == {""} and {r["n_reached"] for r in got} == {"0"}
    (rep,) = client.search_runs([exp_id], "tags.`abps.kind` = 'report'")
    assert {"bytes_to_target.md", "bytes_to_target.csv"} <= {a.path for a in client.list_artifacts(rep.info.run_id)}
    assert "## Bytes to target" in (out / "report.md").read_text()


# ---- end to end: results.json, MLflow, report -----------------------------------------------

def test_train_records_targets_in_results_mlflow_and_report(tmp_path):
    from mlflow.tracking import MlflowClient

    from federation import report as rp
    from federation.data.synthetic import write_fedprox_cohort
    from federation.methods import get_method
    from federation.run.runner import run_training

    cohort = write_fedprox_cohort(tmp_path / "cohort", n_centers=5, seed=4, mean_size=200.0, shared=0.8)
    uri = f"sqlite:///{tmp_path}/ml.db"
    docs = {}
    for method in ("fedavg", "local"):
        cfg = build_config(method, get_method(method).default_config,
                           {"targets": {"auroc": [0.01, 0.999]}}, rounds=3)
        run_training(cfg, cohort, [11], output=tmp_path / f"{method}.json", tracking_uri=uri, experiment="e2e",
                     progress=False)
        docs[method] = json.loads((tmp_path / f"{method}.json").read_text())
    seed = docs["fedavg"]["seeds"]["11"]
    curve = seed["curve"]
    assert curve["round"] == [1, 2, 3]
    # FedAvg's traffic: n centers x the full fp32 model per round, nothing else
    per_round = seed["model_bytes"] / 3
    assert curve["cum_total_bytes"] == pytest.approx([per_round, 2 * per_round, 3 * per_round], rel=1e-12)
    assert curve["val_auroc_mean"][-1] == pytest.approx(seed["final_val_auroc_mean"], abs=1e-12)
    assert seed["bytes_to_target"] == [{"auroc": 0.01, "round": 1, "bytes": per_round},
                                       {"auroc": 0.999, "round": None, "bytes": None}]
    assert docs["local"]["seeds"]["11"]["bytes_to_target"][0] == {"auroc": 0.01, "round": 1, "bytes": 0.0}

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("e2e")
    (run,) = client.search_runs([exp.experiment_id], "tags.`abps.kind` = 'run' and tags.method = 'fedavg'")
    m = run.data.metrics
    assert m["rounds_to_auroc_0.010"] == 1.0 and m["bytes_to_auroc_0.010"] == pytest.approx(per_round)
    assert "bytes_to_auroc_0.999" not in m and "rounds_to_auroc_0.999" not in m  # not reached: nothing logged

    doc = rp.write_report("e2e", tmp_path / "rep", uri)
    sec = doc["sections"]["bytes_to_target"]
    level = seed["final_val_auroc_mean"]
    assert sec["fedavg_level"] == pytest.approx(level, abs=1e-12)
    want = sorted([level - 0.063, level - 0.043, level - 0.028, 0.01, 0.999])
    assert [t for t, _ in sec["targets"]] == pytest.approx(want, abs=1e-9)
    for r in sec["rows"]:
        if r["label"] == "fedavg" and r["n_reached"]:
            assert r["x_fedavg"] == 1.0
            hit = next(i for i, a in enumerate(curve["val_auroc_mean"]) if a >= r["target"])
            assert r["bytes_mean"] == pytest.approx(curve["cum_total_bytes"][hit])
    top = next(r for r in sec["rows"] if r["label"] == "fedavg" and r["target"] == pytest.approx(0.999))
    assert top["n_reached"] == 0 and math.isnan(top["x_fedavg"])

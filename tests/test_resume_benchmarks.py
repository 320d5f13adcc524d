"""Round checkpoints of the SAGE and gossip benchmarks (``abps train --config sage | vv --resume``).

* every SAGE selector with state (PENS' discovery counts, PFedDST's recency, an anchor rule's
  generator) and each gossip variant (asynchronous ticks, compression, variance correction, the
  transfer-learning peers) resumed from a checkpoint taken through bytes has the uninterrupted run's
  history and summary, exactly (wall seconds aside);
* a real ``abps train --config`` killed with SIGKILL right after the checkpoint of a seeded round and
  resumed with ``--resume`` writes the uninterrupted run's results.json (wall seconds aside) and
  continues the same MLflow runs, each step logged once with the same values;
* a checkpoint of another config is refused with one line naming the difference.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest
import torch
import yaml

from etl.errors import InputError
from etl.images import FASHION_MNIST_DIR
from federation.benchmark import get_benchmark
from federation.run import checkpoint
from tests.cli_helpers import run_killed, run_main, stop_at_first_checkpoint

pytestmark = pytest.mark.skipif(not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
                                reason="Fashion-MNIST not installed")

#: wall-clock figures: the only ones a resumed run may not share with the uninterrupted one
WALL = ("seconds_", "wall_s", "train_s")


def _no_wall(obj):
    """``obj`` without its wall-clock entries (JSON-like nesting)."""
    if isinstance(obj, dict):
        return {k: _no_wall(v) for k, v in obj.items() if not str(k).startswith(WALL)}
    if isinstance(obj, list):
        return [_no_wall(v) for v in obj]
    return obj


def _through_bytes(snap) -> dict:
    return checkpoint.decode(checkpoint.encode(snap()))  # as a file would, through the safe reader


# ------------------------------------------------------------------------------- in process: SAGE


@pytest.fixture(scope="module")
def sage_setup():
    from federation.core.graphs import neighbour_table
    from federation.data.image_shards import make_graph, make_shards, subsample
    from federation.images.run import load_dataset
    from federation.methods.selectors import parse_config

    cfg = parse_config({"benchmark": "sage", "n_clients": 5, "rounds": 4, "train_samples": 300, "test_samples": 60,
                        "er_p": 0.7, "schedule": [4, 8], "pens": {"discovery_fraction": 0.5}})
    ds, spec = load_dataset(cfg)
    shards = make_shards(subsample(ds, cfg.train_samples, cfg.test_samples, 0), cfg.n_clients, cfg.alpha_dir, 0)
    return cfg, shards, spec, neighbour_table(make_graph(cfg.graph, cfg.n_clients, 0, cfg.er_p, cfg.ba_m))


@pytest.mark.parametrize("selector", ["rg", "pens", "pfeddst", "sage_os"])
def test_a_sage_selector_resumes_from_a_checkpoint_exactly(selector: str, sage_setup):
    from federation.images.run import run_selector

    torch.set_num_threads(1)
    cfg, shards, spec, (cand, valid, degree) = sage_setup
    full = run_selector(selector, cfg, shards, spec, cand, valid, degree, 0)
    saved: dict[int, dict] = {}
    again = run_selector(selector, cfg, shards, spec, cand, valid, degree, 0,
                         checkpoint=lambda tau, snap: saved.setdefault(tau, _through_bytes(snap)) if tau == 2 else None)
    assert _no_wall(again) == _no_wall(full)  # offering checkpoints changes nothing
    resumed = run_selector(selector, cfg, shards, spec, cand, valid, degree, 0, resume=saved[2])
    assert len(resumed["history"]) == cfg.rounds
    assert _no_wall(resumed) == _no_wall(full)
    assert resumed["summary"]["model_bytes"] == full["summary"]["model_bytes"] > 0


# ----------------------------------------------------------------------------- in process: gossip


@pytest.mark.parametrize("extra", [
    {},
    {"averaging": "variance_corrected", "compression_ratio": 0.5, "t_acquisition": (2, 5)},
    {"transfer_threshold": 0.1},
    {"transfer_threshold": 0.1, "transfer_check": "evaluation"},
])
def test_a_gossip_simulation_resumes_from_a_checkpoint_exactly(extra: dict):
    from etl.images import load_idx_dataset
    from federation.gossip.simulation import GossipConfig, simulate

    torch.set_num_threads(1)
    data = load_idx_dataset(FASHION_MNIST_DIR, "fashion-mnist")
    own = {"own_subset": 8} if "transfer_threshold" in extra else {}  # read by the transfer rule only
    cfg = GossipConfig(**{"n_nodes": 6, "degree": 2, "ticks": 30, "eval_every": 10, "test_subset": 40, **own,
                          "batch_size": 8, "t_acquisition": 3, **extra})

    def figures(r):
        return _no_wall(r.summary()), r.curves()

    full = simulate(cfg, data, 1)
    at = 17  # between two evaluations; the evaluation at 10 lies before it, 20 and 30 after
    saved: dict[int, dict] = {}
    again = simulate(cfg, data, 1, checkpoint=lambda t, snap: saved.setdefault(t, _through_bytes(snap)) if t == at
                     else None)
    assert figures(again) == figures(full)
    evals: list[int] = []
    resumed = simulate(cfg, data, 1, on_eval=lambda t, m: evals.append(t), resume=saved[at])
    assert evals == [20, 30]  # only the evaluations after the checkpoint are reported again
    assert figures(resumed) == figures(full)
    assert full.n_averages > 0 and full.n_messages > 0


# ------------------------------------------------------------------------ a real kill, then --resume


SAGE_YAML = """benchmark: sage
n_clients: 4
rounds: 3
train_samples: 200
test_samples: 40
er_p: 0.8
schedule: [4, 8]
seeds: [0]
selectors: [PENS, SAGE-OS]
pens: {discovery_fraction: 0.5}
num_threads: 1
checkpoint: {every_rounds: 1}
"""

VV_YAML = """benchmark: vv
name: vv-tiny
simulation: {n_nodes: 6, degree: 2, ticks: 24, eval_every: 6, test_subset: 40, batch_size: 8, t_acquisition: [2, 4]}
arms: [{name: plain, averaging: plain}, {name: corrected, averaging: variance_corrected}]
seeds: [3]
threads: 1
checkpoint: {every_rounds: 5}
"""


def _kill_and_resume(tmp_path: Path, yaml_text: str, kill_after: int) -> tuple[dict, dict, dict, str]:
    """Run the config uninterrupted in this process (experiment ``full``), then as a real `abps train`
    killed after ``kill_after`` unit checkpoints, and resumed with ``--resume`` (``part``).
    Returns (full results, resumed results, checkpoint at the kill, MLflow uri)."""
    (tmp_path / "cfg.yaml").write_text(yaml_text)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def argv(experiment: str) -> list[str]:
        return ["train", "--config", str(tmp_path / "cfg.yaml"), "--output", f"{experiment}/results.json",
                "--tracking-uri", uri, "--experiment", experiment]

    env = {**os.environ, "ABPS_STATE": str(tmp_path / "state.json")}
    # the uninterrupted run in this process (same machine, same thread count as the children)
    config = yaml.safe_load(yaml_text)
    get_benchmark(config["benchmark"], "cfg.yaml").run(config, None, None, str(tmp_path / "full" / "results.json"),
                                                       uri, "full")
    ck = tmp_path / "part" / "results.json.ckpt"
    killed = run_killed(argv("part"), tmp_path, kill_after, env)  # after its kill_after-th checkpoint
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-800:]
    assert not (tmp_path / "part" / "results.json").exists()
    at_kill = checkpoint.read(ck)
    assert at_kill["current"] is not None  # killed inside a unit, right after its checkpoint
    with pytest.MonkeyPatch.context() as m:  # the resume: `abps train ... --resume` in this process
        m.chdir(tmp_path)
        m.setenv("ABPS_STATE", env["ABPS_STATE"])
        assert run_main([*argv("part"), "--resume"]) == 0
    assert not ck.exists()  # removed once results.json is written
    return (json.loads((tmp_path / "full" / "results.json").read_text()),
            json.loads((tmp_path / "part" / "results.json").read_text()), at_kill, uri)


def _same_mlflow_runs(uri: str, at_kill: dict) -> None:
    """The resumed experiment holds the same runs as the uninterrupted one, the checkpoint's run ids,
    every step of every metric once with the same value (wall seconds: the same steps)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)

    def runs(experiment: str) -> dict[str, object]:
        exp = client.get_experiment_by_name(experiment)
        return {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}

    ref, part = runs("full"), runs("part")
    assert set(part) == set(ref)  # the same runs, none added by the resume
    assert all(r.info.status == "FINISHED" for r in part.values())
    assert set(at_kill["mlflow"].values()) <= {r.info.run_id for r in part.values()}
    for name, run in part.items():
        for key in set(run.data.metrics) | set(ref[name].data.metrics):
            got = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
            want = [(m.step, m.value) for m in client.get_metric_history(ref[name].info.run_id, key)]
            if key.startswith(WALL) or key.startswith(tuple(f"final_{w}" for w in WALL)):
                got, want = [s for s, _ in got], [s for s, _ in want]
            assert sorted(got) == sorted(want), (name, key)


@pytest.mark.parametrize("kill_after", [random.Random(351).randint(1, 4)])
def test_sage_killed_at_a_random_round_then_resumed_equals_the_uninterrupted_run(tmp_path: Path, kill_after: int):
    full, part, at_kill, uri = _kill_and_resume(tmp_path, SAGE_YAML, kill_after)
    assert _no_wall(part) == _no_wall(full)
    assert [r["selector"] for r in part["table"]] == ["PENS", "SAGE-OS"]
    _same_mlflow_runs(uri, at_kill)


@pytest.mark.parametrize("kill_after", [random.Random(352).randint(1, 8)])
def test_gossip_killed_at_a_random_tick_then_resumed_equals_the_uninterrupted_run(tmp_path: Path, kill_after: int):
    full, part, at_kill, uri = _kill_and_resume(tmp_path, VV_YAML, kill_after)
    assert part.pop("output") == "part/results.json" and full.pop("output").endswith("full/results.json")
    assert _no_wall(part) == _no_wall(full)
    assert [r["arm"] for r in part["runs"]] == ["plain", "corrected"]
    _same_mlflow_runs(uri, at_kill)


# ---------------------------------------------------------------------------------------- refusals


def test_a_benchmark_checkpoint_of_another_config_is_refused(tmp_path: Path, monkeypatch):
    from federation.gossip.runner import cli_run
    from federation.run import checkpoint

    cfg = {**yaml.safe_load(VV_YAML), "tracking": {"enabled": False}}
    # a run stopped right after its first checkpoint, in the folder `abps train` would have chosen
    out = tmp_path / "runs" / "vv" / "vv-tiny-20261202-000000" / "results.json"
    stop_at_first_checkpoint(monkeypatch, lambda: cli_run(cfg, output=str(out)))
    ck = checkpoint.checkpoint_path(out)
    assert ck.is_file() and not out.exists()
    changed = {**cfg, "simulation": {**cfg["simulation"], "beta": 0.25}}
    with pytest.raises(InputError) as err:
        cli_run(changed, output=str(out), resume=True)
    msg = str(err.value)
    assert msg.startswith("--resume: ") and "\n" not in msg
    assert "config runs.corrected|base.beta: 0.5 in the checkpoint, 0.25 now" in msg
    with pytest.raises(InputError, match=r"seeds \[3\] in the checkpoint, \[4\] now"):
        cli_run(cfg, seeds=[4], output=str(out), resume=True)
    assert ck.is_file()  # nothing lost

    # `abps train --config ... --resume` without --output finds that checkpoint; the cadence is free
    # to change, and the run completes as the uninterrupted one
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({**cfg, "checkpoint": {"every_rounds": 0, "every_minutes": 0}}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ABPS_STATE", str(tmp_path / "state.json"))
    assert run_main(["train", "--config", "cfg.yaml", "--resume"]) == 0
    assert not ck.exists()
    ref = cli_run(cfg, output=str(tmp_path / "ref.json"))
    doc = json.loads(out.read_text())
    assert _no_wall({k: v for k, v in doc.items() if k != "output"}) == _no_wall(
        {k: v for k, v in ref.items() if k != "output"})

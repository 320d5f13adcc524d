"""A sweep stopped inside a cell goes on from the cell's last round checkpoint (``abps sweep``).

A real ``abps sweep`` is killed with SIGKILL right after a seeded round checkpoint of one of its
cells; the rerun skips the finished cells, continues the interrupted cell from its checkpoint in the
same MLflow run, and every cell's per-round metrics and final summary equal an uninterrupted sweep's.
"""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest

from federation.run import checkpoint
from tests.cli_helpers import run_killed, stop_at_first_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:per-center preprocessing")

ROUNDS = 6

@pytest.mark.parametrize("kill_after", [random.Random(353).randint(1, 2 * (ROUNDS - 1))])
def test_a_sweep_killed_inside_a_cell_goes_on_from_the_cells_checkpoint(tmp_path: Path, kill_after: int):
    from federation.data.synthetic import write_fedprox_cohort
    from federation.sweep import load_sweep, run_sweep
    from mlflow import MlflowClient

    cohort = write_fedprox_cohort(tmp_path / "c", n_centers=5, seed=1, mean_size=60.0)
    folder = tmp_path / "ck"
    (tmp_path / "sweep.yaml").write_text(
        f"name: cells\nseeds: [1, 2]\nrounds: {ROUNDS}\nresources: {{threads: 1}}\ncheckpoints: {folder}\n"
        "methods:\n  - method: abps\n    overrides: {checkpoint: {every_rounds: 1}}\n")
    spec, base = load_sweep(tmp_path / "sweep.yaml")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    full = run_sweep(spec, base, cohort, tracking_uri=uri, experiment="full", progress=False)
    assert len(full.ran) == 2 and not list(folder.iterdir())  # a finished cell leaves no checkpoint

    killed = run_killed(["sweep", "--config", str(tmp_path / "sweep.yaml"), "--cohort", str(cohort), "--tracking-uri",
                         uri, "--experiment", "part", "--no-progress"], tmp_path, kill_after)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-800:]
    (ck,) = folder.iterdir()  # the interrupted cell's checkpoint
    at = int(checkpoint.read(ck)["current"]["state"]["round"])
    assert at == (kill_after - 1) % (ROUNDS - 1) + 1  # a checkpoint after every round but the last

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("part").experiment_id
    cells = "tags.`abps.kind` = 'cell'"
    (stale,) = client.search_runs([exp], cells + " and attributes.status = 'RUNNING'")

    part = run_sweep(spec, base, cohort, tracking_uri=uri, experiment="part", progress=False)
    key = (stale.data.tags["abps.config_hash"], int(stale.data.tags["seed"]))
    assert key in part.ran, (part.failed, part.skipped)
    assert part.ran[key] == stale.info.run_id  # the interrupted cell, in its own run
    assert len(part.skipped) == int(kill_after > ROUNDS - 1)  # the cell finished before the kill, if any
    assert sorted([*part.ran, *part.skipped]) == sorted(c.key for c in part.cells)
    assert not ck.exists()
    assert part.summaries[key] == full.summaries[key]

    def by_key(experiment_id: str) -> dict:
        runs = client.search_runs([experiment_id], cells)
        return {(r.data.tags["abps.config_hash"], int(r.data.tags["seed"])): r for r in runs}

    ref, got = by_key(client.get_experiment_by_name("full").experiment_id), by_key(exp)
    assert set(got) == set(ref) and len(client.search_runs([exp], cells)) == 2  # no run added
    assert all(r.info.status == "FINISHED" for r in got.values())
    for k, run in got.items():
        assert set(run.data.metrics) == set(ref[k].data.metrics)
        for name in run.data.metrics:
            h = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, name)]
            want = [(m.step, m.value) for m in client.get_metric_history(ref[k].info.run_id, name)]
            assert sorted(h) == sorted(want), (k, name)  # every round once, the same values
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_auroc_mean")]
        assert sorted(steps) == list(range(1, ROUNDS + 1))


def test_a_terminated_sweep_says_so_and_leaves_no_running_cell(tmp_path: Path):
    """`kill PID` of `abps sweep` unwinds as Ctrl-C does: exit 143, one line, the cell's run FAILED."""
    from federation.data.synthetic import write_fedprox_cohort
    from mlflow import MlflowClient

    cohort = write_fedprox_cohort(tmp_path / "c", n_centers=4, seed=1, mean_size=40.0)
    (tmp_path / "sweep.yaml").write_text(
        f"name: t\nseeds: [1]\nrounds: {ROUNDS}\ncheckpoints: {tmp_path / 'ck'}\n"
        "methods:\n  - method: fedavg\n    overrides: {checkpoint: {every_rounds: 1}}\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    p = run_killed(["sweep", "--config", str(tmp_path / "sweep.yaml"), "--cohort", str(cohort), "--tracking-uri",
                    uri, "--no-progress"], tmp_path, 2, sig=signal.SIGTERM)
    assert p.returncode == 143 and p.stderr.strip().splitlines()[-1] == "error: interrupted", p.stderr[-800:]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("t").experiment_id], "tags.`abps.kind` = 'cell'")
    assert [r.info.status for r in runs] == ["FAILED"]


def test_a_cell_checkpoint_of_another_code_version_fails_the_cell_naming_it(tmp_path: Path, monkeypatch):
    from etl.errors import InputError
    from federation.core.config import build_config
    from federation.data.synthetic import write_fedprox_cohort
    from federation.run import checkpoint
    from federation.sweep.cells import run_cell

    cohort = write_fedprox_cohort(tmp_path / "c", n_centers=4, seed=2, mean_size=40.0)
    cfg = build_config("fedavg", {}, {"method": "fedavg", "checkpoint": {"every_rounds": 1}}, rounds=3)
    path = tmp_path / "ck" / "cell.ckpt"
    stop_at_first_checkpoint(monkeypatch, lambda: run_cell(cfg.model_dump(mode="json"), str(cohort), 5,
                                                           checkpoint_path=str(path)))
    assert int(checkpoint.read(path)["current"]["state"]["round"]) == 1
    monkeypatch.setattr(checkpoint, "code_version", lambda: "0123456789abcdef")
    with pytest.raises(InputError) as err:
        run_cell(cfg.model_dump(mode="json"), str(cohort), 5, checkpoint_path=str(path))
    msg = str(err.value)
    assert msg.startswith(f"sweep cell checkpoint: {path} belongs to another run: code version ") and "\n" not in msg
    assert path.is_file()  # nothing lost
    monkeypatch.undo()
    resumed = run_cell(cfg.model_dump(mode="json"), str(cohort), 5, checkpoint_path=str(path))
    direct = run_cell(cfg.model_dump(mode="json"), str(cohort), 5)
    assert resumed["history"] == direct["history"] and resumed["summary"] == direct["summary"]
    assert resumed["round_ms"][0] is None and len(resumed["round_ms"]) == 3  # round 1 ran before the stop

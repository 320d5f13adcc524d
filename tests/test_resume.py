"""Round checkpoints and ``abps train --resume`` (federation/run/checkpoint.py).

* the loop driver resumed at time point k makes the calls the uninterrupted loop makes after k;
* every registered method (the list comes from the registry, so a new method is covered): a run
  resumed from a checkpoint of round 2 has the uninterrupted run's history and summary, exactly;
  also with a drift scenario, an availability clock, early stopping and server momentum;
* a real ``abps train`` killed with SIGKILL at a random round and resumed with ``--resume``
  writes the uninterrupted run's results.json byte for byte and continues the same MLflow runs
  (same run ids, each round logged once, the same values);
* a checkpoint of another config, cohort, seeds or code version is refused with one line naming
  what differs; ``--resume`` without a checkpoint is refused (the SAGE and gossip benchmarks:
  tests/test_resume_benchmarks.py).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from etl.errors import InputError
from etl.images import FASHION_MNIST_DIR
from federation.core.config import build_config
from federation.core.loop import EvalSchedule, drive
from federation.data.tensors import FederatedData
from federation.methods import all_methods, method_names
from federation.run import checkpoint
from federation.run.runner import run_one, run_training

ROUNDS = 4
pytestmark = pytest.mark.filterwarnings("ignore:per-center preprocessing")
AT = 2  # the checkpoint resumed from in the in-process round trips


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from federation.data.synthetic import write_fedprox_cohort

    return write_fedprox_cohort(tmp_path_factory.mktemp("resume") / "c", n_centers=5, seed=1, mean_size=60.0)


@pytest.fixture(scope="module")
def data(cohort: Path) -> FederatedData:
    return FederatedData.from_cohort(cohort)


# ----------------------------------------------------------------------------------- loop driver


def test_drive_resumed_at_k_makes_the_calls_the_loop_makes_after_k():
    def trace(start=0, records=None):
        calls: list = []
        out = drive(6, lambda t: calls.append(("step", t)) or ({"s": float(t)} if t % 2 else None),
                    lambda tau: calls.append(("eval", tau)) or {"e": float(tau)}, EvalSchedule(every=2),
                    on_record=lambda tau, row: calls.append(("rec", tau)), start=start, records=records,
                    after=lambda tau: calls.append(("after", tau)))
        return calls, out

    full, out = trace()
    assert [c for c in full if c[0] == "after"] == [("after", t) for t in range(6)]
    k = 3
    cut = full.index(("after", k)) + 1
    resumed, out2 = trace(k, [r for r in out.records if r[0] <= k])
    assert resumed == full[cut:]
    assert out2.records == out.records and out2.steps_run == out.steps_run == 6
    with pytest.raises(ValueError, match="start"):
        drive(3, lambda t: None, lambda tau: {}, start=4)


# ------------------------------------------------------------------------- every method, in process


def _round_trip(cfg, data: FederatedData, at: int = AT, seed: int = 3):
    """(uninterrupted result, resumed result, rounds offered a checkpoint)."""
    full = run_one(cfg, data, seed)
    saved: dict[str, bytes] = {}
    offered: list[int] = []

    def ck(tau, snap):
        offered.append(tau)
        if tau == at:  # through bytes, as a file would: nothing shared with the live run
            saved["b"] = checkpoint.encode(snap())

    again = run_one(cfg, data, seed, checkpoint=ck)
    assert again.history == full.history  # offering checkpoints changes nothing
    state = checkpoint.decode(saved["b"])  # the safe reader builds every method's state
    resumed = run_one(cfg, data, seed, resume=state)
    return full, resumed, offered


@pytest.mark.parametrize("name", method_names())
def test_every_method_resumes_from_a_checkpoint_exactly(name: str, data: FederatedData):
    torch.set_num_threads(1)
    cls = all_methods()[name]
    cfg = build_config(name, cls.default_config, None, rounds=ROUNDS)
    cfg = cfg.model_copy(update={"early_stopping": cfg.early_stopping.model_copy(update={"enabled": False})})
    full, resumed, offered = _round_trip(cfg, data)
    assert offered == list(range(ROUNDS))  # after every round but the last (and round 0: the initial models)
    assert len(resumed.history) == ROUNDS
    assert resumed.history == full.history
    assert resumed.summary() == full.summary()


@pytest.mark.parametrize("name,extra", [
    ("abps-drift", {"drift": {"round": 2, "count": 2}}),   # the label flip lies before the checkpoint (round 2)
    ("abps-drift", {"drift": {"round": 4, "count": 2}}),   # ... and after it
    ("abps", {"realworld": {"availability": {"kind": "daily", "work_hours": [8.0, 15.2], "utc_offsets": "spread"},
                            "round_period_s": 3600}}),
    ("fedavg", {"exchange": {"server_momentum": 0.5}}),
    ("abps", {"early_stopping": {"enabled": True, "patience": 1, "max_rounds": 6}}),
])
def test_resume_carries_drift_clock_momentum_and_early_stopping(name, extra, data: FederatedData):
    torch.set_num_threads(1)
    cls = all_methods()[name]
    cfg = build_config(name, cls.default_config, {"method": name, **extra}, rounds=ROUNDS)
    full, resumed, _ = _round_trip(cfg, data)
    assert resumed.history == full.history and resumed.summary() == full.summary()
    if "realworld" in extra:  # the clock went on from the checkpoint's virtual time
        assert [h["virtual_hours"] for h in resumed.history] == [h["virtual_hours"] for h in full.history]
        assert full.history[-1]["virtual_hours"] > full.history[0]["virtual_hours"]


@pytest.mark.skipif(not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
                    reason="Fashion-MNIST not installed")
@pytest.mark.parametrize("name", ["fedavg", "sage"])
def test_an_image_federation_resumes_exactly(name: str, tmp_path: Path):
    """The image engine keeps its clients' Adam moments itself (ImageEngine.state_dict)."""
    from federation.data.load import load_federation

    torch.set_num_threads(1)
    (tmp_path / "images.yaml").write_text("dataset: fmnist\nn_clients: 3\nalpha_dir: 0.5\ntrain_samples: 240\n")
    images = load_federation(tmp_path)
    cfg = build_config(name, all_methods()[name].default_config, None, rounds=3)
    full, resumed, _ = _round_trip(cfg, images)
    assert resumed.history == full.history and resumed.summary() == full.summary()


# ------------------------------------------------------------------- stamps, refusals, atomic writes


def _stopped_run(cohort: Path, out: Path, monkeypatch, **cfg_extra):
    """A run_training that stops after its last checkpoint (results.json never written)."""
    import federation.run.runner as runner

    cfg = build_config("fedavg", {}, {"method": "fedavg", "checkpoint": {"every_rounds": 1}, **cfg_extra}, rounds=3)

    def crash(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(runner, "write_results", crash)
        with pytest.raises(KeyboardInterrupt):
            run_training(cfg, cohort, [1, 2], output=out, progress=False, track=False)
    return cfg


def test_a_stopped_run_resumes_to_the_uninterrupted_results(cohort: Path, tmp_path: Path, monkeypatch):
    cfg = _stopped_run(cohort, tmp_path / "r.json", monkeypatch)
    ck = checkpoint.checkpoint_path(tmp_path / "r.json")
    assert ck.is_file() and not (tmp_path / "r.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["r.json.ckpt"]  # no temporary file left behind
    saved = checkpoint.read(ck)
    assert [r.seed for r in saved["done"]] == [1, 2] and saved["current"] is None
    doc = run_training(cfg, cohort, [1, 2], output=tmp_path / "r.json", progress=False, track=False, resume=True)
    assert not ck.exists()  # removed once results.json is written
    ref = run_training(cfg, cohort, [1, 2], output=tmp_path / "ref.json", progress=False, track=False)
    assert doc == ref
    assert (tmp_path / "r.json").read_bytes() == (tmp_path / "ref.json").read_bytes()


@pytest.mark.parametrize("change,named", [
    ({"rounds": 4}, "config rounds: 3 in the checkpoint, 4 now"),
    ({"engine": {"lr": 0.5}}, "config engine.lr: "),
    ({"seeds": [1]}, "seeds [1, 2] in the checkpoint, [1] now"),
    ({"code": True}, "code version "),
    ({"checkpoint": {"every_rounds": 7}}, None),  # the cadence is free to change
])
def test_a_checkpoint_of_another_run_is_refused_naming_the_difference(change, named, cohort: Path, tmp_path: Path,
                                                                       monkeypatch):
    _stopped_run(cohort, tmp_path / "r.json", monkeypatch)
    change = dict(change)
    seeds = change.pop("seeds", [1, 2])
    if change.pop("code", False):
        monkeypatch.setattr(checkpoint, "code_version", lambda: "0123456789abcdef")
    cfg = build_config("fedavg", {}, {"method": "fedavg", "checkpoint": {"every_rounds": 1},
                                      **{k: v for k, v in change.items() if k != "rounds"}},
                       rounds=change.get("rounds", 3))
    if named is None:
        run_training(cfg, cohort, seeds, output=tmp_path / "r.json", progress=False, track=False, resume=True)
        return
    with pytest.raises(InputError) as err:
        run_training(cfg, cohort, seeds, output=tmp_path / "r.json", progress=False, track=False, resume=True)
    msg = str(err.value)
    assert named in msg and "\n" not in msg and msg.startswith("--resume: ")
    assert checkpoint.checkpoint_path(tmp_path / "r.json").is_file()  # nothing lost


def test_resume_without_a_checkpoint_or_with_a_broken_one_is_refused(cohort: Path, tmp_path: Path):
    cfg = build_config("fedavg", {}, None, rounds=2)
    with pytest.raises(InputError, match="no checkpoint"):
        run_training(cfg, cohort, [1], output=tmp_path / "r.json", progress=False, track=False, resume=True)
    checkpoint.checkpoint_path(tmp_path / "r.json").mkdir()
    with pytest.raises(InputError, match=r"r.json.ckpt is a folder, not a checkpoint \(move it aside\)$"):
        run_training(cfg, cohort, [1], output=tmp_path / "r.json", progress=False, track=False, resume=True)
    checkpoint.checkpoint_path(tmp_path / "r.json").rmdir()
    checkpoint.checkpoint_path(tmp_path / "r.json").write_bytes(b"not a checkpoint")
    with pytest.raises(InputError, match="is not a checkpoint of layout 2$"):
        run_training(cfg, cohort, [1], output=tmp_path / "r.json", progress=False, track=False, resume=True)


class _Runs:
    """A pickle that calls a function when it is read, as a crafted checkpoint would."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def test_a_checkpoint_runs_no_code_and_a_damaged_one_is_refused_before_it_is_read(cohort: Path, tmp_path: Path,
                                                                                  monkeypatch):
    """--resume reads a file the user points at: it is unpickled by torch's weights-only reader,
    which builds this project's state records and nothing else, after its SHA-256 is checked."""
    import io

    cfg = _stopped_run(cohort, tmp_path / "r.json", monkeypatch)
    ck = checkpoint.checkpoint_path(tmp_path / "r.json")
    good = ck.read_bytes()
    doc = checkpoint.read(ck)

    def resume():
        with pytest.raises(InputError) as err:
            run_training(cfg, cohort, [1, 2], output=tmp_path / "r.json", progress=False, track=False, resume=True)
        return str(err.value)

    marker = tmp_path / "ran"
    for fn, named in [(os.system, "posix.system"), (checkpoint.save, "federation.run.checkpoint.save")]:
        args = (f"touch {marker}",) if fn is os.system else (str(marker), {})
        ck.write_bytes(checkpoint.encode({**doc, "done": _Runs(fn, *args)}))
        assert resume() == f"--resume: {ck} is refused: it names code outside this program's state ({named})"
        assert not marker.exists()                                   # nothing ran
    damaged = bytearray(good)
    damaged[len(good) // 2] ^= 0x01                                  # one bit, inside the tensors
    ck.write_bytes(bytes(damaged))
    assert resume() == f"--resume: {ck} is damaged (its SHA-256 does not match its content)"
    buf = io.BytesIO()
    torch.save(doc, buf)                                             # a bare torch.save file
    ck.write_bytes(buf.getvalue())
    assert resume() == f"--resume: {ck} is not a checkpoint of layout 2"
    ck.write_bytes(good)                                             # the file as written resumes
    run_training(cfg, cohort, [1, 2], output=tmp_path / "r.json", progress=False, track=False, resume=True)


def test_cadence_every_n_rounds_or_t_minutes():
    from federation.core.config import CheckpointConfig

    def pattern(rounds: int, minutes: float) -> list[bool]:
        now = [0.0]
        c = checkpoint.Cadence(CheckpointConfig(every_rounds=rounds, every_minutes=minutes), clock=lambda: now[0])
        out = []
        for tau in range(1, 8):
            now[0] += 40.0  # 40 s a round
            out.append(c.due(tau))
        return out

    F, T = False, True
    assert pattern(3, 0) == [F, F, T, F, F, T, F]  # rounds 3, 6
    assert pattern(0, 1.0) == [F, T, F, T, F, T, F]  # 80 s >= 60 s since the last write
    # both: the minute passes at round 2, round 3 by count (the timer restarted), 80 s again at 5, count at 6
    assert pattern(3, 1.0) == [F, T, T, F, T, T, F]
    assert not checkpoint.Cadence(CheckpointConfig(every_rounds=0, every_minutes=0)).enabled


# ------------------------------------------------------------------------ a real kill, then --resume


# The child is the real `abps train` in a fresh interpreter; right after the checkpoint that holds
# round `ABPS_KILL_AFTER` (rounds done across seeds) is on disk it sends itself SIGKILL: a hard stop at
# a chosen round, with no race between a polling test and a fast run.
_KILLED_CHILD = """
import os, signal, sys
from federation.run import checkpoint
from cli.app import main

_save, _after = checkpoint.save, int(os.environ["ABPS_KILL_AFTER"])

def save(path, payload):
    _save(path, payload)
    cur = payload["current"]
    if sum(r.rounds_run for r in payload["done"]) + (int(cur["state"]["round"]) if cur else 0) >= _after:
        os.kill(os.getpid(), signal.SIGKILL)

checkpoint.save = save
sys.argv = ["abps", *sys.argv[1:]]
main()
"""


def _abps(args: list[str], cwd: Path) -> list[str]:
    return [str(Path(sys.executable).parent / "abps"), *args]


def _progress(ck: Path) -> int:
    """Rounds done across seeds in the checkpoint."""
    doc = checkpoint.read(ck)
    cur = doc["current"]
    return sum(r.rounds_run for r in doc["done"]) + (int(cur["state"]["round"]) if cur else 0)


@pytest.mark.parametrize("kill_after", [random.Random(35).randint(1, 20)])
def test_sigkill_at_a_random_round_then_resume_equals_the_uninterrupted_run(cohort: Path, tmp_path: Path,
                                                                            kill_after: int):
    rounds = 12
    (tmp_path / "cfg.yaml").write_text("method: abps\ncheckpoint: {every_rounds: 1}\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def argv(experiment: str) -> list[str]:
        return _abps(["train", "--config", str(tmp_path / "cfg.yaml"), "--cohort", str(cohort), "--seeds", "1", "2",
                      "--rounds", str(rounds), "--output", f"{experiment}/results.json", "--tracking-uri", uri,
                      "--experiment", experiment, "--no-progress", "--threads", "1"], tmp_path)

    env = {**os.environ, "ABPS_STATE": str(tmp_path / "state.json")}
    full = subprocess.run(argv("full"), cwd=tmp_path, env=env, capture_output=True, text=True)
    assert full.returncode == 0, full.stderr[-800:]

    ck = tmp_path / "part" / "results.json.ckpt"
    killed = subprocess.run([sys.executable, "-c", _KILLED_CHILD, *argv("part")[1:]], cwd=tmp_path,
                            env={**env, "ABPS_KILL_AFTER": str(kill_after)}, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-800:]
    done = _progress(ck)
    assert done == kill_after  # a checkpoint every round: the last one on disk is the kill round's
    at_kill = checkpoint.read(ck)  # the checkpoint the resume goes on from
    assert not (tmp_path / "part" / "results.json").exists()
    resumed = subprocess.run([*argv("part"), "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-800:]

    # results.json identical, byte for byte; the checkpoint is gone
    assert (tmp_path / "part" / "results.json").read_bytes() == (tmp_path / "full" / "results.json").read_bytes()
    assert not ck.exists()

    from mlflow import MlflowClient

    client = MlflowClient(uri)

    def runs(experiment: str) -> dict[str, object]:
        exp = client.get_experiment_by_name(experiment)
        return {r.data.tags.get("seed", "parent"): r for r in client.search_runs([exp.experiment_id])}

    ref, part = runs("full"), runs("part")
    assert set(part) == {"parent", "1", "2"}  # the same runs, none added by the resume
    assert all(r.info.status == "FINISHED" for r in part.values())
    assert part["parent"].info.run_id == at_kill["mlflow"]["parent"]
    if at_kill["current"] is not None:
        assert part[str(at_kill["current"]["seed"])].info.run_id == at_kill["current"]["child"]
    for seed in ("1", "2"):
        for key in part[seed].data.metrics:
            h = client.get_metric_history(part[seed].info.run_id, key)
            want = client.get_metric_history(ref[seed].info.run_id, key)
            # each step as often as in the uninterrupted run (a final metric such as rel_bandwidth is
            # also logged at the last round), with the same values
            assert sorted((m.step, m.value) for m in h) == sorted((m.step, m.value) for m in want), (seed, key)
        steps = client.get_metric_history(part[seed].info.run_id, "val_auroc_mean")
        assert sorted(m.step for m in steps) == list(range(1, rounds + 1))  # every round once
        assert part[seed].data.metrics == ref[seed].data.metrics  # final metrics too

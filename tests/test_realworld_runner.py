"""Real-world conditions in the round loop: "always on" reproduces today's runs exactly, dropout changes them,
unavailable centers neither train nor exchange, FedAvg averages the available centers, the deadline
drops late updates, ABPS makes no belief update about an unavailable peer, the preset files load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from abps.method import AbpsMethod
from federation.core.config import RealWorldConfig, build_config, load_yaml
from federation.data.synthetic import generate_fedprox_cohort
from federation.data.tensors import FederatedData
from federation.methods import get_method
from federation.methods.baselines import FedAvg
from federation.methods.registry import METHODS
from federation.run.availability import Availability
from federation.run.runner import run_one

pytestmark = pytest.mark.filterwarnings("ignore:per-center preprocessing")
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
NEW_KEYS = {"available_share", "dropped_updates", "round_seconds", "virtual_hours", "intentional_rest_share"}
MBIT = 125_000.0
LINKS = {"uplink": {"low": MBIT, "high": 100 * MBIT}, "downlink": {"low": MBIT, "high": 100 * MBIT},
         "rows_per_s": {"low": 5000.0, "high": 5000.0}, "latency_s": {"low": 0.01, "high": 0.1}}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def data() -> FederatedData:
    cohort, centers = generate_fedprox_cohort(10, seed=1, mean_size=150.0)
    return FederatedData.from_frames(cohort, centers, preprocessing=None)


def _cfg(method: str, rounds: int, realworld: dict | None):
    file_cfg = {"realworld": realworld} if realworld is not None else None
    return build_config(method, get_method(method).default_config, file_cfg, rounds=rounds)


def _strip(history):
    return [{k: v for k, v in h.items() if k not in NEW_KEYS} for h in history]


def _run_spy(spy: type, cfg, data, seed: int, keep: bool = False):
    METHODS["rw-spy-test"] = spy
    try:
        return run_one(cfg.model_copy(update={"method": "rw-spy-test"}), data, seed, keep_params=keep)
    finally:
        METHODS.pop("rw-spy-test")


@pytest.mark.parametrize("method", ["fedavg", "abps-x"])
def test_always_on_reproduces_todays_runs_exactly(data, method):
    base = run_one(_cfg(method, 3, None), data, 7, keep_params=True)
    for rw in ({}, {"availability": {"kind": "bernoulli", "rate": 1.0}, "profiles": LINKS}):
        res = run_one(_cfg(method, 3, rw), data, 7, keep_params=True)
        assert _strip(res.history) == base.history  # every float bit-for-bit
        # per-center figures hold NaN (one-class splits): compare their exact text
        assert json.dumps(res.per_center, sort_keys=True) == json.dumps(base.per_center, sort_keys=True)
        assert res.total_bytes == base.total_bytes
        assert all(torch.equal(res.params[k], base.params[k]) for k in base.params)
        assert all(h["available_share"] == 1.0 and h["dropped_updates"] == 0.0 for h in res.history)
    # with links the clock runs: every round lasts > 0 virtual seconds, cumulative hours grow
    hrs = [h["virtual_hours"] for h in res.history]
    assert all(b > a > 0 for a, b in zip(hrs, hrs[1:]))


def test_dropout_0_vs_90_percent_differ_and_unavailable_centers_stay_put(data):
    rw = {"availability": {"kind": "bernoulli", "rate": 0.1}}
    on = run_one(_cfg("fedavg", 3, {"availability": {"kind": "bernoulli", "rate": 1.0}}), data, 7)
    off = run_one(_cfg("fedavg", 3, rw), data, 7, keep_params=True)
    assert on.final_auroc_mean != off.final_auroc_mean
    assert off.model_bytes < on.model_bytes
    mask = Availability(RealWorldConfig.model_validate(rw).availability, data.center_ids, 7).mask(
        torch.arange(3), torch.zeros(3, dtype=torch.float64))
    assert [h["available_share"] for h in off.history] == [float(m.double().mean()) for m in mask]
    assert [h["edges"] for h in off.history] == [float(m.sum()) for m in mask]  # one server link per available
    never = ~mask.any(dim=0)
    assert never.any()  # with 10 % availability some center sits out all 3 rounds
    init = get_method("fedavg")(None).make_engine(data, _cfg("fedavg", 3, None), 7).init_params()
    for k, v in off.params.items():
        assert torch.equal(v[never], init[k][never])  # never trained, never received a model


def test_fedavg_averages_available_centers(data, tmp_path):
    up = data.center_ids[:3] + data.center_ids[5:6]
    trace = tmp_path / "trace.csv"
    trace.write_text("center,start,end\n" + "".join(f"{c},0,1\n" for c in up))
    seen = {}

    class Spy(FedAvg):
        def plan_round(self, ctx, r):
            seen["sent"] = {k: v.clone() for k, v in ctx.pre_exchange.items()}
            seen["start"] = {k: v.clone() for k, v in ctx.round_start.items()}
            return super().plan_round(ctx, r)

    cfg = _cfg("fedavg", 1, {"availability": {"kind": "trace", "trace": str(trace)}, "round_period_s": 3600})
    res = _run_spy(Spy, cfg, data, 3, keep=True)
    a = torch.tensor([c in up for c in data.center_ids])
    p = data.n_train.double() * a
    p = p / p.sum()
    for k, v in res.params.items():
        want = torch.einsum("n,n...->...", p, seen["sent"][k].double()).float()
        assert torch.allclose(v[a], want.expand_as(v[a]), atol=1e-6, rtol=0)
        assert torch.equal(v[~a], seen["start"][k][~a]) and torch.equal(seen["sent"][k][~a], seen["start"][k][~a])
    assert res.history[0]["available_share"] == pytest.approx(0.4) and res.history[0]["edges"] == 4.0


def test_deadline_drops_late_updates(data, tmp_path):
    prof = tmp_path / "profiles.csv"
    slow = data.center_ids[0]
    prof.write_text("center,rows_per_s,uplink,downlink,latency_s\n" + "".join(
        f"{c},{1.0 if c == slow else 1e6},1e9,1e9,0\n" for c in data.center_ids))
    rw = {"profiles": {"file": str(prof)}, "deadline": {"policy": "fixed", "seconds": 5.0}}
    res = run_one(_cfg("fedavg", 2, rw), data, 3)
    # the slow center needs 2 epochs x n_train rows at 1 row/s >> 5 s: dropped every round, round = 5 s
    assert all(h["dropped_updates"] == 1.0 and h["round_seconds"] == 5.0 for h in res.history)
    assert res.history[-1]["virtual_hours"] == pytest.approx(10.0 / 3600)
    waited = run_one(_cfg("fedavg", 2, {"profiles": {"file": str(prof)}}), data, 3)
    assert waited.history[0]["round_seconds"] == pytest.approx(2 * float(data.n_train[0]), rel=1e-6)
    assert waited.final_auroc_mean != res.final_auroc_mean


def test_abps_no_belief_update_about_unavailable_peer(data):
    log = []

    class Spy(AbpsMethod):
        def plan_round(self, ctx, r):
            self._before = (self.beliefs.alpha.clone(), self.beliefs.beta.clone())
            return super().plan_round(ctx, r)

        def after_exchange(self, ctx, r, plan):
            out = super().after_exchange(ctx, r, plan)
            log.append((ctx.available.clone(), self.last.partners.clone(), self.last.proposals.clone(),
                        *self._before, self.beliefs.alpha.clone(), self.beliefs.beta.clone()))
            return out

    cfg = _cfg("abps", 4, {"availability": {"kind": "bernoulli", "rate": 0.5}})
    res = _run_spy(Spy, cfg, data, 11)
    assert any(not bool(a.all()) for a, *_ in log)
    for a, partners, proposals, a0, b0, a1, b1 in log:
        down = ~a
        assert not partners[down].any() and not partners[:, down].any()
        assert not proposals[down].any()
        # nothing learned about (or by) an unavailable center this round
        for before, after in ((a0, a1), (b0, b1)):
            assert torch.equal(before[:, down], after[:, down]) and torch.equal(before[down], after[down])
    for h, (a, partners, *_) in zip(res.history, log):
        up = int(a.sum())
        rest = int((a & ~partners.any(dim=1)).sum())
        assert h["intentional_rest_share"] == pytest.approx(rest / up)  # rest among the available only
        assert h["available_share"] == pytest.approx(up / data.n_centers)


def test_realworld_preset_files_validate():
    for name in ("realworld-always-on", "realworld-daily30", "realworld-hetero-links"):
        doc = load_yaml(CONFIGS / f"{name}.yaml")
        cfg = build_config("fedavg", {}, doc)
        assert cfg.realworld is not None
    assert build_config("fedavg", {}, load_yaml(CONFIGS / "realworld-always-on.yaml")).realworld.availability.kind \
        == "always"


def test_cli_bad_trace_is_one_line_error_before_any_run(tmp_path):
    import os
    import subprocess
    import sys

    from federation.data.synthetic import write_fedprox_cohort

    repo = Path(__file__).resolve().parents[1]
    cohort = write_fedprox_cohort(tmp_path / "cohort", n_centers=3, seed=1, mean_size=60.0)
    (tmp_path / "trace.csv").write_text("center,begin,end\nx,0,1\n")
    (tmp_path / "rw.yaml").write_text(f"realworld:\n  availability: {{kind: trace, trace: {tmp_path / 'trace.csv'}}}\n"
                                      "  round_period_s: 3600\n")
    uri = f"sqlite:///{tmp_path}/ml.db"
    p = subprocess.run([sys.executable, "-c", "from cli.app import main; main()", "train", "--method", "fedavg",
                        "--cohort", str(cohort), "--config", str(tmp_path / "rw.yaml"), "--rounds", "1",
                        "--tracking-uri", uri, "--no-progress"], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin", "ABPS_STATE": os.environ["ABPS_STATE"]})
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0].startswith("error: ") and "trace.csv" in lines[0] and "column 'start' missing" in lines[0]
    assert not (tmp_path / "results.json").exists()


def test_a_relative_trace_is_read_from_the_config_files_folder(tmp_path, monkeypatch):
    from federation.core.config import load_run_config

    (tmp_path / "study").mkdir()
    cfg = tmp_path / "study" / "rw.yaml"
    cfg.write_text("realworld:\n  availability: {kind: trace, trace: traces/t.csv}\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert load_run_config(Path("..") / "study" / "rw.yaml")["realworld"]["availability"]["trace"] == \
        str(tmp_path / "study" / "traces" / "t.csv")
    cfg.write_text("realworld:\n  availability: {kind: trace, trace: /abs/t.csv}\nrounds: 3\n")
    assert load_run_config(cfg)["realworld"]["availability"]["trace"] == "/abs/t.csv"
    cfg.write_text("rounds: 3\nrealworld: null\n")  # no trace key: the document as it is
    assert load_run_config(cfg) == {"rounds": 3, "realworld": None}
    # every path key of a config file: the profiles CSV, SAGE's data_root, the gossip data.root
    cfg.write_text("realworld: {profiles: {file: p.csv}}\ndata_root: fm\ndata: {root: mnist, name: x}\n")
    doc = load_run_config(cfg)
    study = tmp_path / "study"
    assert (doc["realworld"]["profiles"]["file"], doc["data_root"], doc["data"]) == (
        str(study / "p.csv"), str(study / "fm"), {"root": str(study / "mnist"), "name": "x"})

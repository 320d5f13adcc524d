"""Every baseline runs; FedAvg consensus; FedProx(mu=0) == FedAvg; early stopping; determinism."""

from __future__ import annotations

import json
import math

import pytest
import torch

from federation.config import build_config
from federation.data import FederatedData
from federation.engine import n_params
from federation.methods import METHODS, get_method
from federation.methods.baselines import BASELINES
from federation.mixing import exchanged_keys
from federation.runner import run_one
from federation.synthetic import write_fedprox_cohort


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("meth") / "c"
    write_fedprox_cohort(d, n_centers=8, alpha=0.5, beta=0.5, seed=5, mean_size=120, shared=0.8)
    return FederatedData.from_cohort(d)


def _cfg(name, rounds=2, **over):
    cls = get_method(name)
    return build_config(name, cls.default_config, {"method": name, **over} if over else None, rounds)


@pytest.mark.parametrize("name", [c.name for c in BASELINES])
def test_each_method_runs_two_rounds(data, name):
    res = run_one(_cfg(name), data, seed=11, keep_params=True)
    assert res.rounds_run == 2 and len(res.history) == 2
    assert 0.0 <= res.final_auroc_mean <= 1.0 and math.isfinite(res.final_auroc_std)
    sizes = n_params(data.d, (128, 64))
    full = sum(sizes.values())
    cfg = _cfg(name)
    share = sum(sizes[k] for k in exchanged_keys(cfg.exchange.head_layers)) / full
    bpp = 2 if cfg.exchange.bf16_wire else 4
    expected = 0.0 if name in ("local", "centralized") else 2 / 50 * share * bpp / 4
    assert res.rel_bandwidth == pytest.approx(expected, rel=1e-12)
    p = res.params
    same = {k: bool(torch.allclose(p[k], p[k][:1].expand_as(p[k]), atol=1e-6)) for k in p}
    if name in ("fedavg", "fedprox", "feddyn", "moon", "centralized"):
        assert all(same.values())  # a consensus model (or the one pooled model)
    if name in ("fedavg-pq", "fedavg-x"):
        # consensus up to the bf16 wire: each center keeps its own fp32 copy in the mix
        for k in exchanged_keys(cfg.exchange.head_layers):
            assert torch.allclose(p[k], p[k][:1].expand_as(p[k]), atol=2e-3), k
            assert not same[k]
        assert not same["w3"]  # personalized head differs between centers
    if name == "local":
        assert not same["w1"]


def test_fedprox_with_zero_mu_equals_fedavg(data):
    a = run_one(_cfg("fedavg"), data, seed=3)
    b = run_one(_cfg("fedprox", params={"mu": 0.0}), data, seed=3)
    assert _js(a.history) == _js(b.history)
    c = run_one(_cfg("fedprox", params={"mu": 1.0}), data, seed=3)
    assert _js(c.history) != _js(a.history)


def _js(x):
    return json.dumps(x, sort_keys=True)  # NaN-safe equality (NaN != NaN as floats)


def test_same_seed_same_metrics_different_seed_differs(data):
    for name in ("fedavg", "moon", "feddyn"):
        r1, r2 = run_one(_cfg(name), data, seed=22), run_one(_cfg(name), data, seed=22)
        assert _js(r1.history) == _js(r2.history) and _js(r1.per_center) == _js(r2.per_center)
    a, b = run_one(_cfg("fedavg"), data, seed=22), run_one(_cfg("fedavg"), data, seed=23)
    assert _js(a.history) != _js(b.history)


def test_early_stopping_restores_best_round(data):
    cfg = _cfg("fedavg-x", rounds=6, early_stopping={"enabled": True, "patience": 1, "max_rounds": 6})
    res = run_one(cfg, data, seed=5)
    vals = [h["val_auroc_mean"] for h in res.history]
    best = max(range(len(vals)), key=lambda i: (vals[i], -i))
    assert res.best_round == best + 1
    assert res.final_val_auroc_mean == pytest.approx(vals[best])
    assert res.final_auroc_mean == pytest.approx(res.history[best]["test_auroc_mean"])
    assert res.rounds_run == len(vals) and (res.rounds_run == 6 or res.rounds_run - res.best_round == 1)


def test_registry_lists_baselines_and_rejects_unknown():
    from etl.errors import InputError

    for c in BASELINES:
        assert METHODS[c.name] is c
    with pytest.raises(InputError, match="fedavg"):
        get_method("no-such-method")


def test_artifacts_hook(data, monkeypatch):
    from federation.methods.baselines import FedAvg

    class WithArtifacts(FedAvg):
        name = "fedavg-art"

        def artifacts(self, ctx):
            return {"sizes.json": {cid: int(n) for cid, n in zip(ctx.data.center_ids, ctx.n_train)}}

    monkeypatch.setitem(METHODS, WithArtifacts.name, WithArtifacts)
    res = run_one(build_config(WithArtifacts.name, {}, None, 1), data, seed=1)
    sizes = res.artifacts["sizes.json"]
    assert list(sizes) == data.center_ids and sum(sizes.values()) == int(data.n_train.sum())
    assert "artifacts" not in res.summary()

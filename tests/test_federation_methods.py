"""Every baseline runs; FedAvg consensus; FedProx(mu=0) == FedAvg; early stopping; determinism."""

from __future__ import annotations

import json
import math

import pytest
import torch

from federation.core.config import build_config
from federation.data.synthetic import write_fedprox_cohort
from federation.data.tensors import FederatedData
from federation.engine.mlp import exchanged_keys, n_params
from federation.methods import METHODS, get_method
from federation.methods.baselines import BASELINES
from federation.run.runner import run_one


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


# ---- FedDyn against Acar et al. 2021, Algorithm 1 ---------------------------------

def _feddyn_quadratic(aggregation: str, rounds: int = 400):
    """Run the FedDyn class's hooks on quadratic client losses L_k = a_k/2 ||theta - c_k||^2,
    solving line 5 exactly: theta_k = (a_k c_k + g_k + alpha theta^{t-1}) / (a_k + alpha)."""
    from types import SimpleNamespace

    from federation.methods.baselines import FedDyn, FedDynParams

    torch.manual_seed(0)
    n, d, alpha = 5, 3, 0.5
    a = torch.tensor([0.5, 1.0, 2.0, 4.0, 8.0], dtype=torch.float64).unsqueeze(1)
    c = torch.randn(n, d, dtype=torch.float64) * 3
    ctx = SimpleNamespace(n=n, exchanged=("w",), n_train=torch.tensor([10, 20, 30, 40, 400]),
                          params={"w": torch.zeros(n, d, dtype=torch.float64)})
    m = FedDyn(FedDynParams(alpha=alpha, aggregation=aggregation))
    m.setup(ctx)
    theta = torch.zeros(n, d, dtype=torch.float64)  # every center holds the server model
    for r in range(rounds):
        ctx.round_start = {"w": theta.clone()}
        # line 5 exactly; the class's local term has gradient -g_k + alpha (theta - theta^{t-1})
        local = (a * c + m.g["w"] + alpha * theta) / (a + alpha)
        ctx.pre_exchange = {"w": local.clone()}
        plan = m.plan_round(ctx, r)
        mixed = {"w": plan.w.to(local.dtype) @ local}
        theta = m.after_mix(ctx, r, {"w": theta}, mixed)["w"]
    return theta, a, c, m


def test_feddyn_local_term_gradient_is_algorithm_1_line_5():
    from types import SimpleNamespace

    from federation.engine.mlp import Batch
    from federation.methods.baselines import FedDyn, FedDynParams

    m = FedDyn(FedDynParams(alpha=0.3))
    ctx = SimpleNamespace(exchanged=("w",), params={"w": torch.zeros(2, 4)})
    m.setup(ctx)
    m.g["w"] = torch.tensor([[1.0, -2.0, 0.5, 0.0], [0.0, 1.0, 1.0, 1.0]])
    ctx.round_start = {"w": torch.tensor([[0.1, 0.2, 0.3, 0.4], [1.0, 1.0, 1.0, 1.0]])}
    theta = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 2.0, 0.0, 2.0]], requires_grad=True)
    batch = Batch(torch.tensor([0, 1]), None, None, None, None, None, 0, 0, 0)
    loss = m.local_loss(ctx, {"w": theta}, batch)
    (grad,) = torch.autograd.grad(loss.sum(), [theta])
    expect = -m.g["w"] + 0.3 * (theta.detach() - ctx.round_start["w"])
    torch.testing.assert_close(grad, expect)


def test_feddyn_reaches_the_global_stationary_point_on_quadratics():
    """Acar et al. 2021, Sec. 3 / Thm 1: with exact local solutions the server model converges to
    argmin (1/m) sum_k L_k = sum a_k c_k / sum a_k (uniform), each g_k to grad L_k there, and
    h / alpha -> 0 at the fixed point mean_k theta_k = theta^{t-1}; averaging the local minimizers
    (FedAvg with exact local solves) would stop at mean c_k instead."""
    theta, a, c, m = _feddyn_quadratic("uniform")
    opt = (a * c).sum(0) / a.sum()
    torch.testing.assert_close(theta[0], opt, atol=1e-8, rtol=0)
    assert torch.allclose(theta, theta[0].expand_as(theta))
    torch.testing.assert_close(m.g["w"], a * (opt - c), atol=1e-8, rtol=0)
    assert float((c.mean(0) - opt).abs().max()) > 0.5  # the FedAvg point is elsewhere
    # sample-weighted variant: the stationary point of sum_k (n_k / n) L_k
    theta_w, a, c, _ = _feddyn_quadratic("weighted")
    p = torch.tensor([10, 20, 30, 40, 400], dtype=torch.float64).unsqueeze(1) / 500
    torch.testing.assert_close(theta_w[0], (p * a * c).sum(0) / (p * a).sum(), atol=1e-6, rtol=0)


def test_centralized_pools_one_encoding_and_early_stops(data):
    """The Centralized reference trains on one encoding fitted on the pooled train
    split (pooled rows have numeric mean 0 / std 1 as a whole) and early-stops on validation."""
    from etl.errors import InputError
    from federation.core.config import DataConfig

    cls = get_method("centralized")
    cfg = build_config("centralized", cls.default_config, None, rounds=3)
    assert cfg.data.preprocessing == "pooled" and cfg.early_stopping.enabled and cfg.max_rounds == 3
    pooled = data.with_preprocessing(cfg.data).pooled()
    from etl.schema import NUMERIC_FEATURES

    k = len(NUMERIC_FEATURES)
    x = pooled.splits["train"].x[0, :, :k].double()
    torch.testing.assert_close(x.mean(0), torch.zeros(k, dtype=torch.float64), atol=1e-5, rtol=0)
    sd = x.std(0, unbiased=False)
    varying = sd > 0  # a feature never observed encodes as 0 everywhere
    torch.testing.assert_close(sd[varying], torch.ones(int(varying.sum()), dtype=torch.float64), atol=1e-4, rtol=0)
    # per-center encodings differ from it: the federation's own rows are not what it trains on
    assert not torch.allclose(data.pooled().splits["train"].x, pooled.splits["train"].x)
    res = run_one(cfg, data, seed=3)
    assert res.total_bytes == 0 and res.metadata_bytes == 0 and 1 <= res.best_round <= res.rounds_run <= 3
    # exact pooled statistics are refused for a federated method
    bad = build_config("fedavg", {}, {"data": {"preprocessing": "pooled"}}, rounds=1)
    with pytest.raises(InputError, match="only the centralized reference"):
        run_one(bad, data, seed=3)
    # the federated encoding's aggregates are charged once, to round 1's metadata bytes
    fed = build_config("fedavg", {}, {"data": {"preprocessing": "federated"}}, rounds=2)
    res = run_one(fed, data, seed=3)
    nbytes = data.with_preprocessing(DataConfig(preprocessing="federated")).encoding_bytes
    assert res.metadata_bytes == nbytes > 0
    assert res.history[0]["cum_metadata_bytes"] == res.history[1]["cum_metadata_bytes"] == nbytes

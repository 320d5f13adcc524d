"""Mixing rows, bf16 wire format, FedAvg rank-one W, momentum, evaluate_mixtures."""

from __future__ import annotations

import pytest
import torch

from federation.core.config import build_config
from federation.core.ledger import Ledger
from federation.core.metrics import batched_auroc
from federation.data.synthetic import write_fedprox_cohort
from federation.data.tensors import FederatedData
from federation.engine.mixing import apply_momentum, check_row_stochastic, mix, wire
from federation.engine.mlp import StackedEngine, exchanged_keys, forward
from federation.methods import Context
from federation.methods.baselines import fedavg_matrix


def test_bf16_wire_rounds_received_values_only():
    x = torch.tensor([[1.0 + 2**-10], [3.0]])  # 1 + 2^-10 is not representable in bf16 (8 bits)
    assert float(wire(x, True)[0, 0]) == 1.0
    w = torch.tensor([[0.5, 0.5], [0.25, 0.75]])
    out = mix(w, x, bf16=True)
    # row 0: own copy fp32, peer 3.0 exact in bf16
    assert float(out[0, 0]) == pytest.approx(0.5 * (1 + 2**-10) + 1.5, abs=1e-7)
    # row 1 receives center 0 rounded to 1.0
    assert float(out[1, 0]) == pytest.approx(0.25 * 1.0 + 0.75 * 3.0, abs=1e-7)
    assert torch.equal(mix(w, x, bf16=False), w @ x)


def test_mixing_rows_and_fedavg_rank_one_is_weighted_mean():
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(4, 3, 5, generator=g)
    n_train = torch.tensor([10, 30, 40, 20])
    w = fedavg_matrix(n_train)
    check_row_stochastic(w)
    assert torch.linalg.matrix_rank(w) == 1
    out = mix(w, theta, bf16=False)
    mean = (theta * (n_train / n_train.sum()).view(4, 1, 1)).sum(0)
    for i in range(4):
        assert torch.allclose(out[i], mean, atol=1e-6)
    # a permutation-free sparse row: center 2 averages with center 0 only
    w2 = torch.eye(4, dtype=torch.float64)
    w2[2] = torch.tensor([0.5, 0.0, 0.5, 0.0])
    out2 = mix(w2, theta, bf16=False)
    assert torch.allclose(out2[2], (theta[0] + theta[2]) / 2) and torch.equal(out2[1], theta[1])
    with pytest.raises(ValueError):
        check_row_stochastic(torch.tensor([[0.5, 0.6], [0.5, 0.5]]))


def test_head_split_and_momentum():
    assert exchanged_keys(0) == ("w1", "b1", "w2", "b2", "w3", "b3")
    assert exchanged_keys(1) == ("w1", "b1", "w2", "b2")
    assert exchanged_keys(2) == ("w1", "b1")
    prev = {"a": torch.tensor([0.0])}
    out1, st = apply_momentum(prev, {"a": torch.tensor([2.0])}, None, 0.5)
    assert float(out1["a"]) == 1.0  # m = 0.5 * 2
    out2, st = apply_momentum({"a": torch.tensor([1.0])}, {"a": torch.tensor([1.0])}, st, 0.5)
    assert float(out2["a"]) == 1.5  # m = 0.5 * 1 + 0.5 * 0
    same, _ = apply_momentum(prev, {"a": torch.tensor([2.0])}, None, 0.0)
    assert float(same["a"]) == 2.0


def test_evaluate_mixtures_matches_manual(tmp_path):
    write_fedprox_cohort(tmp_path / "c", n_centers=5, seed=2, mean_size=100, shared=0.8)
    data = FederatedData.from_cohort(tmp_path / "c")
    cfg = build_config("fedavg-pq", {"exchange": {"head_layers": 1, "bf16_wire": True}}, None)
    eng = StackedEngine(data, cfg.engine, seed=1)
    g = torch.Generator().manual_seed(3)
    params = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in eng.init_params().items()}
    ctx = Context(cfg=cfg, data=data, engine=eng, seed=1, ledger=Ledger(5, 1), exchanged=exchanged_keys(1),
                  head=("w3", "b3"), bf16=True, pre_exchange=params)
    wc = torch.tensor([[0.5, 0.5, 0, 0, 0], [0, 0, 1.0, 0, 0], [0.2, 0.2, 0.2, 0.2, 0.2]], dtype=torch.float64)
    tc = torch.tensor([1, 2, 4])
    got = ctx.evaluate_mixtures(wc, tc, "val", chunk=2)
    s = data.splits["val"]
    for r in range(3):
        t = int(tc[r])
        model = {}
        for k, v in params.items():
            if k in ctx.exchanged:
                recv = v.to(torch.bfloat16).float()
                recv[t] = v[t]  # own copy stays fp32
                model[k] = (wc[r].float().view(-1, *[1] * (v.dim() - 1)) * recv).sum(0, keepdim=True)
            else:
                model[k] = v[t : t + 1]
        logits = forward(model, s.x[t : t + 1])[0]
        ref = batched_auroc(logits, s.y[t : t + 1], s.mask[t : t + 1])[0]
        assert float(got[r]) == pytest.approx(float(ref), abs=1e-9)


def test_variance_correction_restores_mean_input_variance():
    """Algorithm 3 (Tian et al. 2024) through the runtime's transform: a uniform average of
    n independent layers has ~1/n of their variance; the correction restores the mean."""
    from federation.core.variance import layer_variance, variance_correct
    from federation.engine.mixing import mix_params

    torch.manual_seed(0)
    n = 8
    params = {"w1": torch.randn(n, 64, 32) * torch.linspace(0.5, 1.5, n).view(n, 1, 1)}
    w = torch.full((n, n), 1.0 / n)
    mixed = mix_params(w, params, ("w1",), bf16=False)
    target = layer_variance(params["w1"]).mean()
    assert float(layer_variance(mixed["w1"])[0]) < float(target) / 4  # shrunk ~1/n
    fixed = variance_correct(w, params, mixed)
    got = layer_variance(fixed["w1"])
    assert torch.allclose(got, torch.full_like(got, float(target)), rtol=1e-5)
    # mean preserved, and identity mixing leaves every layer unchanged
    assert torch.allclose(fixed["w1"].mean(dim=(1, 2)), mixed["w1"].mean(dim=(1, 2)), atol=1e-6)
    eye = torch.eye(n)
    same = variance_correct(eye, params, mix_params(eye, params, ("w1",), bf16=False))
    assert torch.allclose(same["w1"], params["w1"], atol=1e-5)


def test_variance_correction_option_runs_in_the_round_loop(tmp_path):
    """`exchange.variance_correction` reaches the runner: after a FedAvg round every center holds
    the same average, rescaled to the mean variance of the centers' layers."""
    from federation.core.variance import layer_variance
    from federation.run.runner import run_one

    write_fedprox_cohort(tmp_path / "c", n_centers=5, seed=2, mean_size=100, shared=0.8)
    data = FederatedData.from_cohort(tmp_path / "c")
    plain = run_one(build_config("fedavg", {}, None, 1), data, seed=3, keep_params=True)
    vc_cfg = build_config("fedavg", {}, {"method": "fedavg", "exchange": {"variance_correction": True}}, 1)
    vc = run_one(vc_cfg, data, seed=3, keep_params=True)
    assert vc.rounds_run == 1 and vc.rel_bandwidth == plain.rel_bandwidth
    w_plain, w_vc = plain.params["w2"], vc.params["w2"]
    assert torch.allclose(w_vc[0], w_vc[1])                       # still a consensus
    assert float(layer_variance(w_vc)[0]) > float(layer_variance(w_plain)[0])  # variance restored upward


def _dense_mix(w, theta, bf16, own):
    """The exchange formula written out: sum_j w_rj wire(theta_j) + w_r,own (theta_own - wire(theta_own))."""
    sent = wire(theta, bf16)
    out = torch.einsum("mn,n...->m...", w.float(), sent)
    if bf16:
        out = out + w.float().gather(1, own[:, None]).view(-1, *[1] * (theta.dim() - 1)) * (theta - sent)[own]
    return out


@pytest.mark.parametrize("bf16", [False, True])
def test_mix_rank_one_and_sparse_paths_equal_dense(bf16):
    from federation.engine.mixing import sparse_rows

    g = torch.Generator().manual_seed(5)
    n = 24
    theta = torch.randn(n, 3, 5, generator=g)
    fed = fedavg_matrix(torch.randint(10, 100, (n,), generator=g))  # identical rows
    sp = torch.eye(n, dtype=torch.float64)  # each center with up to 2 partners (<= n / 8 members)
    for i in range(n):
        j, k = (i + 1) % n, (i + 7) % n
        sp[i, [i, j, k]] = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64) if i % 3 else torch.tensor(
            [1.0, 0.0, 0.0], dtype=torch.float64)
    own = torch.arange(n)
    for w in (fed, sp):
        assert torch.allclose(mix(w, theta, bf16), _dense_mix(w, theta, bf16, own), atol=1e-6)
    cols, vals = sparse_rows(sp)
    assert cols.shape == (n, 3) and torch.equal(vals.sum(1), sp.sum(1))
    assert cols[0].tolist() == [0, 0, 0] and vals[0].tolist() == [1.0, 0.0, 0.0]  # padded with its own column
    assert cols[1].tolist() == [1, 2, 8]


@pytest.mark.parametrize("head,bf16", [(0, False), (1, True), (2, True)])
def test_evaluate_mixtures_sparse_rows_equal_dense(tmp_path, monkeypatch, head, bf16):
    """ABPS-like coalition rows (target + up to 2 members of 24) take the pair-product path;
    it scores the same AUROC as the dense mixing path."""
    import federation.engine.mlp as mlp

    write_fedprox_cohort(tmp_path / "c", n_centers=24, seed=4, mean_size=80, shared=0.8)
    data = FederatedData.from_cohort(tmp_path / "c")
    cfg = build_config("fedavg", {"exchange": {"head_layers": head, "bf16_wire": bf16}}, None)
    eng = StackedEngine(data, cfg.engine, seed=1)
    g = torch.Generator().manual_seed(6)
    params = {k: v + 0.2 * torch.randn(v.shape, generator=g) for k, v in eng.init_params().items()}
    ctx = Context(cfg=cfg, data=data, engine=eng, seed=1, ledger=Ledger(24, 1), exchanged=exchanged_keys(head),
                  head=(), bf16=bf16, pre_exchange=params)
    tc = torch.arange(24).repeat_interleave(4)
    wc = torch.zeros(tc.numel(), 24, dtype=torch.float64)
    for r, t in enumerate(tc.tolist()):  # coalitions {t}, {t, a}, {t, b}, {t, a, b}
        a, b = (t + 3) % 24, (t + 11) % 24
        members = [[t], [t, a], [t, b], [t, a, b]][r % 4]
        wts = torch.rand(len(members), generator=g, dtype=torch.float64) + 0.1
        wc[r, members] = wts / wts.sum()
    got = ctx.evaluate_mixtures(wc, tc, "val", chunk=37)
    assert torch.equal(ctx.evaluate_mixtures(wc.to_sparse(), tc, "val", chunk=37).nan_to_num(-1), got.nan_to_num(-1))
    monkeypatch.setattr(mlp, "SPARSE_RATIO", 10**9)  # force the dense path, dense einsum mixing included
    monkeypatch.setattr("federation.engine.mixing.SPARSE_RATIO", 10**9)
    ref = ctx.evaluate_mixtures(wc, tc, "val", chunk=37)
    assert torch.isfinite(ref).sum() > 80
    assert torch.allclose(got, ref, atol=1e-9, equal_nan=True)

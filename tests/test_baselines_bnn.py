"""BNN+FL (federation.methods.bnn): KL, posterior aggregation, variance vs data, bytes, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import torch
import torch.nn.functional as F

import federation.run.runner
from federation.core.config import EngineConfig, build_config
from federation.data.synthetic import centers_table, generate_fedprox_cohort, write_fedprox_cohort
from federation.data.tensors import FederatedData
from federation.engine.mlp import PARAM_NAMES, AdamState, forward, n_params
from federation.methods import get_method
from federation.methods.bnn import (
    BnnFL,
    StackedBayesEngine,
    aggregate_posteriors,
    gaussian_kl,
    mean_posterior_sigma,
    rho_key,
    softplus_inv,
)
from federation.run.runner import run_one

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fedprox_cohort(tmp_path_factory.mktemp("bnn") / "c", n_centers=6, seed=4, mean_size=200, shared=0.8)


def test_registered() -> None:
    assert get_method("bnn-fl") is BnnFL


def test_gaussian_kl_matches_torch_distributions() -> None:
    g = torch.Generator().manual_seed(0)
    mu = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    sigma = torch.rand(3, 4, 5, generator=g, dtype=torch.float64) + 0.05
    ref = torch.distributions.kl_divergence(
        torch.distributions.Normal(mu, sigma), torch.distributions.Normal(torch.zeros_like(mu), 0.7 * torch.ones_like(mu))
    ).flatten(1).sum(1)
    torch.testing.assert_close(gaussian_kl(mu, sigma, 0.7), ref)
    # KL is zero exactly at the prior
    assert float(gaussian_kl(torch.zeros(1, 3), torch.full((1, 3), 0.7), 0.7).abs().max()) < 1e-6


def test_softplus_inverse() -> None:
    s = torch.tensor([1e-4, 0.01, 0.5, 3.0], dtype=torch.float64)
    torch.testing.assert_close(F.softplus(softplus_inv(s)), s)


def test_aggregate_posteriors_averages_means_and_variances() -> None:
    params = {}
    for k in PARAM_NAMES:
        params[f"mu_{k}"] = torch.tensor([[1.0], [3.0]])
        params[rho_key(k)] = softplus_inv(torch.tensor([[0.1], [0.3]]))
    w = torch.tensor([[0.25, 0.75], [0.25, 0.75]], dtype=torch.float64)
    out = aggregate_posteriors(params, w, ("w1", "b1"), bf16=False)
    assert set(out) == {"mu_w1", "rho_w1", "mu_b1", "rho_b1"}
    torch.testing.assert_close(out["mu_w1"], torch.tensor([[2.5], [2.5]]))
    # sigma^2 = 0.25 * 0.01 + 0.75 * 0.09 = 0.07
    torch.testing.assert_close(F.softplus(out["rho_w1"]) ** 2, torch.full((2, 1), 0.07), rtol=1e-5, atol=1e-7)


def _two_center_data() -> FederatedData:
    """Center A: 50 train rows, center B: 2000 train rows of the same distribution; same val/test rows."""
    coh, _ = generate_fedprox_cohort(1, alpha=0.0, beta=0.0, seed=3, mean_size=3200, size_sigma=0.0, intercept=0.0)
    tr, rest = coh.filter(pl.col("split") == "train"), coh.filter(pl.col("split") != "train")
    a = pl.concat([tr.head(50), rest.head(100)]).with_columns(pl.lit("A").alias("center_id"))
    b = pl.concat([tr.slice(50, 2000), rest.head(100)]).with_columns(pl.lit("B").alias("center_id"))
    both = pl.concat([a, b])
    return FederatedData.from_frames(both, centers_table(both))


def test_posterior_variance_shrinks_with_more_data() -> None:
    data = _two_center_data()
    assert data.n_train.tolist() == [50, 2000]
    # full-batch steps, so both centers take the same number of optimizer steps
    eng = StackedBayesEngine(data, EngineConfig(lr=0.01, batch_size=2000, local_epochs=100), seed=0,
                             prior_sigma=1.0, init_sigma=0.01)
    p = eng.init_params()
    st = AdamState.zeros_like(p)
    for r in range(4):
        eng.train_round(p, st, r)
    assert st.t.tolist() == [400, 400]
    sig = mean_posterior_sigma(p)
    assert sig[1] < sig[0]
    out_sigma = F.softplus(p[rho_key("w3")]).flatten(1).mean(1)  # output layer: every weight matters
    assert out_sigma[1] < 0.5 * out_sigma[0]
    x = data.splits["test"].x
    draws = torch.stack([forward(eng.sample(p, eng._noise(7, 2, 0, s, 0)), x)[0] for s in range(16)])
    pred_sd = draws.std(0).mean(1)
    assert pred_sd[1] < 0.5 * pred_sd[0]  # predictive (epistemic) spread shrinks too


def test_bnn_bytes_are_twice_fedavg(cohort: Path) -> None:
    data = FederatedData.from_cohort(cohort)
    cfg = build_config("bnn-fl", {}, {"reference_rounds": 2, "params": {"eval_samples": 2}}, 2)
    res = run_one(cfg, data, seed=11)
    payload = sum(n_params(data.d, (128, 64)).values())
    for h in res.history:
        assert h["edges"] == data.n_centers
        assert h["round_bytes"] == 2 * data.n_centers * payload * 4
    assert res.rel_bandwidth == pytest.approx(2.0, abs=1e-12)
    # 50 rounds of the same per-round cost against R_ref = 50: 2.00x
    assert 50 * res.history[0]["round_bytes"] / (data.n_centers * payload * 4 * 50) == pytest.approx(2.0)
    again = run_one(cfg, data, seed=11)
    assert again.history == res.history
    assert 0.0 <= res.final_auroc_mean <= 1.0


def test_bnn_head_personalization_and_bf16_halve_the_payload(cohort: Path) -> None:
    data = FederatedData.from_cohort(cohort)
    cfg = build_config("bnn-fl", {}, {"exchange": {"head_layers": 1, "bf16_wire": True},
                                      "params": {"eval_samples": 0}}, 1)
    res = run_one(cfg, data, seed=1)
    sizes = n_params(data.d, (128, 64))
    trunk = sum(v for k, v in sizes.items() if k not in ("w3", "b3"))
    assert res.history[0]["round_bytes"] == 2 * data.n_centers * trunk * 2


def test_momentum_is_rejected(cohort: Path) -> None:
    from etl.errors import InputError

    data = FederatedData.from_cohort(cohort)
    cfg = build_config("bnn-fl", {}, {"exchange": {"server_momentum": 0.5}}, 1)
    with pytest.raises(InputError, match="server_momentum"):
        run_one(cfg, data, seed=1)


def test_runner_trains_bnn_with_its_own_engine(cohort: Path) -> None:
    data = FederatedData.from_cohort(cohort)
    cfg = build_config("bnn-fl", {}, {"reference_rounds": 1, "params": {"eval_samples": 0}}, 1)
    assert federation.run.runner.run_one(cfg, data, 11).rel_bandwidth == pytest.approx(2.0)
    assert isinstance(BnnFL().make_engine(data, cfg, 11), StackedBayesEngine)


def test_cli_train_end_to_end(cohort: Path, tmp_path: Path) -> None:
    from cli.app import main

    out = tmp_path / "bnn.json"
    main(["train", "--method", "bnn-fl", "--cohort", str(cohort), "--rounds", "2", "--seeds", "11", "--output",
          str(out), "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--no-progress", "--config",
          str(Path(__file__).resolve().parents[1] / "configs" / "bnn-fl.yaml")])
    doc = json.loads(out.read_text())
    assert doc["seeds"]["11"]["rel_bandwidth"] == pytest.approx(2 * 2 / 50)

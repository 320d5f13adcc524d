"""BNN+FL: federated mean-field Bayesian MLP (ABPS paper Sec. 6.2, "Bayesian FL", Saile et al. 2024 style).

Design notes: docs/runtime.md, "Module notes".
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from etl.errors import InputError
from federation.core.config import EngineConfig, NumbersNotFlags, RunConfig
from federation.core.seeding import mix_seed
from federation.data.tensors import FederatedData
from federation.engine.mixing import mix
from federation.engine.mlp import PARAM_NAMES, AdamState, StackedEngine, StackedParams, forward, init_params
from federation.methods.base import Context, Method, RoundPlan
from federation.methods.baselines import fedavg_matrix
from federation.methods.registry import register


def softplus_inv(sigma: torch.Tensor) -> torch.Tensor:
    """``rho`` with ``softplus(rho) = sigma`` (sigma > 0): ``sigma + log(-expm1(-sigma))``."""
    return sigma + torch.log(-torch.expm1(-sigma))


def gaussian_kl(mu: torch.Tensor, sigma: torch.Tensor, prior_sigma: float) -> torch.Tensor:
    """``KL(N(mu, sigma^2) || N(0, s^2))`` summed over all but the leading (center) axis.

    ``sum log(s / sigma) + (sigma^2 + mu^2) / (2 s^2) - 1/2`` (Kingma & Welling 2014, App. B,
    per coordinate). ``mu``, ``sigma``: ``[a, ...]``; returns ``[a]``.
    """
    s2 = prior_sigma**2
    kl = math.log(prior_sigma) - torch.log(sigma) + (sigma**2 + mu**2) / (2.0 * s2) - 0.5
    return kl.flatten(1).sum(1)


class BnnParams(NumbersNotFlags):
    """BNN+FL parameters.

    ``prior_sigma``: s of the prior N(0, s^2); ``init_sigma``: sigma of every weight at
    initialization (rho = softplus^-1(init_sigma); the means start from the runtime MLP's
    initial draw); ``eval_samples``: weight draws of the predictive mean at evaluation (0 =
    posterior-mean network).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    prior_sigma: float = Field(1.0, gt=0.0)
    init_sigma: float = Field(0.01, gt=0.0)
    eval_samples: int = Field(8, ge=0)


def mu_key(k: str) -> str:
    """Name of the posterior mean of parameter ``k`` (e.g. ``mu_w1``)."""
    return f"mu_{k}"


def rho_key(k: str) -> str:
    """Name of the posterior scale parameter of ``k`` (e.g. ``rho_w1``)."""
    return f"rho_{k}"


class StackedBayesEngine(StackedEngine):
    """Bayes-by-Backprop training of all centers' mean-field MLPs in one computation.

    Parameters: ``mu_<k>`` and ``rho_<k>`` for every k in ``PARAM_NAMES``, each with the shape of
    the runtime MLP's ``<k>`` (leading center axis). Batching follows :class:`StackedEngine`
    exactly (per-center permutation streams, centers ordered by size, a center with no rows left
    sits a step out, per-center Adam state and step count); the weight noise of a step is one
    draw keyed by (seed, round, epoch, step) over the active centers, each using its own slice.

    Args:
        data, cfg, seed: as :class:`StackedEngine` (cfg's dropout and weight decay are not used).
        prior_sigma, init_sigma: see :class:`BnnParams`.
    """

    def __init__(self, data: FederatedData, cfg: EngineConfig, seed: int, prior_sigma: float = 1.0,
                 init_sigma: float = 0.01) -> None:
        super().__init__(data, cfg.model_copy(update={"weight_decay": 0.0, "dropout": 0.0}), seed)
        self.prior_sigma = float(prior_sigma)
        self.init_sigma = float(init_sigma)

    def init_params(self) -> StackedParams:
        """``mu_<k>`` = the runtime MLP's initial draw, ``rho_<k>`` = softplus^-1(init_sigma)."""
        base = init_params(self.data.d, self.hidden, self.n, self.seed)
        rho0 = float(softplus_inv(torch.tensor(self.init_sigma, dtype=torch.float64)))
        out: StackedParams = {}
        for k in PARAM_NAMES:
            out[mu_key(k)] = base[k]
            out[rho_key(k)] = torch.full_like(base[k], rho0)
        return out

    @staticmethod
    def sigma(params: StackedParams, k: str) -> torch.Tensor:
        """Posterior standard deviation ``softplus(rho_<k>)``."""
        return F.softplus(params[rho_key(k)])

    def _noise(self, tag: int, a: int, round_idx: int, epoch: int, step: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(mix_seed(self.seed, round_idx, epoch, step, tag))
        dims = {"w1": (self.data.d, self.hidden[0]), "b1": (self.hidden[0],), "w2": self.hidden,
                "b2": (self.hidden[1],), "w3": (self.hidden[1], 1), "b3": (1,)}
        return {k: torch.randn(a, *dims[k], generator=g) for k in PARAM_NAMES}

    def sample(self, params: StackedParams, eps: dict[str, torch.Tensor]) -> StackedParams:
        """Reparameterized weights ``mu + softplus(rho) * eps`` (stacked, keys ``PARAM_NAMES``)."""
        return {k: params[mu_key(k)] + self.sigma(params, k) * eps[k] for k in PARAM_NAMES}

    def kl(self, params: StackedParams) -> torch.Tensor:
        """``[a]`` KL(q || prior) of each center's whole network."""
        return sum(gaussian_kl(params[mu_key(k)], self.sigma(params, k), self.prior_sigma)  # type: ignore[return-value]
                   for k in PARAM_NAMES)

    def train_round(self, params: StackedParams, state: AdamState, round_idx: int, local_loss: Any = None) -> StackedParams:
        """``local_epochs`` epochs of Bayes-by-Backprop for every center (in place); returns ``params``.

        Per step and active center: ``mean_batch BCE + KL / n_train_i``; Adam on mu and rho.
        """
        if local_loss is not None:
            raise TypeError("StackedBayesEngine takes no extra local loss")
        order, x_all, y_all, n_rows = self._sorted_train()
        max_rows = x_all.shape[1]
        bs = self.cfg.batch_size
        keys = list(params)
        ps = {k: params[k][order] for k in keys}
        st = AdamState({k: state.m[k][order] for k in keys}, {k: state.v[k][order] for k in keys}, state.t[order])
        n_tr = n_rows.double()
        for epoch in range(self.cfg.local_epochs):
            perm = self.streams.permutations(n_rows, max_rows, round_idx, epoch, centers=order)
            for step in range(self.steps_per_epoch()):
                lo = step * bs
                a = int((n_rows > lo).sum())
                cols = perm[:a, lo : lo + bs]
                width = cols.shape[1]
                rows = (lo + torch.arange(width)).unsqueeze(0) < n_rows[:a].unsqueeze(1)
                ar = torch.arange(a).unsqueeze(1)
                xb, yb = x_all[ar, cols], y_all[ar, cols]
                sub = {k: ps[k][:a].detach().requires_grad_(True) for k in keys}
                w = self.sample(sub, self._noise(0xBB, a, round_idx, epoch, step))
                logits = forward(w, xb)[0]
                bce = F.binary_cross_entropy_with_logits(logits, yb, reduction="none")
                rowsf = rows.to(bce.dtype)
                loss_c = (bce * rowsf).sum(1) / rowsf.sum(1) + (self.kl(sub) / n_tr[:a]).to(bce.dtype)
                grads = torch.autograd.grad(loss_c.sum(), [sub[k] for k in keys])
                with torch.no_grad():
                    self.adam_step(ps, dict(zip(keys, grads)), st, a)
        return self.scatter_back(params, state, ps, st, order, keys)

    @torch.no_grad()
    def predict_proba(self, params: StackedParams, split: str, samples: int, round_idx: int = 0) -> torch.Tensor:
        """``[n, rows]`` predictive mean probability on ``split``: ``mean_s sigmoid(f(x; w_s))``
        over ``samples`` weight draws keyed by (seed, round, split); samples = 0 uses the
        posterior means."""
        x = self.data.splits[split].x
        if samples == 0:
            return torch.sigmoid(forward({k: params[mu_key(k)] for k in PARAM_NAMES}, x)[0])
        tag = 0xE0 + ("train", "val", "test").index(split)
        acc = torch.zeros(x.shape[0], x.shape[1])
        mu = {k: params[mu_key(k)] for k in PARAM_NAMES}
        sigma = {k: self.sigma(params, k) for k in PARAM_NAMES}  # once, not once per draw
        for s in range(samples):
            eps = self._noise(tag, self.n, round_idx, s, 0)
            w = {k: mu[k] + sigma[k] * eps[k] for k in PARAM_NAMES}  # = self.sample(params, eps)
            acc += torch.sigmoid(forward(w, x)[0])
        return acc / samples


def aggregate_posteriors(params: StackedParams, w: torch.Tensor, keys: tuple[str, ...], bf16: bool) -> StackedParams:
    """Mix posterior means and variances with the row-stochastic ``w [n, n]``.

    ``mu_i <- sum_j w_ij mu_j`` and ``sigma_i^2 <- sum_j w_ij sigma_j^2`` for every k in ``keys``
    (the bf16 wire transform of :func:`federation.engine.mixing.mix` applies to both payloads);
    returns the new ``mu_<k>`` and ``rho_<k> = softplus^-1(sigma)`` tensors.
    """
    out: StackedParams = {}
    for k in keys:
        out[mu_key(k)] = mix(w, params[mu_key(k)], bf16)
        var = mix(w, F.softplus(params[rho_key(k)]) ** 2, bf16).clamp_min(1e-30)
        out[rho_key(k)] = softplus_inv(var.sqrt())
    return out


def mean_posterior_sigma(params: StackedParams) -> torch.Tensor:
    """``[n]`` mean posterior standard deviation over all weights of each center's network."""
    tot = sum(F.softplus(params[rho_key(k)]).flatten(1).sum(1) for k in PARAM_NAMES)
    cnt = sum(params[rho_key(k)][0].numel() for k in PARAM_NAMES)
    return tot / cnt  # type: ignore[operator]


@register(display_name="BNN+FL", family="star", paper_order=9)
class BnnFL(Method):
    """BNN+FL (ABPS paper Sec. 6.2 / Table 1; Saile et al. 2024 style): mean-field Bayesian MLP
    trained by Bayes by Backprop, FedAvg of posterior means and variances (2.00x FedAvg's bytes).

    It runs in the one round loop (:func:`federation.run.runner.run_one`) through hooks: its engine
    is :class:`StackedBayesEngine` (:meth:`make_engine`), each round's plan is FedAvg's star
    ``W = 1 p^T`` with n server links, :meth:`aggregate` mixes posterior means and variances over
    the exchanged block (:func:`aggregate_posteriors`; ``exchange.head_layers`` keeps the head's
    posterior local, ``bf16_wire`` rounds both payloads), each link carries 2 payloads
    (``payloads_per_link``), and AUROC ranks the predictive mean (:meth:`scores`). Extra metric:
    ``posterior_sigma`` (mean sigma over weights and centers).

    Raises:
        InputError: (:meth:`check_config`, before a run starts) ``exchange.server_momentum`` > 0 or
            ``exchange.variance_correction`` (neither is defined for posterior moments).
    """

    name = "bnn-fl"
    seconds_per_round = 2.40
    has_server = True
    Params: ClassVar[type[BaseModel]] = BnnParams
    payloads_per_link = 2

    def make_engine(self, data: FederatedData, cfg: RunConfig, seed: int) -> StackedEngine:
        p: BnnParams = self.p  # type: ignore[assignment]
        return StackedBayesEngine(data, cfg.engine, seed, p.prior_sigma, p.init_sigma)

    @classmethod
    def check_config(cls, cfg: RunConfig) -> None:
        super().check_config(cfg)
        if cfg.exchange.server_momentum > 0:
            raise InputError("bnn-fl: exchange.server_momentum is not supported (set it to 0)")
        if cfg.exchange.variance_correction:
            raise InputError("bnn-fl: exchange.variance_correction is not supported (set it to false)")

    def setup(self, ctx: Context) -> None:
        self.w = fedavg_matrix(ctx.n_train)

    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        return RoundPlan(w=self.w, server_links=ctx.n)

    def aggregate(self, ctx: Context, w: torch.Tensor, params: StackedParams) -> StackedParams:
        return aggregate_posteriors(params, w, ctx.exchanged, ctx.bf16)

    score_kind = "probability"  # scores are predictive-mean probabilities (federation.core.evaluation)

    def scores(self, ctx: Context, params: StackedParams, split: str, round_idx: int) -> torch.Tensor:
        """``[n, rows]`` predictive mean probability (:meth:`StackedBayesEngine.predict_proba`,
        ``eval_samples`` weight draws keyed by the round)."""
        return ctx.engine.predict_proba(params, split, self.p.eval_samples, round_idx)  # type: ignore[attr-defined]

    def after_exchange(self, ctx: Context, round_idx: int, plan: RoundPlan) -> dict[str, float]:
        return {"posterior_sigma": float(mean_posterior_sigma(ctx.params).mean())}


__all__ = ["BnnFL", "BnnParams", "StackedBayesEngine", "aggregate_posteriors", "gaussian_kl", "mean_posterior_sigma",
           "softplus_inv"]

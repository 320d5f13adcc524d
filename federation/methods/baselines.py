"""Baseline methods of the ABPS paper's Table 1 (Sec. 6.2), as mixing matrices and loss terms."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import ConfigDict, Field

from federation.core.config import NumbersNotFlags
from federation.engine.mlp import Batch, StackedParams, forward
from federation.methods.base import Context, Method, RoundPlan
from federation.methods.registry import register


def fedavg_matrix(n_train: torch.Tensor) -> torch.Tensor:
    """FedAvg's rank-one mixing matrix ``W = 1 p^T`` with ``p_j = n_j / sum_k n_k``
    (McMahan et al. 2017, Alg. 1: ``w_{t+1} = sum_k (n_k / n) w^k_{t+1}``). ``[n, n]`` float64."""
    p = n_train.double() / n_train.double().sum()
    return p.unsqueeze(0).expand(n_train.shape[0], -1).clone()


def _sq_dist(params: StackedParams, ref: StackedParams, keys: tuple[str, ...]) -> torch.Tensor:
    """``[a]`` squared L2 distance per center over ``keys``."""
    return sum(((params[k] - ref[k]) ** 2).flatten(1).sum(1) for k in keys)  # type: ignore[return-value]


@register(display_name="Local-only (lower bound)", family="local", paper_order=1)
class LocalOnly(Method):
    """Local-only: each center trains on its own data and never exchanges
    (Table 1's no-collaboration lower bound). ``W = I``, no edges, zero bytes."""

    name = "local"
    seconds_per_round = 0.50
    exchanges = False

    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        return RoundPlan(w=None)


@register(display_name="Centralized (non-federated upper bound)", family="centralized", paper_order=20)
class Centralized(Method):
    """Centralized: one MLP trained on the union of all centers' train rows (non-federated
    upper bound, Table 1 caption); evaluated on every center's own test split. No model
    crosses the network in this reference, so the ledger stays at zero.

    Pools honestly: one numeric encoding fitted on the pooled train split
    (``data.preprocessing: pooled``) and training to convergence with validation early stopping
    (mean per-center val AUROC, patience 10, best round restored) instead of a fixed round count
    that over-fits the pooled rows."""

    name = "centralized"
    seconds_per_round = 0.55
    pooled = True
    exchanges = False
    default_config: ClassVar[dict[str, Any]] = {
        "data": {"preprocessing": "pooled"},
        "early_stopping": {"enabled": True, "patience": 10, "max_rounds": 100},
    }

    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        return RoundPlan(w=None)


@register(display_name="FedAvg", family="star", paper_order=2)
class FedAvg(Method):
    """FedAvg (McMahan et al. 2017, Alg. 1, full participation C = 1): after local training
    every center receives the sample-weighted mean ``sum_k (n_k / n) theta_k`` of the
    exchanged block; a star of n center-server edges carries a model each round."""

    name = "fedavg"
    has_server = True

    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        return RoundPlan(w=fedavg_matrix(ctx.n_train), server_links=ctx.n)


@register(display_name="FedAvg+P+Q", family="star", paper_order=14)
class FedAvgPQ(FedAvg):
    """FedAvg+P+Q (ABPS paper Sec. 6.4, Table 1): FedAvg with the last layer personalized
    (Arivazhagan et al. 2019) and a bfloat16 wire format; bandwidth 0.5 x trunk share."""

    name = "fedavg-pq"
    seconds_per_round = 0.60
    default_config: ClassVar[dict[str, Any]] = {"exchange": {"head_layers": 1, "bf16_wire": True}}


@register(display_name="FedAvg-X (fair comp., full)", family="star", paper_order=19)
class FedAvgX(FedAvg):
    """FedAvg-X (ABPS paper Sec. 6.4, "fair comparator"): FedAvg with a 2-layer personalized
    head, bf16 wire, server EMA momentum beta = 0.5 and validation-AUROC early stopping
    (patience 10, at most 100 rounds)."""

    name = "fedavg-x"
    seconds_per_round = 0.70
    default_config: ClassVar[dict[str, Any]] = {
        "exchange": {"head_layers": 2, "bf16_wire": True, "server_momentum": 0.5},
        "early_stopping": {"enabled": True, "patience": 10, "max_rounds": 100},
    }


class FedProxParams(NumbersNotFlags):
    """FedProx's proximal weight mu."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    mu: float = Field(0.001, ge=0.0, description="proximal weight mu of Li et al. 2020, Eq. 2")  # tuned on validation (configs/fedprox.yaml)


@register(display_name="FedProx", family="star", paper_order=3)
class FedProx(FedAvg):
    """FedProx (Li et al. 2020, Eq. 2 / Alg. 2): center k minimizes
    ``h_k(w; w^t) = F_k(w) + (mu / 2) ||w - w^t||^2`` where ``w^t`` is the model it received
    at the start of the round; aggregation as FedAvg (sample-weighted)."""

    name = "fedprox"
    seconds_per_round = 0.80
    Params = FedProxParams

    def local_loss(self, ctx: Context, params: StackedParams, batch: Batch) -> torch.Tensor:
        ref = {k: ctx.round_start[k][batch.centers] for k in ctx.exchanged}
        return 0.5 * self.p.mu * _sq_dist(params, ref, ctx.exchanged)  # type: ignore[attr-defined]


class FedDynParams(NumbersNotFlags):
    """FedDyn's regularization weight alpha and its averaging.

    ``aggregation``: ``uniform`` (Acar et al. 2021, Alg. 1: ``(1/m) sum_k`` over the
    participating clients; the paper's global objective is the unweighted mean of the client
    losses) or ``weighted`` (``sum_k (n_k / n)``: FedAvg's weights, the objective FedAvg and
    the per-center AUROC of Table 1 effectively optimize on very unequal centers)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    alpha: float = Field(0.1, gt=0.0, description="regularization weight alpha of Acar et al. 2021, Alg. 1")  # tuned on validation (configs/feddyn.yaml)
    aggregation: Literal["uniform", "weighted"] = "uniform"


def feddyn_client_grad(g: torch.Tensor, theta_k: torch.Tensor, theta_prev: torch.Tensor,
                       alpha: float) -> torch.Tensor:
    """Client state update of FedDyn (Acar et al. 2021, Alg. 1 line 6):
    ``grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1})``.

    Exact when ``theta_k^t`` minimizes the local objective of line 5 (first-order condition);
    shapes ``[n, ...]`` (``theta_prev``: the model each center received)."""
    return g - alpha * (theta_k - theta_prev)


def feddyn_server(h: torch.Tensor, mean_theta: torch.Tensor, theta_prev: torch.Tensor,
                  alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Server step of FedDyn (Acar et al. 2021, Alg. 1 lines 8-9), full participation:
    ``h^t = h^{t-1} - alpha (mean_k theta_k^t - theta^{t-1})`` and
    ``theta^t = mean_k theta_k^t - h^t / alpha``. ``mean_theta`` is the (uniform or weighted)
    average of the clients' models. Returns ``(h^t, theta^t)``, shapes as the inputs."""
    h = h - alpha * (mean_theta - theta_prev)
    return h, mean_theta - h / alpha


@register(display_name="FedDyn", family="star", paper_order=4)
class FedDyn(Method):
    """FedDyn (Acar et al. 2021, Alg. 1), full participation (P_t = all n centers).

    Center k minimizes ``L_k(theta) - <g_k, theta> + (alpha/2) ||theta - theta^{t-1}||^2``
    (Eq. 1 / Alg. 1 line 5; L_k the mean batch loss, as the paper's empirical risk), then
    updates its linear term ``g_k <- g_k - alpha (theta_k^t - theta^{t-1})``
    (:func:`feddyn_client_grad`). The server keeps ``h`` and sends
    ``theta^t = avg_k theta_k^t - h^t / alpha`` (:func:`feddyn_server`): the mixing matrix
    (uniform ``1 1^T / n`` by default, FedAvg's sample weights with ``aggregation: weighted``)
    followed by the correction in :meth:`after_mix`. The state h is stored per receiving center
    (identical rows), so it composes with the wire transform.

    Line 5 assumes an exact local minimizer; the runtime takes 2 epochs of Adam
    (docs/baselines.md, "FedDyn against its paper" for what this does to ``h``).
    """

    name = "feddyn"
    seconds_per_round = 1.00
    has_server = True
    Params = FedDynParams

    def setup(self, ctx: Context) -> None:
        self.g = {k: torch.zeros_like(ctx.params[k]) for k in ctx.exchanged}
        self.h = {k: torch.zeros_like(ctx.params[k]) for k in ctx.exchanged}

    def local_loss(self, ctx: Context, params: StackedParams, batch: Batch) -> torch.Tensor:
        a = self.p.alpha  # type: ignore[attr-defined]
        idx = batch.centers
        lin = sum((self.g[k][idx] * params[k]).flatten(1).sum(1) for k in ctx.exchanged)
        ref = {k: ctx.round_start[k][idx] for k in ctx.exchanged}
        return -lin + 0.5 * a * _sq_dist(params, ref, ctx.exchanged)

    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        a = self.p.alpha  # type: ignore[attr-defined]
        for k in ctx.exchanged:
            self.g[k] = feddyn_client_grad(self.g[k], ctx.pre_exchange[k], ctx.round_start[k], a)
        if self.p.aggregation == "weighted":  # type: ignore[attr-defined]
            w = fedavg_matrix(ctx.n_train)
        else:
            w = torch.full((ctx.n, ctx.n), 1.0 / ctx.n, dtype=torch.float64)
        return RoundPlan(w=w, server_links=ctx.n)

    def after_mix(self, ctx: Context, round_idx: int, prev: StackedParams, mixed: StackedParams) -> StackedParams:
        a = self.p.alpha  # type: ignore[attr-defined]
        out = {}
        for k in mixed:
            self.h[k], out[k] = feddyn_server(self.h[k], mixed[k], prev[k], a)
        return out


class MoonParams(NumbersNotFlags):
    """MOON's contrastive weight mu and temperature tau."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    mu: float = Field(0.1, ge=0.0, description="weight mu of the contrastive loss l_con (Li, He, Song 2021, Eq. 3)")  # tuned on validation (configs/moon.yaml, docs/baselines.md)
    temperature: float = Field(1.0, gt=0.0, description="temperature tau of l_con (Eq. 3)")  # tuned on validation (configs/moon.yaml)


@register(display_name="MOON", family="star", paper_order=5)
class Moon(FedAvg):
    """MOON (Li, He, Song 2021, Eq. 3-4): center i adds
    ``mu * l_con`` with ``l_con = -log( exp(sim(z, z_glob)/tau) /
    (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )``, where z is the representation
    (trunk output: the second hidden layer, input of the last linear layer) of the model
    being trained, z_glob that of the model received at the start of the round, z_prev that
    of the center's own local model after its previous round of training (round 0: the
    received model), sim = cosine similarity; the frozen models run in eval mode.
    Aggregation as FedAvg."""

    name = "moon"
    seconds_per_round = 1.15
    Params = MoonParams

    def setup(self, ctx: Context) -> None:
        self.prev_local: StackedParams | None = None

    def local_loss(self, ctx: Context, params: StackedParams, batch: Batch) -> torch.Tensor:
        idx = batch.centers
        with torch.no_grad():
            z_glob = forward({k: v[idx] for k, v in ctx.round_start.items()}, batch.x)[1]
            prev = self.prev_local if self.prev_local is not None else ctx.round_start
            z_prev = forward({k: v[idx] for k, v in prev.items()}, batch.x)[1]
        tau = self.p.temperature  # type: ignore[attr-defined]
        s_g = F.cosine_similarity(batch.rep, z_glob, dim=-1) / tau
        s_p = F.cosine_similarity(batch.rep, z_prev, dim=-1) / tau
        l_con = F.softplus(s_p - s_g)  # = -log(e^{s_g} / (e^{s_g} + e^{s_p}))
        rows = batch.rows.to(l_con.dtype)
        return self.p.mu * (l_con * rows).sum(1) / rows.sum(1)  # type: ignore[attr-defined]

    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        self.prev_local = {k: v.clone() for k, v in ctx.pre_exchange.items()}
        return super().plan_round(ctx, round_idx)


BASELINES: tuple[type[Method], ...] = (Centralized, LocalOnly, FedAvg, FedProx, FedDyn, Moon, FedAvgPQ, FedAvgX)

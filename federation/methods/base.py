"""The method interface the round loop (:mod:`federation.run.runner`) calls.

A method is a small object holding its own state; the runner holds none of it. Per run:

1. ``method = cls(cls.Params(**config.params))`` then ``method.setup(ctx)`` once.
2. Each round ``r`` (0-based; MLflow step r + 1):

   a. local training of all centers (stacked). If the class overrides
      ``local_loss(ctx, params, batch) -> Tensor [a]``, the engine adds it to each active
      center's batch loss (``params``: the active centers' stacked parameters with
      gradient; ``batch``: :class:`federation.engine.mlp.Batch`, ``batch.centers`` = their
      indices);
   b. ``plan = method.plan_round(ctx, r)`` -> :class:`RoundPlan`: ``w`` ``[n, n]``
      row-stochastic (None = no exchange this round), the peer ``adjacency`` ``[n, n]`` bool
      (symmetric; edges that carried a model, for the ledger), ``server_links`` (center-server
      edges that carried a model: FedAvg n), ``probe_bytes``, ``metadata_bytes``;
   c. exchange: ``mixed = W @ wire(theta)`` over the exchanged block
      (:mod:`federation.engine.mixing`), then ``method.after_mix(ctx, r, prev, mixed)`` (default
      identity; FedDyn's server correction), then server momentum when configured;
   d. ``extras = method.after_exchange(ctx, r, plan)`` -> ``dict[str, float]`` logged with the
      round's metrics (e.g. isolation rate; ABPS computes Shapley credit here with
      ``ctx.evaluate_mixtures``);
   e. metrics (val/test AUROC mean/std, bytes), early stopping.

``ctx`` (:class:`Context`) gives: ``n``, ``data``, ``engine``, ``seed``, ``rng`` (a
``torch.Generator`` seeded from the run seed, for the method's own draws), ``ledger``,
``cfg``, ``meta`` ``[n, 15]`` and ``meta_base`` ``[n, 3]`` (centers.parquet metadata vectors),
``n_train`` ``[n]``, ``params`` (live stacked parameters), ``round_start`` (a copy at the start
of the round), ``pre_exchange`` (a copy after local training, i.e. the models sent this round),
``exchanged`` / ``head`` key tuples, ``bf16``, ``available`` (``[n]`` bool centers up this round
under a ``realworld:`` block, else None: a method must not pair with an unavailable center), :meth:`Context.evaluate` (per-center AUROC of
the live or given parameters) and :meth:`Context.evaluate_mixtures`.

Methods override hooks, never the loop. Besides the ones above: ``make_engine(data, cfg, seed)``
builds the stacked trainer (default :class:`federation.engine.mlp.StackedEngine`; BNN+FL's Bayesian
MLP engine), ``aggregate(ctx, w, params)`` forms the exchanged block from ``W`` (default
``W @ wire(theta)`` over ``ctx.exchanged``; BNN+FL mixes posterior means and variances),
``scores(ctx, params, split, round_idx)`` gives the per-row scores AUROC is computed from
(default the engine's logits; BNN+FL's predictive mean), and ``payloads_per_link`` counts the
payloads one model transfer carries (BNN+FL: 2). A method object may expose
``artifacts``: a mapping ``{file name: JSON-able object}`` or a hook ``artifacts(ctx) ->
mapping`` called once after the last round (aggregates keyed by center_id only); the runner
logs each entry as an MLflow artifact of the seed's run. A method object may also define
``final_metrics(ctx) -> dict`` (called once after the last round; aggregates keyed by
center_id only): the runner stores it as ``method_summary`` in the seed's results.json entry
and logs its numeric entries as final MLflow metrics (ABPS: per-seed isolation figures).

Register a method class with the decorator :func:`federation.methods.registry.register`
(``@register(display_name=..., family=..., paper_order=...)``).
Class attributes: ``name``, ``display_name`` (Table 1 row name), ``family`` (Figure 3 colour
group), ``paper_order`` (Table 1 row index, None when the paper has no such row), ``Params`` (pydantic model of the method's own parameters,
from the config's ``params:`` mapping), ``default_config`` (a partial run config merged under
the user's: e.g. FedAvg-X turns on a 2-layer head, bf16, momentum, early stopping) and
``pooled`` (True only for Centralized: one model trained on the union of train rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, cast

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict

from federation.core.config import RunConfig
from federation.data.tensors import FederatedData
from federation.engine.mlp import PARAM_NAMES, Batch, StackedParams, StackedEngine, forward
from federation.engine.build import build_engine
from federation.core.ledger import Ledger
from federation.core.metrics import batched_auroc
from federation.engine.mixing import SPARSE_RATIO, mix, mix_params, sparse_rows, wire


class NoParams(BaseModel):
    """A method without parameters of its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass
class RoundPlan:
    """What a method decides for one round.

    Attributes:
        w: ``[n, n]`` row-stochastic mixing matrix (float32/float64), or None for no exchange.
        adjacency: ``[n, n]`` bool symmetric peer edges that carried a model (ledger), or None.
        server_links: number of center-server edges that carried a model (star topologies).
        probe_bytes: probe traffic this round (e.g. anchor predictions).
        metadata_bytes: metadata traffic this round (e.g. ABPS v_i vectors).
    """

    w: torch.Tensor | None
    adjacency: torch.Tensor | None = None
    server_links: int = 0
    probe_bytes: int = 0
    metadata_bytes: int = 0


@dataclass
class Context:
    """Run context handed to every hook (see the module docstring)."""

    cfg: RunConfig
    data: FederatedData
    engine: StackedEngine
    seed: int
    ledger: Ledger
    exchanged: tuple[str, ...]
    head: tuple[str, ...]
    bf16: bool
    params: StackedParams = field(default_factory=dict)
    round_start: StackedParams = field(default_factory=dict)
    pre_exchange: StackedParams = field(default_factory=dict)
    rng: torch.Generator = field(default_factory=torch.Generator)
    #: ``[n]`` bool centers available this round (federation/run/realworld.py); None = all (no realworld block)
    available: torch.Tensor | None = None

    @property
    def n(self) -> int:
        """Number of centers."""
        return self.data.n_centers

    @property
    def meta(self) -> torch.Tensor:
        """``[n, 15]`` metadata vectors (centers.parquet META_COLUMNS)."""
        return self.data.meta

    @property
    def meta_base(self) -> torch.Tensor:
        """``[n, 3]`` base metadata vectors (pos rate, ln n_train, year / 2030)."""
        return self.data.meta_base

    @property
    def n_train(self) -> torch.Tensor:
        """``[n]`` train rows per center."""
        return self.data.n_train

    @torch.no_grad()
    def evaluate(self, split: str = "val", params: StackedParams | None = None) -> torch.Tensor:
        """``[n]`` float64 per-center AUROC of ``params`` (default: the live ``ctx.params``) on
        each center's own ``split``; NaN for a one-class center."""
        p = params if params is not None else self.params
        return self.data.split_metric(self.engine.predict(p, split), split)  # accuracy on image clients

    @torch.no_grad()
    def evaluate_mixtures(
        self, wc: torch.Tensor, tc: torch.Tensor, split: str = "val", params: StackedParams | None = None,
        chunk: int = 512,
    ) -> torch.Tensor:
        """AUROC of many candidate mixtures in one batched computation.

        Row r builds the model whose exchanged block is ``sum_j wc[r, j] wire(theta_j)``
        (the bf16 wire transform as in the exchange; center tc[r]'s own copy stays fp32)
        and whose head (if personalized) is center ``tc[r]``'s own, and scores it on
        ``tc[r]``'s ``split``. ``theta`` defaults to ``ctx.pre_exchange``: the models as
        sent this round (after local training, before mixing); server momentum and
        ``after_mix`` are not applied.

        Args:
            wc: ``[m, n]`` non-negative rows summing to 1 (dense, or sparse COO).
            tc: ``[m]`` int64 target centers.
            split: "val" or "test".
            chunk: rows evaluated per batched forward (memory bound). Rows are processed in
                order of their target's split size, and a chunk of large targets holds fewer
                rows (at most ``32 * chunk`` row-by-split-row cells); each chunk's forward runs
                on the largest real row count among its targets.

        Sparse rows (at most ``n / SPARSE_RATIO`` members, e.g. ABPS coalitions) never build a
        dense ``[m, n] @ [n, P]`` product: the first layer, linear in the parameters, is one
        ``x_t W1_j + b1_j`` per distinct (target, member) pair combined per row with the row's
        weights; the later layers' parameters are weighted sums of the members' rows
        (``embedding_bag``). Equal to the dense evaluation up to float summation order.

        Returns:
            ``[m]`` float64 AUROC (NaN where tc[r]'s split holds one class).
        """
        if hasattr(self.engine, "evaluate_mixtures"):  # an engine of its own model (federation.data.images, issue 18)
            return self.engine.evaluate_mixtures(self, wc, tc, split, params)
        theta = params if params is not None else self.pre_exchange
        s = self.data.splits[split]
        n, m_rows = self.n, wc.shape[0]
        if m_rows == 0:
            return torch.empty(0, dtype=torch.float64)
        cols, vals = sparse_rows(wc)  # [m, K] members and weights of each row
        # rows by target split size, largest first; a chunk holds at most `chunk` rows and at
        # most `chunk * 32` (row, split row) cells, so a few large targets do not pad many small
        order = torch.argsort(s.n[tc], descending=True, stable=True)
        tc, cols, vals = tc[order], cols[order], vals[order].to(torch.float32)
        sizes = s.n[tc].tolist()
        bounds, lo = [], 0
        while lo < m_rows:
            hi = min(m_rows, lo + max(1, min(chunk, chunk * 32 // max(1, sizes[lo]))))
            bounds.append((lo, hi))
            lo = hi
        sparse = (set(theta) == set(PARAM_NAMES) and {"w1", "b1"} <= set(self.exchanged) and n >= SPARSE_RATIO
                  and cols.shape[1] * SPARSE_RATIO <= n)
        out = torch.empty(m_rows, dtype=torch.float64)
        if not sparse:
            dense = (wc.to_dense() if wc.is_sparse else wc)[order]
            for lo, hi in bounds:
                w, t = dense[lo:hi], tc[lo:hi]
                model = {k: (mix(w, theta[k], self.bf16, own=t) if k in self.exchanged else theta[k][t])
                         for k in theta}
                rows = max(1, sizes[lo])  # real rows come first: trim the padding
                logits = forward(model, s.rows(t, rows))[0]
                out[order[lo:hi]] = batched_auroc(logits, s.y[t, :rows], s.mask[t, :rows])
            return out
        # Sparse rows (e.g. ABPS coalitions: kappa + 1 members each). Row r's member k sends
        # wire(theta_j), or theta_t itself when it is the target t: index src into [theta; wire(theta)].
        table = {k: torch.cat([theta[k], wire(theta[k], True)]) if self.bf16 else theta[k] for k in self.exchanged}
        src = cols + n * (cols != tc.unsqueeze(1)) if self.bf16 else cols
        span = 2 * n if self.bf16 else n
        h1 = theta["w1"].shape[-1]
        for lo, hi in bounds:
            t, sr, a = tc[lo:hi], src[lo:hi], vals[lo:hi]
            c, rows = t.numel(), max(1, sizes[lo])
            # layer 1 is linear in the parameters: z1 = sum_k a_k (x_t W1_k + b1_k), one product
            # per distinct (target, member) pair, then a weighted sum per row
            pair, inv = torch.unique(t.unsqueeze(1) * span + sr, return_inverse=True)
            pt, pj = pair // span, pair % span
            z = torch.bmm(s.rows(pt, rows), table["w1"][pj]).add_(table["b1"][pj].unsqueeze(1))  # [U, rows, h1]
            hid = F.embedding_bag(inv, z.view(pair.numel(), -1), per_sample_weights=a, mode="sum")
            hid = hid.view(c, rows, h1).relu_()

            def layer(k: str) -> torch.Tensor:
                if k not in self.exchanged:
                    return theta[k][t]
                mixed = F.embedding_bag(sr, table[k].reshape(span, -1), per_sample_weights=a, mode="sum")
                return mixed.view(c, *theta[k].shape[1:])

            hid = torch.bmm(hid, layer("w2")).add_(layer("b2").unsqueeze(1)).relu_()
            logits = torch.bmm(hid, layer("w3")).squeeze(-1).add_(layer("b3"))
            out[order[lo:hi]] = batched_auroc(logits, s.y[t, :rows], s.mask[t, :rows])
        return out


#: the type of a method's own parameter model (``Method[FedProxParams]`` types ``self.p``)
P = TypeVar("P", bound=BaseModel)


class Method(Generic[P]):
    """Base class of a federated method (see the module docstring for the protocol)."""

    name: ClassVar[str] = "method"
    display_name: ClassVar[str] = "method"
    family: ClassVar[str] = "other"
    paper_order: ClassVar[int | None] = None
    Params: ClassVar[type[BaseModel]] = NoParams
    default_config: ClassVar[dict[str, Any]] = {}
    pooled: ClassVar[bool] = False
    #: payloads of the exchanged block's size that one model transfer carries (ledger bytes)
    payloads_per_link: ClassVar[int] = 1
    #: what :meth:`scores` returns: ``"logit"`` or ``"probability"`` (calibration figures, federation/core/evaluation.py)
    score_kind: ClassVar[str] = "logit"

    def __init__(self, params: P | None = None) -> None:
        self.p: P = params if params is not None else cast(P, self.Params())

    def make_engine(self, data: FederatedData, cfg: RunConfig, seed: int) -> StackedEngine:
        """The stacked trainer of ``data`` (all centers, or the pooled union for a ``pooled``
        method): ``init_params()``, ``train_round(params, state, r, local_loss)``, ``predict``
        (:func:`federation.engine.build.build_engine`)."""
        return build_engine(data, cfg, seed)

    def setup(self, ctx: Context) -> None:
        """Called once before round 0."""

    def local_loss(self, ctx: Context, params: StackedParams, batch: Batch) -> torch.Tensor:
        """Extra per-center loss ``[a]`` for the active centers (override to use)."""
        raise TypeError(f"{self.name} defines no local loss")

    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        """Mixing matrix and ledger edges of this round."""
        raise TypeError(f"{self.name} must define plan_round")

    def aggregate(self, ctx: Context, w: torch.Tensor, params: StackedParams) -> StackedParams:
        """The exchanged block after mixing with ``w [n, n]`` (row-stochastic): ``{k: W @
        wire(params[k])}`` for k in ``ctx.exchanged`` (:func:`federation.engine.mixing.mix_params`).
        Returns only the replaced entries; the runner copies them into ``params``."""
        return mix_params(w, params, ctx.exchanged, ctx.bf16)

    def scores(self, ctx: Context, params: StackedParams, split: str, round_idx: int) -> torch.Tensor:
        """``[n, rows]`` per-row scores of every center's ``split`` (any monotone map of the
        predicted risk; AUROC only ranks them). Default: the engine's logits."""
        return ctx.engine.predict(params, split)

    def after_mix(self, ctx: Context, round_idx: int, prev: StackedParams, mixed: StackedParams) -> StackedParams:
        """Post-process the mixed exchanged block (default: unchanged)."""
        return mixed

    def after_exchange(self, ctx: Context, round_idx: int, plan: RoundPlan) -> dict[str, float]:
        """Per-round extra metrics (default: none)."""
        return {}

    @classmethod
    def has_local_loss(cls) -> bool:
        """True when the class overrides :meth:`local_loss`."""
        return cls.local_loss is not Method.local_loss

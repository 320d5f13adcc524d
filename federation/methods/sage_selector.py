"""One SAGE selector round (:class:`SageRound`) and the runtime method ``sage`` that runs it.

:class:`SageRound` is the one implementation of a selector's round (anchors, eq. (4) probe, decision,
mixing matrix, exchanged edges, probe bytes); the method ``sage`` and the image benchmark
(:mod:`federation.images.run`) both call it. Design notes: docs/runtime.md, "Module notes".
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar, Literal

import networkx as nx
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from torch import Tensor

from federation.core.config import NumbersNotFlags, unused
from federation.core.graphs import neighbour_table
from federation.core.seeding import mix_seed
from federation.data.image_shards import make_graph
from federation.methods.base import Context, Method, RoundPlan
from federation.methods.probe import draw_anchors, empty_table, probe
from federation.methods.registry import canonical_selector, get_selector, register
from federation.methods.sage_rule import truncate_schedule
from federation.methods.selectors import (
    GRAPH_SETTINGS,
    Decision,
    SageConfig,
    Selector,
    exchange_adjacency,
    increasing_schedule,
    selector_reads,
    shown_selector,
)

__all__ = ["SageStep", "SageRound", "SageSelectorParams", "SageSelectorMethod"]


@dataclass
class SageStep:
    """What one SAGE round decided.

    Attributes:
        decision: the selector's :class:`Decision` for every receiver.
        w: float [K, K] row-stochastic mixing matrix of the model-bearing block (eq. (2) or native).
        adjacency: bool [K, K] receiver k took a model-bearing object from j.
        probe_evaluations: sum_k d_k m_{k,t}, the (receiver, candidate, anchor) probes the decisions
            spent (0 for a selector without evidence).
        probe_bytes: ``probe_evaluations`` x bytes per anchor, rounded to whole bytes.
    """

    decision: Decision
    w: Tensor
    adjacency: Tensor
    probe_evaluations: float
    probe_bytes: int


class SageRound:
    """The round of one SAGE selector, on any model with ``pair_logits`` (image model, clinical MLP).

    Each call: draw the nested anchor sets -> probe every (receiver, candidate) pair (eq. (4)) when
    the selector needs it -> ``decide`` -> ``mix``. An anchor rule decides a receiver without a
    feasible stage by random gossip whatever its candidates' risks (SAGE Sec. V-B), so its pairs are
    not probed (nor charged).

    Args:
        rule: the selector object; cand, cand_valid, degree: long / bool [K, D], long [K] neighbour table;
        schedule: long [L] cumulative anchors; probe_unit: bytes one anchor probe moves.
    """

    #: instances may be rebuilt from a round checkpoint (federation.run.checkpoint.read)
    __checkpoint_state__ = True

    def __init__(self, rule: Selector, cand: Tensor, cand_valid: Tensor, degree: Tensor, schedule: Tensor,
                 probe_unit: int) -> None:
        self.rule, self.cand, self.cand_valid, self.degree = rule, cand, cand_valid, degree
        self.schedule, self.unit = schedule, probe_unit

    def __call__(self, round_idx: int, model: Any, shards: Any, heads: Any,
                 generator: torch.Generator) -> SageStep:
        """Round ``round_idx``: ``model`` answers the probe, ``shards`` holds the anchor pools
        (``anchor_index``, ``n_anchor``, ``x_train``, ``y_train``), ``heads.params`` the classifier
        heads (PFedDST), ``generator`` draws the anchors."""
        rows, valid = draw_anchors(shards, int(self.schedule[-1]), generator)
        own_ce = None
        if self.rule.needs_probe(round_idx):
            pairs = self.cand_valid
            if self.rule.anchor_rule:
                pairs = pairs & (truncate_schedule(self.schedule.tolist(), shards.n_anchor) > 0)[:, None]
            table, own_ce = probe(model, shards, self.cand, pairs, self.degree, self.schedule, rows, valid,
                                  with_ce=self.rule.with_ce, own=self.rule.own)
        else:
            table = empty_table(self.cand, self.cand_valid, self.degree, self.schedule, shards.n_anchor)
        dec = self.rule.decide(round_idx, table, own_ce, heads)
        evals = 0.0
        if self.rule.evidence:
            evals = float((self.degree.to(torch.float64) * dec.anchors_used.to(torch.float64)).sum())
        return SageStep(dec, self.rule.mix(dec), exchange_adjacency(dec.peers), evals, int(round(evals * self.unit)))


class SageSelectorParams(NumbersNotFlags):
    """``params:`` of ``sage`` (defaults: the SAGE paper's Sec. V; graph: complete).

    Attributes:
        selector: a SAGE benchmark selector, by identifier or display name (``sage_os``, ``SAGE-OS``,
            ``vanilla_sage``, ``sage_nf``, ``aq128``, ``rg``, ``local``, ``pens``, ``pfeddst``).
        graph: ``complete``, ``er`` (Erdos-Renyi, ``er_p``) or ``ba`` (Barabasi-Albert, ``ba_m``).
        er_p, ba_m: the graph's edge probability / attachment count.
        schedule: cumulative anchor counts m_1 < ... < m_L.
        delta: failure probability of the radius (7).
        lambda_cost: cost weight of (22)-(24).
        stage_cost: ``increment`` (eq. (22)) or ``cumulative``.
        alpha_mix: a of eq. (2).
        pens, pfeddst: those selectors' options.
        A setting that the graph or the selector does not read (as :class:`SageConfig`) is refused
        unless at its default.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    selector: str = "sage_os"
    graph: Literal["complete", "er", "ba"] = "complete"
    er_p: float = Field(0.15, gt=0, le=1)
    ba_m: int = Field(3, ge=1)
    schedule: tuple[int, ...] = (16, 32, 64, 128)
    delta: float = Field(0.1, gt=0, lt=1)
    lambda_cost: float = Field(2e-3, ge=0)
    stage_cost: Literal["increment", "cumulative"] = "increment"
    alpha_mix: float = Field(0.5, ge=0, le=1)
    pens: dict[str, Any] = Field(default_factory=dict)
    pfeddst: dict[str, Any] = Field(default_factory=dict)

    @field_validator("selector")
    @classmethod
    def _known(cls, v: str) -> str:
        return canonical_selector(v)

    @field_validator("schedule")
    @classmethod
    def _increasing(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        return increasing_schedule(v)

    @model_validator(mode="after")
    def _read(self) -> SageSelectorParams:
        unused(self, "params", "graph", GRAPH_SETTINGS)
        unused(self, "params", "selector", selector_reads(), shown=shown_selector)
        return self


@register(display_name="SAGE selector", family="decentralized")
class SageSelectorMethod(Method):
    """A SAGE benchmark selector on the runtime (see the module docstring); ``params.selector`` picks it."""

    name: ClassVar[str] = "sage"
    seconds_per_round = 6.40
    Params: ClassVar[type[BaseModel]] = SageSelectorParams
    #: SAGE's split: only the representation omega is model-bearing, the classifier head phi stays local
    #: (image model: the 2-layer head; clinical MLP: its last two layers, as ABPS-X / FedAvg-X)
    default_config: ClassVar[dict[str, Any]] = {"exchange": {"head_layers": 2}}

    def setup(self, ctx: Context) -> None:
        """Graph, neighbour table, the selector object and its random streams."""
        p: SageSelectorParams = self.p  # type: ignore[assignment]
        g = nx.complete_graph(ctx.n) if p.graph == "complete" else make_graph(p.graph, ctx.n, ctx.seed, p.er_p, p.ba_m)
        self.cand, self.cand_valid, self.degree = neighbour_table(g)
        cfg = SageConfig(rounds=ctx.cfg.max_rounds, schedule=list(p.schedule), delta=p.delta, lambda_cost=p.lambda_cost,
                         stage_cost=p.stage_cost, alpha_mix=p.alpha_mix, pens=p.pens, pfeddst=p.pfeddst,
                         selectors=[p.selector])
        rule = get_selector(p.selector)(cfg, self.cand, self.cand_valid, self.degree, ctx.n_train,
                                        torch.Generator().manual_seed(mix_seed(ctx.seed, 0x5A6E)))
        self.round = SageRound(rule, self.cand, self.cand_valid, self.degree, torch.tensor(p.schedule, dtype=torch.long),
                               ctx.engine.probe_bytes_per_anchor())
        self.g_anchor = torch.Generator().manual_seed(mix_seed(ctx.seed, 0xA7C4))
        self.last: Any = None
        self.totals = torch.zeros(4, dtype=torch.float64)  # rounds, certified, RG fallback, anchors used

    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        """One :class:`SageRound` on the engine's probe view (anchors: each center's ``val`` rows)."""
        model, shards = ctx.engine.probe_view(ctx.params)
        step = self.round(round_idx, model, shards, SimpleNamespace(params=ctx.engine.probe_heads(ctx.params)),
                          self.g_anchor)
        self.last = step.decision
        return RoundPlan(w=step.w, adjacency=step.adjacency, probe_bytes=step.probe_bytes)

    def after_exchange(self, ctx: Context, round_idx: int, plan: RoundPlan) -> dict[str, float]:
        """The round's selection figures: share of centers that took a peer, certified, fell back to
        random gossip, and the mean anchors a decision used (m_{k,t})."""
        dec = self.last
        if dec is None:
            raise RuntimeError("after_exchange called before plan_round")
        took = (dec.peers >= 0).any(1).to(torch.float64).mean()
        row = torch.stack([took, dec.certified.to(torch.float64).mean(), dec.gossip.to(torch.float64).mean(),
                           dec.anchors_used.to(torch.float64).mean()])
        self.totals += torch.cat([torch.ones(1, dtype=torch.float64), row[1:]])
        return {"exchange_rate": float(row[0]), "certified_rate": float(row[1]), "rg_fallback_rate": float(row[2]),
                "mean_anchors": float(row[3])}

    def final_metrics(self, ctx: Context) -> dict[str, Any]:
        """Run means of the certified and RG-fallback rates and of the anchors used per decision."""
        r = max(float(self.totals[0]), 1.0)
        return {"certified_rate_mean": float(self.totals[1]) / r, "rg_fallback_rate_mean": float(self.totals[2]) / r,
                "mean_anchors_used": float(self.totals[3]) / r}

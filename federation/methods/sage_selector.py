"""The SAGE benchmark's peer selectors as a method of the runtime: ``sage``.

Design notes: docs/runtime.md, "Module notes".
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar, Literal

import networkx as nx
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

import federation.methods.selectors as sel
from federation.core.graphs import neighbour_table
from federation.core.seeding import mix_seed
from federation.data.image_shards import make_graph
from federation.methods.base import Context, Method, RoundPlan
from federation.methods.probe import draw_anchors, empty_table, probe
from federation.methods.registry import register
from federation.methods.sage_rule import truncate_schedule
from federation.methods.selectors import canonical_selector

__all__ = ["SageSelectorParams", "SageSelectorMethod"]


class SageSelectorParams(BaseModel):
    """``params:`` of ``sage`` (defaults: the SAGE paper's Sec. V; graph: complete).

    Attributes:
        selector: a SAGE benchmark selector, by identifier or display name (``sage_os``, ``SAGE-OS``,
            ``vanilla_sage``, ``sage_nf``, ``aq128``, ``rg``, ``local``, ``pens``, ``pfeddst``).
        graph: ``complete``, ``er`` (Erdos-Renyi, ``er_p``) or ``ba`` (Barabasi-Albert, ``ba_m``).
        schedule: cumulative anchor counts m_1 < ... < m_L; delta: failure probability of the
            radius (7); lambda_cost: cost weight of (22)-(24); stage_cost: ``increment`` (eq. (22)) or
            ``cumulative``; alpha_mix: a of eq. (2); pens / pfeddst: those selectors' options.
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
        if not v or v[0] < 1 or any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"must be increasing positive integers, got {list(v)}")
        return v


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
        cfg = sel.SageConfig(rounds=ctx.cfg.max_rounds, schedule=list(p.schedule), delta=p.delta, lambda_cost=p.lambda_cost,
                         stage_cost=p.stage_cost, alpha_mix=p.alpha_mix, pens=p.pens, pfeddst=p.pfeddst,
                         selectors=[p.selector])
        self.rule = sel.REGISTRY[p.selector](cfg, self.cand, self.cand_valid, self.degree, ctx.n_train,
                                             torch.Generator().manual_seed(mix_seed(ctx.seed, 0x5A6E)))
        self.g_anchor = torch.Generator().manual_seed(mix_seed(ctx.seed, 0xA7C4))
        self.schedule = torch.tensor(p.schedule, dtype=torch.long)
        self.unit = ctx.engine.probe_bytes_per_anchor()
        self.last: Any = None
        self.totals = torch.zeros(4, dtype=torch.float64)  # rounds, certified, RG fallback, anchors used

    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        """Anchors from each center's own validation rows -> probe (when the selector needs it) ->
        decide -> ``W``; the ledger's edges and probe bytes."""
        model, shards = ctx.engine.probe_view(ctx.params)
        rows, valid = draw_anchors(shards, int(self.schedule[-1]), self.g_anchor)
        own_ce = None
        if self.rule.needs_probe(round_idx):
            # an anchor rule decides a receiver without a feasible stage by random gossip whatever its
            # candidates' risks (Sec. V-B): its pairs are not probed (nor charged)
            pairs = self.cand_valid
            if self.rule.anchor_rule:
                pairs = pairs & (truncate_schedule(self.schedule.tolist(), shards.n_anchor) > 0)[:, None]
            table, own_ce = probe(model, shards, self.cand, pairs, self.degree, self.schedule, rows, valid,
                                  with_ce=self.rule.with_ce, own=self.rule.own)
        else:
            table = empty_table(self.cand, self.cand_valid, self.degree, self.schedule, shards.n_anchor)
        heads = ctx.engine.probe_heads(ctx.params)
        dec = self.rule.decide(round_idx, table, own_ce, SimpleNamespace(params=heads))
        self.last = dec
        evals = (self.degree.to(torch.float64) * dec.anchors_used.to(torch.float64)).sum() if self.rule.evidence else 0.0
        return RoundPlan(w=self.rule.mix(dec), adjacency=sel.exchange_adjacency(dec.peers),
                         probe_bytes=int(round(float(evals) * self.unit)))

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

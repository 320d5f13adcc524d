"""Peer selectors of the SAGE benchmark: LOCAL, RG, AQ-128, SAGE-NF, Vanilla SAGE, SAGE-OS, PENS, PFedDST.

Each selector maps one round's probe table (every receiver's candidates' empirical risks at every
stage of its anchor schedule) to a :class:`Decision`: the model-bearing peers of each receiver, the
anchors its decision consumed, and why it stopped. All receivers are decided at once with tensor
ops over ``[K, D, L]`` (clients, candidate slots, stages); nothing loops over clients.

Sources: SAGE paper (arXiv:2609.23773) Sec. IV-V and Algorithm 1; PENS: Onoszko, Karlsson, Mogren,
Zec, "Decentralized federated learning of deep neural networks on non-iid data", ICML-W FL 2021;
PFedDST: Fan, Li, Zhang, Tian, Geng, IJCNN 2025 (arXiv:2502.07750). Our reading of the two
published selectors is stated in docs/sage.md.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator
from torch import Tensor

import federation.methods.sage_rule as sage
from etl.errors import InputError
from federation.core.config import CheckpointConfig, NumbersNotFlags, first_error, unused
from federation.methods.probe import ProbeTable
from federation.methods.registry import SELECTORS, canonical_selector, register_selector


@dataclass
class Decision:
    """Who each receiver takes a model-bearing object from, and what evidence it spent.

    Attributes:
        peers: long [K, P] selected peer ids (padding -1); P = 1 for the budget-matched selectors.
        mix_weights: float [K, P] weight of each selected peer in the peer average (rows sum to 1
            over valid peers; empty rows = no exchange).
        anchors_used: long [K] m_{k,t}, the cumulative anchors at the final stage (0 = none).
        stop_stage: long [K] index l of the final stage (-1: no anchors probed).
        gossip: bool [K] the receiver fell back to a uniform random neighbour (RG fallback).
        cost_gossip: bool [K] the fallback was triggered by the cost rule (24) (SAGE-OS).
        certified: bool [K] a certificate ((8) or (20)) fired.
        no_anchor: bool [K] fewer than m_1 anchors: direct RG fallback (Sec. V-B).
    """

    peers: Tensor
    mix_weights: Tensor
    anchors_used: Tensor
    stop_stage: Tensor
    gossip: Tensor
    cost_gossip: Tensor
    certified: Tensor
    no_anchor: Tensor


def uniform_neighbour(cand: Tensor, degree: Tensor, generator: torch.Generator) -> Tensor:
    """Random gossip: one neighbour per receiver, uniform over its d_k candidates -> long [K]."""
    u = torch.rand(cand.shape[0], generator=generator, dtype=torch.float64)
    slot = (u * degree.to(torch.float64)).floor().long().clamp(max=cand.shape[1] - 1)
    slot = torch.minimum(slot, (degree - 1).clamp(min=0))
    return cand.gather(1, slot[:, None]).squeeze(1)


def _single(peer: Tensor) -> tuple[Tensor, Tensor]:
    return peer[:, None], (peer[:, None] >= 0).to(torch.float32)


def _blank(k: int) -> dict[str, Tensor]:
    z = torch.zeros(k, dtype=torch.bool)
    return dict(anchors_used=torch.zeros(k, dtype=torch.long), stop_stage=torch.full((k,), -1),
                gossip=z.clone(), cost_gossip=z.clone(), certified=z.clone(), no_anchor=z.clone())


def decide_local(k: int) -> Decision:
    """LOCAL: no peer exchange."""
    peers = torch.full((k, 1), -1, dtype=torch.long)
    return Decision(peers, torch.zeros(k, 1), **_blank(k))


def decide_rg(cand: Tensor, degree: Tensor, generator: torch.Generator) -> Decision:
    """RG: one uniformly random neighbour, no evidence (B_k^t = 1)."""
    peers, w = _single(uniform_neighbour(cand, degree, generator))
    b = _blank(cand.shape[0])
    b["gossip"] = torch.ones(cand.shape[0], dtype=torch.bool)
    return Decision(peers, w, **b)


def decide_anchor(kind: str, table: ProbeTable, delta: float, lam: float,
                  generator: torch.Generator, loss_bound: float = 1.0,
                  stage_cost: str = "increment") -> Decision:
    """AQ-128, SAGE-NF, Vanilla SAGE or SAGE-OS for every receiver at once.

    * ``aq128``: the empirical best peer at the largest feasible stage m_{L_k} (always commits).
    * ``vanilla_sage``: first stage where (8) holds selects j_hat_1; none by m_{L_k} -> RG.
    * ``sage_nf``: as Vanilla but commits to j_hat_1 at m_{L_k} when nothing is certified.
    * ``sage_os``: Algorithm 1: first stage where (20) holds selects j_hat_1; else, before the last
      stage, the cost rule (24) switches to RG; at the last stage -> RG. ``stage_cost`` picks the
      reading of the stage cost in (24): ``"increment"`` = eq. (22) literally,
      lambda d_k (m_{l+1} - m_l); ``"cumulative"`` = lambda d_k m_{l+1}, the whole next stage's
      evidence (docs/sage.md, "SAGE-OS budget").
    Receivers with fewer than m_1 anchors (L_k = 0) fall back to RG with m_{k,t} = 0 (Sec. V-B).
    The radius (7) uses d_k and the truncated L_k.

    Returns:
        the :class:`Decision`; random fallbacks draw from ``generator``.
    """
    k, _, n_l = table.risk.shape
    sched = table.schedule.to(torch.float64)
    stage = torch.arange(n_l)
    stage_ok = stage[None, :] < table.n_stages[:, None]                      # [K, L]
    last = stage[None, :] == (table.n_stages[:, None] - 1)                   # [K, L]
    risk = table.risk.permute(0, 2, 1)                                       # [K, L, D]
    valid = table.cand_valid[:, None, :].expand_as(risk)
    radius = sage.confidence_radius(sched[None, :], table.degree[:, None].clamp(min=1),
                                    table.n_stages[:, None].clamp(min=1), delta, loss_bound)
    no_anchor = table.n_stages == 0
    rg_peer = uniform_neighbour(table.cand, table.degree, generator)

    if kind == "sage_os":
        adv, j1, _ = sage.advantage_over_gossip(risk, valid)                 # [K, L]
        cert = sage.gossip_certificate(adv, radius) & stage_ok
        m_next = torch.cat([sched[1:], sched[-1:]])
        m_cur = sched if stage_cost == "increment" else torch.zeros_like(sched)
        cstop = sage.cost_stop(lam, table.degree[:, None], m_cur[None, :], m_next[None, :], adv,
                               radius) & stage_ok & ~last
    else:
        cert, j1 = sage.runner_up_certificate(risk, valid, radius)
        cert = cert & stage_ok
        cstop = torch.zeros_like(cert)
        if kind == "aq128":
            cert = torch.zeros_like(cert)
    stop = cert | cstop | (last & stage_ok)
    first = torch.where(stop, stage[None, :].expand_as(stop), torch.full_like(stop, n_l, dtype=torch.long)).min(1).values
    stop_l = torch.where(no_anchor, torch.zeros_like(first), first.clamp(max=n_l - 1))
    certified = cert.gather(1, stop_l[:, None]).squeeze(1) & ~no_anchor
    cost_g = cstop.gather(1, stop_l[:, None]).squeeze(1) & ~certified & ~no_anchor
    best_slot = j1.gather(1, stop_l[:, None]).squeeze(1)
    best_peer = table.cand.gather(1, best_slot[:, None]).squeeze(1)
    if kind in ("aq128", "sage_nf"):
        commit = ~no_anchor                       # always commits once it has any evidence
    else:
        commit = certified
    peer = torch.where(commit, best_peer, rg_peer)
    anchors = torch.where(no_anchor, torch.zeros(k, dtype=torch.long),
                          table.schedule.gather(0, stop_l))
    peers, w = _single(peer)
    return Decision(peers, w, anchors_used=anchors,
                    stop_stage=torch.where(no_anchor, torch.full_like(stop_l, -1), stop_l),
                    gossip=~commit, cost_gossip=cost_g, certified=certified, no_anchor=no_anchor)


@dataclass
class PensState:
    """PENS memory: how often receiver k selected each candidate slot during discovery.

    Attributes:
        counts: float [K, D] selections per candidate slot.
        discovery_rounds: rounds of the neighbour-discovery phase.
        neighbours: bool [K, D] the PENS neighbour set after discovery (None before).
    """

    counts: Tensor
    discovery_rounds: int
    neighbours: Tensor | None = None


def decide_pens(table: ProbeTable, state: PensState, round_idx: int, top_m: int,
                n_train: Tensor, generator: torch.Generator) -> Decision:
    """PENS (Onoszko et al. 2021) on a graph, native multi-peer pattern (our reading, docs/sage.md).

    Discovery (round < discovery_rounds): receiver k scores each neighbour by its mean
    cross-entropy on k's anchors (the probe interface: inputs out, predictions back) and merges
    the ``top_m`` lowest-loss ones; selections are counted. Afterwards the PENS neighbour set is
    {j : count_kj > expected count = discovery_rounds * min(top_m, d_k) / d_k} (top-m by count if
    empty); each round k merges ``top_m`` peers drawn uniformly from that set. Merging is PENS'
    sample-size-weighted average of the receiver and its selected peers.

    Returns:
        Decision with up to ``top_m`` peers; mix_weights hold the peers' share n_j / sum n.
    """
    k, d = table.cand.shape
    valid = table.cand_valid
    blank = _blank(k)
    m_sel = torch.minimum(torch.full_like(table.degree, top_m), table.degree)
    if round_idx < state.discovery_rounds:
        has = table.n_stages > 0
        score = torch.where(valid, table.ce, torch.full_like(table.ce, math.inf))
        # Receivers without anchors rank their neighbours at random.
        noise = torch.rand(k, d, generator=generator, dtype=torch.float64)
        score = torch.where(has[:, None], score, torch.where(valid, noise, torch.full_like(noise, math.inf)))
        order = score.argsort(dim=1)
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(d).expand(k, d).contiguous())
        chosen = (rank < m_sel[:, None]) & valid
        state.counts += chosen.to(state.counts.dtype)
        l_last = (table.n_stages - 1).clamp(min=0)
        blank["anchors_used"] = torch.where(has, table.schedule.gather(0, l_last), torch.zeros_like(l_last))
        blank["stop_stage"] = torch.where(has, l_last, torch.full_like(l_last, -1))
        blank["no_anchor"] = ~has
    else:
        if state.neighbours is None:
            expected = state.discovery_rounds * m_sel.to(torch.float64) / table.degree.clamp(min=1)
            nb = (state.counts > expected[:, None]) & valid
            # Fallback: the top-m most selected neighbours.
            cnt = torch.where(valid, state.counts, torch.full_like(state.counts, -1.0))
            order = (-cnt).argsort(dim=1, stable=True)
            rank = torch.empty_like(order).scatter_(1, order, torch.arange(d).expand(k, d).contiguous())
            top = (rank < m_sel[:, None]) & valid
            state.neighbours = torch.where(nb.any(1, keepdim=True), nb, top)
        keys = torch.rand(k, d, generator=generator, dtype=torch.float64)
        keys = torch.where(state.neighbours, keys, torch.full_like(keys, math.inf))
        order = keys.argsort(dim=1)
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(d).expand(k, d).contiguous())
        chosen = (rank < m_sel[:, None]) & state.neighbours
    return _multi(table.cand, chosen, n_train, blank, weight_by_size=True)


@dataclass
class PfeddstState:
    """PFedDST memory: round in which receiver k last selected candidate slot j (-1: never)."""

    last_selected: Tensor


def decide_pfeddst(table: ProbeTable, state: PfeddstState, round_idx: int, top_k: int,
                   heads: Tensor, own_ce: Tensor, alpha: float, c: float, n_train: Tensor) -> Decision:
    """PFedDST (Fan et al. 2025) on a graph, native multi-peer pattern (our reading, docs/sage.md).

    Score S_kj = s_p (alpha s_l - s_d + c) with
      s_l = CE of peer j on k's anchors minus k's own CE there (loss disparity),
      s_d = 1 - cos(head_k, head_j) (header distance: task dissimilarity),
      s_p = 1 - 1 / (1 + rounds since k last selected j) (peer recency; never selected = t + 1).
    Each receiver merges the ``top_k`` highest-scoring neighbours (uniform average of the
    receiver and its peers' representation).

    Args:
        heads: float [K, H] flattened classifier-head parameters phi_k.
        own_ce: float64 [K] receiver's own CE on its anchors.
    """
    k, d = table.cand.shape
    valid = table.cand_valid
    hn = torch.nn.functional.normalize(heads.to(torch.float64), dim=1)
    cos = (hn[:, None, :] * hn[table.cand.clamp(min=0)]).sum(-1)
    s_d = 1.0 - cos
    s_l = table.ce - own_ce[:, None]
    since = torch.where(state.last_selected >= 0, round_idx - state.last_selected,
                        torch.full_like(state.last_selected, round_idx + 1)).to(torch.float64)
    s_p = 1.0 - 1.0 / (1.0 + since)
    score = s_p * (alpha * s_l - s_d + c)
    score = torch.where(valid, score, torch.full_like(score, -math.inf))
    m_sel = torch.minimum(torch.full_like(table.degree, top_k), table.degree)
    order = (-score).argsort(dim=1, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(d).expand(k, d).contiguous())
    chosen = (rank < m_sel[:, None]) & valid
    state.last_selected = torch.where(chosen, torch.full_like(state.last_selected, round_idx),
                                      state.last_selected)
    blank = _blank(k)
    has = table.n_stages > 0
    l_last = (table.n_stages - 1).clamp(min=0)
    blank["anchors_used"] = torch.where(has, table.schedule.gather(0, l_last), torch.zeros_like(l_last))
    blank["stop_stage"] = torch.where(has, l_last, torch.full_like(l_last, -1))
    blank["no_anchor"] = ~has
    return _multi(table.cand, chosen, n_train, blank, weight_by_size=False)


def _multi(cand: Tensor, chosen: Tensor, n_train: Tensor, blank: dict, weight_by_size: bool) -> Decision:
    peers = torch.where(chosen, cand, torch.full_like(cand, -1))
    if weight_by_size:
        w = torch.where(chosen, n_train[cand.clamp(min=0)].to(torch.float32), torch.zeros(()))
    else:
        w = chosen.to(torch.float32)
    tot = w.sum(1, keepdim=True)
    w = torch.where(tot > 0, w / tot.clamp(min=1e-12), w)
    return Decision(peers, w, **blank)


def mixing_matrix(decision: Decision, alpha_mix: float, n_train: Tensor | None = None,
                  native_average: bool = False) -> Tensor:
    """Row-stochastic W [K, K] for omega <- W omega.

    Budget-matched selectors (one peer): W = (1 - a) I + a P, eq. (2) with a = alpha_mix.
    ``native_average`` (PENS, PFedDST): omega_k <- average of omega_k and its peers' omega_j, with
    PENS' sample-size weights if ``n_train`` is given, else uniform.
    Receivers without a peer keep W[k, k] = 1.
    """
    peers, w = decision.peers, decision.mix_weights
    k = peers.shape[0]
    sel = peers >= 0
    W = torch.zeros(k, k, dtype=torch.float32)
    has = sel.any(1)
    if native_average:
        if n_train is not None:
            own = n_train.to(torch.float32)
            pw = torch.where(sel, n_train[peers.clamp(min=0)].to(torch.float32), torch.zeros(()))
        else:
            own = torch.ones(k)
            pw = sel.to(torch.float32)
        tot = own + pw.sum(1)
        self_w, peer_w = own / tot, pw / tot[:, None]
    else:
        self_w = torch.where(has, torch.full((k,), 1.0 - alpha_mix), torch.ones(k))
        peer_w = w * alpha_mix
    W[torch.arange(k), torch.arange(k)] = self_w
    rows = torch.arange(k)[:, None].expand_as(peers)
    W.index_put_((rows[sel], peers[sel]), peer_w[sel].to(torch.float32), accumulate=True)
    return W


@dataclass
class SelectorStats:
    """Running evidence and communication totals of one selector run (Table III, CommOH)."""

    d_m: float = 0.0            # sum_{k,t} d_{k,t} m_{k,t}
    d_sum: float = 0.0          # sum_{k,t} d_{k,t}
    decisions: int = 0
    gossip: int = 0
    cost_gossip: int = 0
    certified: int = 0
    no_anchor: int = 0
    exchanges: int = 0          # model-bearing objects received
    stop_counts: dict = field(default_factory=dict)


# --- the selectors as registered classes -----------------------------------------------------

class Selector(ABC):
    """One peer-selection rule of the SAGE benchmark: probe or not, decide, mix.

    A selector round (:class:`federation.methods.sage_selector.SageRound`) calls, every round t:
    ``needs_probe(t)`` -> (the eq. (4) probe of :mod:`federation.methods.probe` if True) ->
    ``decide(t, table, own_ce, model)`` -> ``mix(decision)`` -> ``W @ omega``.

    Class attributes: ``name`` (identifier), ``display`` (table label), ``aliases`` (other
    accepted spellings, lower case), ``with_ce`` / ``own``
    (the probe also returns cross-entropies / the receiver's own CE), ``anchor_rule`` (one of
    the four budget-matched anchor selectors of Sec. V: certificate and stop statistics),
    ``evidence`` (spends anchor evidence: budget accounting, eq. (28)), ``reads`` (the
    per-selector settings of :class:`SageConfig` it reads, among :data:`SELECTOR_SETTINGS`: a
    setting that no selector of a run reads is refused unless at its default).

    Args (constructor):
        cfg: the :class:`SageConfig` (delta, lambda_cost, alpha_mix,
            rounds, pens / pfeddst options).
        cand: long [K, D] neighbour table; cand_valid: bool [K, D]; degree: long [K];
        n_train: long [K] local training-set sizes; generator: the selector's random stream.
    """

    #: instances may be rebuilt from a round checkpoint (federation.run.checkpoint.read)
    __checkpoint_state__ = True

    name: str = ""
    display: str = ""
    aliases: tuple[str, ...] = ()
    with_ce: bool = False
    own: bool = False
    anchor_rule: bool = False
    evidence: bool = False
    reads: tuple[str, ...] = ("alpha_mix",)  # the eq. (2) mix of :meth:`mix`

    def __init__(self, cfg, cand: Tensor, cand_valid: Tensor, degree: Tensor, n_train: Tensor,
                 generator: torch.Generator):
        self.cfg, self.cand, self.cand_valid, self.degree = cfg, cand, cand_valid, degree
        self.n_train, self.generator = n_train, generator

    def needs_probe(self, round_idx: int) -> bool:
        """True when round ``round_idx`` needs the anchor probe (eq. (4))."""
        return False

    @abstractmethod
    def decide(self, round_idx: int, table: ProbeTable, own_ce: Tensor | None, model) -> Decision:
        """This round's :class:`Decision` for every receiver at once.

        Args:
            round_idx: t (0-based); table: the round's probe table (:func:`probe.empty_table`
                when ``needs_probe`` was False); own_ce: float64 [K] receivers' own CE or None;
            model: the :class:`federation.engine.image_model.StackedModel` (PFedDST reads the heads).
        """

    def mix(self, decision: Decision) -> Tensor:
        """Row-stochastic W [K, K]: eq. (2) with ``alpha_mix`` (budget-matched selectors)."""
        return mixing_matrix(decision, self.cfg.alpha_mix)


@register_selector
class Local(Selector):
    """LOCAL: no peer exchange."""

    name, display, reads = "local", "LOCAL", ()

    def decide(self, round_idx, table, own_ce, model):
        return decide_local(self.cand.shape[0])


@register_selector
class RandomGossip(Selector):
    """RG: one uniformly random neighbour, no evidence."""

    name, display = "rg", "RG"

    def decide(self, round_idx, table, own_ce, model):
        return decide_rg(self.cand, self.degree, self.generator)


@register_selector
class Pens(Selector):
    """PENS (Onoszko et al. 2021): CE-ranked discovery, then random merges within the kept set."""

    name, display, with_ce, evidence, reads = "pens", "PENS", True, True, ("pens",)

    def __init__(self, cfg, cand, cand_valid, degree, n_train, generator):
        super().__init__(cfg, cand, cand_valid, degree, n_train, generator)
        self.state = PensState(torch.zeros(cand.shape, dtype=torch.float64),
                               max(1, int(round(cfg.pens.discovery_fraction * cfg.rounds))))

    def needs_probe(self, round_idx):
        return round_idx < self.state.discovery_rounds

    def decide(self, round_idx, table, own_ce, model):
        return decide_pens(table, self.state, round_idx, self.cfg.pens.top_m, self.n_train, self.generator)

    def mix(self, decision):
        return mixing_matrix(decision, self.cfg.alpha_mix, self.n_train, native_average=True)


@register_selector
class Pfeddst(Selector):
    """PFedDST (Fan et al. 2025): loss disparity, header distance and recency score, top-k merge."""

    name, display, with_ce, own, evidence, reads = "pfeddst", "PFedDST", True, True, True, ("pfeddst",)

    def __init__(self, cfg, cand, cand_valid, degree, n_train, generator):
        super().__init__(cfg, cand, cand_valid, degree, n_train, generator)
        self.state = PfeddstState(torch.full(cand.shape, -1, dtype=torch.long))

    def needs_probe(self, round_idx):
        return True

    def decide(self, round_idx, table, own_ce, model):
        heads = torch.cat([v.flatten(1) for n, v in model.params.items() if n.startswith("head.")], dim=1)
        o = self.cfg.pfeddst
        return decide_pfeddst(table, self.state, round_idx, o.top_k, heads, own_ce, o.alpha, o.c, self.n_train)

    def mix(self, decision):
        return mixing_matrix(decision, self.cfg.alpha_mix, None, native_average=True)


class _AnchorRule(Selector):
    """The budget-matched anchor selectors of Sec. V (one peer; :func:`decide_anchor`)."""

    anchor_rule = evidence = True
    reads = ("alpha_mix", "delta")           # the radius (7) of the certificates

    def needs_probe(self, round_idx):
        return True

    def decide(self, round_idx, table, own_ce, model):
        return decide_anchor(self.name, table, self.cfg.delta, self.cfg.lambda_cost, self.generator,
                             stage_cost=self.cfg.stage_cost)


@register_selector
class Aq128(_AnchorRule):
    """AQ-128: the empirical best peer at the largest feasible stage (fixed full budget)."""

    name, display = "aq128", "AQ-128"
    reads = ("alpha_mix",)                   # no certificate: delta changes nothing


@register_selector
class SageNf(_AnchorRule):
    """SAGE-NF: certificate (8) as Vanilla, but commits to j_hat_1 when nothing is certified."""

    name, display, aliases = "sage_nf", "SAGE-NF", ("nf",)


@register_selector
class VanillaSage(_AnchorRule):
    """Vanilla SAGE: first stage where (8) holds selects j_hat_1; none -> RG."""

    name, display, aliases = "vanilla_sage", "Vanilla SAGE", ("vanilla", "vanilla-sage")


@register_selector
class SageOs(_AnchorRule):
    """SAGE-OS, Algorithm 1: certificate (20), cost stop (24), RG at the last stage."""

    name, display, aliases = "sage_os", "SAGE-OS", ("os",)
    reads = ("alpha_mix", "delta", "lambda_cost", "stage_cost")  # + the cost stop (24)


def exchange_adjacency(peers: Tensor) -> Tensor:
    """bool [K, K]: ``A[k, j]`` when receiver k took a model-bearing object from peer j this round.

    Args:
        peers: long [K, P] selected peers (padding -1), :attr:`Decision.peers`.
    """
    k = peers.shape[0]
    adj = torch.zeros(k, k, dtype=torch.bool)
    rows = torch.arange(k)[:, None].expand_as(peers)
    ok = peers >= 0
    adj[rows[ok], peers[ok]] = True
    return adj


# --- the SAGE benchmark configuration ------------------------------------------------------

def increasing_schedule(v: list[int] | tuple[int, ...]) -> list[int] | tuple[int, ...]:
    """An anchor schedule m_1 < ... < m_L of positive integers, returned as given.

    Raises:
        ValueError: empty, not increasing or not positive (pydantic names the option).
    """
    if not v or v[0] < 1 or any(b <= a for a, b in zip(v, v[1:])):
        raise ValueError(f"must be increasing positive integers, got {list(v)}")
    return v


class PensOptions(NumbersNotFlags):
    """PENS settings: peers merged per round and the share of rounds spent on discovery."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    top_m: int = Field(2, ge=1)
    discovery_fraction: float = Field(0.1, gt=0, le=1)


class PfeddstOptions(NumbersNotFlags):
    """PFedDST settings: peers merged per round and the score's alpha and c."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    top_k: int = Field(2, ge=1)
    alpha: float = 1.0
    c: float = 1.0


#: the :class:`SageConfig` settings that only some selectors read (each selector's ``reads``)
SELECTOR_SETTINGS = ("alpha_mix", "delta", "lambda_cost", "stage_cost", "pens", "pfeddst")
#: the graph settings each SAGE graph reads
GRAPH_SETTINGS: dict[str, tuple[str, ...]] = {"er": ("er_p",), "ba": ("ba_m",)}


def selector_reads() -> dict[str, tuple[str, ...]]:
    """Registered selector -> the :data:`SELECTOR_SETTINGS` it reads."""
    return {name: tuple(f for f in cls.reads if f in SELECTOR_SETTINGS) for name, cls in SELECTORS.items()}


def shown_selector(name: str) -> str:
    """A selector as messages write it: its table label as the config spells it (``'Vanilla SAGE'``)."""
    cls = SELECTORS.get(name)
    return repr(cls.display if cls is not None else name)


class SageConfig(NumbersNotFlags):
    """A SAGE benchmark configuration (configs/sage-*.yaml; defaults = the paper's Sec. V).

    ``er_p`` is read by ``graph: er`` only, ``ba_m`` by ``ba`` only; ``alpha_mix`` by the
    one-peer selectors (RG and the anchor rules), ``delta`` by SAGE-NF, Vanilla SAGE and SAGE-OS,
    ``lambda_cost`` and ``stage_cost`` by SAGE-OS, ``pens`` / ``pfeddst`` by that selector. A
    setting that the graph or none of the listed selectors reads is refused unless at its default.

    Raises (via :func:`parse_config`): InputError naming the offending option.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # NaN is no value: "finite number"
    benchmark: Literal["sage"] = "sage"
    name: str | None = None
    dataset: Literal["fmnist", "cifar10"] = "fmnist"
    data_root: str | None = None
    n_clients: int = Field(50, ge=2)
    rounds: int = Field(250, ge=1)
    graph: Literal["er", "ba"] = "er"
    er_p: float = Field(0.15, gt=0, le=1)
    ba_m: int = Field(3, ge=1)
    alpha_dir: float = Field(0.1, gt=0)
    seeds: list[int] = [0]
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0)
    alpha_mix: float = Field(0.5, ge=0, le=1)
    recon_weight: float = Field(1.0, ge=0)
    schedule: list[int] = [16, 32, 64, 128]
    delta: float = Field(0.1, gt=0, lt=1)
    lambda_cost: float = Field(2e-3, ge=0)
    stage_cost: Literal["increment", "cumulative"] = "increment"
    eval_every: int = Field(1, ge=1)
    eval_precision: Literal["fp32", "int8"] = "fp32"
    train_samples: int | None = Field(None, ge=1)
    test_samples: int | None = Field(None, ge=1)
    selectors: list[str] = list(SELECTORS)  # every registered selector (all are defined above)
    pens: PensOptions = PensOptions()
    pfeddst: PfeddstOptions = PfeddstOptions()
    num_threads: int | None = Field(None, ge=1)
    #: round checkpoints of ``abps train`` (``<output>.ckpt``; how the run is run, not what it computes)
    checkpoint: CheckpointConfig = CheckpointConfig()

    @field_validator("selectors")
    @classmethod
    def _selectors(cls, v: list[str]) -> list[str]:
        out = [canonical_selector(s) for s in v]
        if not out:
            raise ValueError("at least one selector is required")
        return list(dict.fromkeys(out))

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: list[int]) -> list[int]:
        return increasing_schedule(v)

    @model_validator(mode="after")
    def _read(self) -> SageConfig:
        unused(self, "", "graph", GRAPH_SETTINGS)
        unused(self, "", "selectors", selector_reads(), list(self.selectors), shown=shown_selector)
        return self


def parse_config(config: dict[str, Any], rounds: int | None = None,
                 seeds: list[int] | None = None) -> SageConfig:
    """Validate a config dict (overriding rounds / seeds); InputError names the bad option."""
    cfg = dict(config)
    if rounds is not None:
        cfg["rounds"] = rounds
    if seeds is not None:
        cfg["seeds"] = list(seeds)
    try:
        return SageConfig(**cfg)
    except ValidationError as exc:
        loc, msg = first_error(exc)
        raise InputError(f"sage config: option '{loc}': {msg}" if loc else f"sage config: {msg}") from None

"""Decentralized peer-to-peer baselines of the ABPS paper's Table 1 (Sec. 6.2): DeceFL, DeFTA and
WPFed, each a mixing matrix over the round's peer edges. Details: docs/baselines.md.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from federation.core.config import NumbersNotFlags
from federation.core.graphs import adjacency_tensor, build_graph, edge_list, graph_summary, metropolis_weights
from federation.engine.mlp import forward
from federation.methods.base import Context, Method, RoundPlan
from federation.methods.registry import register

GraphKind = Literal["sparse", "ring", "k-regular", "erdos-renyi", "barabasi-albert"]


class GraphParams(NumbersNotFlags):
    """Communication-graph parameters shared by the fixed-graph methods.

    ``graph``: family (:data:`federation.core.graphs.GRAPH_KINDS`; default ``sparse`` = connected,
    exactly n edges); ``graph_k`` (k-regular degree), ``graph_p`` (Erdos-Renyi edge
    probability), ``graph_m`` (Barabasi-Albert edges per new node); ``graph_seed``: the graph's
    seed (None = the run seed, so each seed of a sweep has its own fixed graph).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    graph: GraphKind = "sparse"
    graph_k: int = Field(4, ge=1)
    graph_p: float = Field(0.05, gt=0.0, le=1.0)
    graph_m: int = Field(1, ge=1)
    graph_seed: int | None = None


def consensus_distance(params: dict[str, torch.Tensor], keys: tuple[str, ...]) -> float:
    """``(1/n) sum_i ||theta_i - mean_j theta_j||^2`` over the exchanged ``keys`` (the
    disagreement that consensus-based methods drive to zero; Yuan et al. 2023, Theorem 1)."""
    total = torch.zeros((), dtype=torch.float64)
    for k in keys:
        x = params[k].double().flatten(1)
        total = total + ((x - x.mean(0, keepdim=True)) ** 2).sum(1).mean()
    return float(total)


GP = TypeVar("GP", bound=GraphParams)


class _FixedGraphMethod(Method[GP]):
    """A method over one communication graph fixed for the run (drawn in :meth:`setup`)."""

    Params: ClassVar[type[BaseModel]] = GraphParams

    def setup(self, ctx: Context) -> None:
        p = self.p
        seed = ctx.seed if p.graph_seed is None else p.graph_seed
        self.graph = build_graph(p.graph, ctx.n, seed, k=p.graph_k, p=p.graph_p, m=p.graph_m)
        self.adj = adjacency_tensor(self.graph, ctx.n)
        self.graph_json: dict[str, Any] = {"kind": p.graph, "seed": int(seed), **graph_summary(self.graph),
                                           "edge_list": edge_list(self.graph, list(ctx.data.center_ids))}

    def artifacts(self, ctx: Context) -> dict[str, Any]:
        """``graph.json``: the communication graph's kind, seed, summary and edge list (center ids)."""
        return {"graph.json": self.graph_json}


class DeceFLParams(GraphParams):
    """DeceFL's parameters: :class:`GraphParams` with the ``ring`` graph by default.

    Chosen on validation AUROC (configs/tuning.yaml, grid {sparse, ring}, both n edges and 1.00x;
    synthetic MIMIC default, seeds 11 22, 20 rounds): ring 0.759 against sparse 0.752
    (docs/baselines.md "Remaining grids"). On a ring every center has degree 2, so the
    Metropolis-Hastings weights are 1/3 on each edge and 1/3 on the center itself.
    """

    graph: GraphKind = "ring"


@register(display_name="DeceFL", family="decentralized", paper_order=6)
class DeceFL(_FixedGraphMethod[DeceFLParams]):
    """DeceFL (Yuan et al. 2023, "DeceFL: a principled fully decentralized federated learning
    framework", National Science Open 2(1):20220043).

    DeceFL's algorithm is the consensus + local-gradient iteration
    ``w_i(t+1) = sum_j W_ij w_j(t) - eta grad f_i(w_i(t))`` over a connected graph with a
    symmetric doubly-stochastic W. Here the local step is the runtime's local training (2 epochs
    of Adam) and W is the Metropolis-Hastings matrix of the fixed graph,
    ``W_ij = 1 / (1 + max(d_i, d_j))`` on edges, ``W_ii = 1 - sum_{j != i} W_ij``
    (:func:`federation.core.graphs.metropolis_weights`; Xiao & Boyd 2004). Every graph edge
    carries a model each round. Extra metric: ``consensus_dist`` (:func:`consensus_distance`
    after mixing).
    """

    name = "decefl"
    seconds_per_round = 0.65
    Params = DeceFLParams

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self.w = metropolis_weights(self.adj)

    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        return RoundPlan(w=self.w, adjacency=self.adj)

    def after_exchange(self, ctx: Context, round_idx: int, plan: RoundPlan) -> dict[str, float]:
        return {"consensus_dist": consensus_distance(ctx.params, ctx.exchanged)}


def defta_base_weights(adjacency: torch.Tensor, n_train: torch.Tensor) -> torch.Tensor:
    """DeFTA's unnormalized aggregation weights ``a_ij = n_j / (d_j + 1)`` for j in
    ``N(i) U {i}`` (0 elsewhere), ``[n, n]`` float64.

    Sender j sends its model to its d_j neighbours and keeps it itself, so dividing its sample
    count by ``d_j + 1`` makes the total weight of j over all receivers ``n_j``, as in FedAvg;
    this is our reading of DeFTA's bias-free aggregating formula (Zhou et al. 2024, Sec. 3).
    """
    a = adjacency.bool().clone()
    a.fill_diagonal_(True)
    deg = adjacency.bool().sum(1).double()
    col = n_train.double() / (deg + 1.0)
    return torch.where(a, col.unsqueeze(0).expand_as(a), torch.zeros((), dtype=torch.float64))


class DeftaParams(GraphParams):
    """DeFTA's trust parameters.

    ``trust_decay`` lambda of ``T <- lambda T + (1 - lambda) e``; ``tolerance`` delta (AUROC
    points): a received model that scores delta or more below the receiver's own model on the
    receiver's validation split gives evidence e = 0 (and weight 0 this round), one that scores
    at least as well gives e = 1, linear in between; ``min_trust``: neighbours whose trust fell
    below it get weight 0.

    DeFTA reads the validation split during training (the trust scores), so validation cannot tune
    it (its validation AUROC is optimistic, most of all at small tolerance). Defaults chosen on a
    split the trust never reads: 20 % of each center's train rows held out
    (:mod:`federation.data.holdout`, configs/defta-tuning.yaml, tolerance {0.02, 0.05, 0.1, 0.2} x
    trust_decay {0.5, 0.9}; docs/baselines.md "DeFTA tuned on held-out train rows"): tolerance 0.1,
    trust_decay 0.9.
    """

    trust_decay: float = Field(0.9, ge=0.0, lt=1.0)
    tolerance: float = Field(0.1, gt=0.0, le=1.0)
    min_trust: float = Field(0.25, ge=0.0, le=1.0)


def trust_evidence(u_nb: torch.Tensor, u_own: torch.Tensor, tolerance: float) -> torch.Tensor:
    """Per-edge trust evidence ``e = clip(1 + (u_nb - u_own) / tolerance, 0, 1)``.

    Args:
        u_nb: ``[m]`` AUROC of the received model on the receiver's validation split.
        u_own: ``[m]`` AUROC of the receiver's own model on the same split.
        tolerance: delta > 0 (AUROC points).

    Returns:
        ``[m]`` float64 in [0, 1]; NaN where either AUROC is NaN (one-class split: no evidence).
    """
    return (1.0 + (u_nb.double() - u_own.double()) / tolerance).clamp(0.0, 1.0)


@register(display_name="DeFTA", family="decentralized", paper_order=7)
class DeFTA(_FixedGraphMethod[DeftaParams]):
    """DeFTA (Zhou et al. 2024, "DeFTA: a plug-and-play peer-to-peer decentralized federated
    learning framework", Information Sciences 670:120582; arXiv:2204.02632).

    DeFTA replaces FedAvg's server by a peer graph: each worker aggregates its own and its
    neighbours' models with a bias-free formula, and a decentralized trust system (DTS) lets each
    worker down-weight or drop neighbours whose models do not work on its own data. Rule
    implemented (fixed graph, edges ``N(i)``), each round:

    1. every receiver i scores each received model theta_j (j in N(i)) and its own theta_i on
       its own validation split: AUROC ``u_ij``, ``u_ii`` (one batched
       ``ctx.evaluate_mixtures`` call over all 2|E| + n pairs);
    2. evidence ``e_ij = clip(1 + (u_ij - u_ii) / delta, 0, 1)`` (:func:`trust_evidence`) and
       trust ``T_ij <- lambda T_ij + (1 - lambda) e_ij`` (T starts at 1; no update when the
       receiver's validation split holds one class);
    3. weights ``W_ij ∝ a_ij T_ij`` for j in N(i) and ``W_ii ∝ a_ii``, with
       ``a_ij = n_j / (d_j + 1)`` (:func:`defta_base_weights`); a neighbour gets weight 0 when
       this round's evidence is 0 (its model lowers the receiver's AUROC by delta or more) or
       its trust is below ``min_trust``; a receiver that drops every neighbour keeps its own
       model (DeFTA's "selfish worker").

    Every graph edge carries a model each round (the receiver must receive a model to score
    it), so the bandwidth is that of the graph. Extra metrics: ``trust_mean`` (mean T over
    directed edges), ``trust_dropped`` (fraction of directed edges with weight 0).
    """

    name = "defta"
    seconds_per_round = 0.75
    Params = DeftaParams

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self.base = defta_base_weights(self.adj, ctx.n_train)
        self.trust = torch.ones(ctx.n, ctx.n, dtype=torch.float64)
        recv, send = self.adj.nonzero(as_tuple=True)
        self.recv, self.send = recv, send
        self._dropped = 0.0

    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        n, p = ctx.n, self.p
        m = self.recv.numel()
        tc = torch.cat([torch.arange(n), self.recv])
        sc = torch.cat([torch.arange(n), self.send])
        wc = torch.zeros(n + m, n, dtype=torch.float64)
        wc[torch.arange(n + m), sc] = 1.0
        auc = ctx.evaluate_mixtures(wc, tc, split="val")
        u_own, u_nb = auc[:n], auc[n:]
        e = trust_evidence(u_nb, u_own[self.recv], p.tolerance)
        known = ~torch.isnan(e)
        t_old = self.trust[self.recv, self.send]
        lam = p.trust_decay
        t_new = torch.where(known, lam * t_old + (1.0 - lam) * torch.nan_to_num(e), t_old)
        self.trust[self.recv, self.send] = t_new
        keep = (t_new >= p.min_trust) & ~(known & (torch.nan_to_num(e, nan=1.0) <= 0.0))
        w = torch.diag(torch.diagonal(self.base)).clone()
        w[self.recv, self.send] = torch.where(keep, self.base[self.recv, self.send] * t_new,
                                              torch.zeros((), dtype=torch.float64))
        w = w / w.sum(1, keepdim=True)
        self._dropped = float((~keep).double().mean()) if m else 0.0
        return RoundPlan(w=w, adjacency=self.adj)

    def after_exchange(self, ctx: Context, round_idx: int, plan: RoundPlan) -> dict[str, float]:
        tm = float(self.trust[self.recv, self.send].mean()) if self.recv.numel() else float("nan")
        return {"trust_mean": tm, "trust_dropped": self._dropped}


class WpfedParams(NumbersNotFlags):
    """WPFed's parameters.

    ``lsh_bits``: SimHash code length b; ``embedding``: what is hashed, ``"params"`` (the
    exchanged parameters minus the common initial model) or ``"probe"`` (the model's logits on
    ``probe_rows`` shared random inputs); ``candidates``: L, LSH candidates kept per center (the
    most similar codes); ``min_similarity``: candidates must also agree on at least this
    fraction of bits; ``similarity_weight``: lambda of the neighbour score
    ``lambda sim + (1 - lambda) q``; ``quality_decay``: mu of ``q <- mu q + (1 - mu) r``;
    ``quality_prior``: q before any report.

    ``similarity_weight`` 0.25 and ``candidates`` 8 are the validation choice (configs/tuning.yaml,
    {0.25, 0.5, 0.75} x {4, 8}; docs/baselines.md "Remaining grids").
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    lsh_bits: int = Field(64, ge=1, le=4096)
    embedding: Literal["params", "probe"] = "params"
    probe_rows: int = Field(64, ge=1)
    candidates: int = Field(8, ge=1)
    min_similarity: float = Field(0.0, ge=0.0, le=1.0)
    similarity_weight: float = Field(0.25, ge=0.0, le=1.0)
    quality_decay: float = Field(0.5, ge=0.0, lt=1.0)
    quality_prior: float = Field(0.5, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _mixing_row_defined(self) -> WpfedParams:
        """``similarity_weight = 0`` with ``quality_prior = 0`` makes every weight of round 1
        ``lambda sim + (1 - lambda) q = 0``: a 0/0 mixing row. Refused here."""
        if self.similarity_weight == 0.0 and self.quality_prior == 0.0:
            raise ValueError("similarity_weight = 0 with quality_prior = 0 gives every neighbour and the center "
                             "itself weight 0 in round 1 (a 0/0 mixing row); raise one of them above 0")
        return self


def simhash_codes(embedding: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    """Random-hyperplane LSH (SimHash; Charikar 2002): bit k of center i is
    ``sign(<x_i, r_k>) > 0``.

    Args:
        embedding: ``[n, D]`` one vector per center.
        planes: ``[D, b]`` Gaussian hyperplane normals.

    Returns:
        ``[n, b]`` bool codes. ``P[bit differs] = angle(x_i, x_j) / pi``.
    """
    return (embedding.double() @ planes.double()) > 0


def hamming_similarity(codes: torch.Tensor) -> torch.Tensor:
    """``[n, n]`` float64 fraction of equal bits ``1 - hamming(c_i, c_j) / b`` of ``[n, b]`` codes."""
    c = codes.double()
    b = c.shape[1]
    agree = c @ c.T + (1.0 - c) @ (1.0 - c).T
    return agree / b


def lsh_candidates(similarity: torch.Tensor, n_candidates: int, min_similarity: float) -> torch.Tensor:
    """WPFed's LSH filter: for each center the ``n_candidates`` peers with the highest code
    similarity, among those with similarity >= ``min_similarity`` (never itself).

    Args:
        similarity: ``[n, n]`` Hamming similarities (:func:`hamming_similarity`).

    Returns:
        ``[n, n]`` bool, row i = center i's candidate peers.
    """
    n = similarity.shape[0]
    s = similarity.double().clone()
    s.fill_diagonal_(-torch.inf)
    s = torch.where(s >= min_similarity, s, torch.full_like(s, -torch.inf))
    k = min(n_candidates, max(n - 1, 0))
    out = torch.zeros(n, n, dtype=torch.bool)
    if k == 0:
        return out
    top = torch.topk(s, k, dim=1, sorted=True)  # ties broken by torch.topk (lowest index first on CPU)
    out.scatter_(1, top.indices, torch.isfinite(top.values))
    return out


def select_one_edge_each(score: torch.Tensor) -> torch.Tensor:
    """Each center initiates one undirected edge to its best-scored peer, so the round has one
    edge per center (n edges) whenever possible.

    Center i picks ``argmax_j score[i, j]`` over finite scores. Two centers that pick each other
    would share one edge, so the one with the larger index moves on to its next-best peer; this
    is repeated until no such mutual pair is left (pointers only advance, so it terminates).
    A center whose finite scores are exhausted falls back to the best-scored peer over all
    peers that is not yet linked to it (rare: only in tiny federations), else initiates none.

    Args:
        score: ``[n, n]`` float64, ``-inf`` for peers that are not candidates; the diagonal is
            ignored.

    Returns:
        ``[n]`` int64 picked peer per center (-1: none). The undirected edges
        ``{i, pick_i}`` are pairwise distinct.
    """
    n = score.shape[0]
    s = score.double().clone()
    s.fill_diagonal_(-torch.inf)
    order = torch.argsort(s, dim=1, descending=True, stable=True)
    n_valid = torch.isfinite(s).sum(1)
    ptr = torch.zeros(n, dtype=torch.int64)
    ar = torch.arange(n)
    pick = torch.full((n,), -1, dtype=torch.int64)
    for _ in range(n * n + 1):
        has = ptr < n_valid
        pick = torch.where(has, order[ar, ptr.clamp(max=n - 1)], torch.full_like(ptr, -1))
        j = pick.clamp(min=0)
        mutual = has & (pick[j] == ar) & (ar > j)
        if not bool(mutual.any()):
            break
        ptr = ptr + mutual.long()
    lost = (pick < 0).nonzero().flatten().tolist()
    if lost and n >= 3:  # fallback, only when a center ran out of candidates
        adj = torch.zeros(n, n, dtype=torch.bool)
        ok = pick >= 0
        adj[ar[ok], pick[ok]] = True
        adj = adj | adj.T
        fill = torch.nan_to_num(score.double(), neginf=-1e300)
        for i in lost:
            free = ~adj[i]
            free[i] = False
            if bool(free.any()):
                j = int(torch.where(free, fill[i], torch.full_like(fill[i], -torch.inf)).argmax())
                pick[i] = j
                adj[i, j] = adj[j, i] = True
    return pick


@register(display_name="WPFed", family="decentralized", paper_order=8)
class WPFed(Method[WpfedParams]):
    """WPFed (Ye et al. 2024, "WPFed: web-based personalized federation for decentralized
    systems", arXiv:2410.11378v1).

    WPFed lets every client choose its neighbours on a global scale each round: clients publish
    LSH codes of their models so that peers can assess similarity by Hamming distance, rank the
    models they receive, and publish the rankings; a client then selects neighbours by a weight
    that combines code similarity with the peers' published ranking. Rule implemented, round t:

    1. LSH: center i's SimHash code ``c_i = sign(R^T x_i)`` (b bits, R ``[D, b]`` Gaussian, drawn
       once per run) of its embedding x_i (``params``: the exchanged parameters minus the common
       initial model; ``probe``: its logits on shared random probe inputs); codes are published
       (metadata bytes n * ceil(b / 8));
    2. filter: ``C_i`` = the L peers with the highest code similarity
       ``sim_ij = 1 - hamming(c_i, c_j) / b`` among those with ``sim_ij >= min_similarity``
       (:func:`lsh_candidates`);
    3. weighted selection: score ``omega_ij = lambda sim_ij + (1 - lambda) q_j`` on C_i, where
       ``q_j`` is the peer-reported quality of j's model (below); each center initiates one
       edge to its best-scored candidate (:func:`select_one_edge_each`), so the round's graph
       has exactly n undirected edges (1.00x FedAvg's bytes) unless candidates run out;
    4. aggregation over the round's graph ``N_t(i)``: ``W_ij ∝ omega_ij`` for j in N_t(i),
       ``W_ii ∝ lambda + (1 - lambda) q_i``;
    5. peer ranking: every receiver scores each model it received and its own on its own
       validation split (AUROC ``r_ij``, one batched ``ctx.evaluate_mixtures`` call) and
       publishes the scores (8 metadata bytes per report); ``q_j <- mu q_j + (1 - mu)
       mean_i r_ij`` over j's receivers with a score.

    Deviation: WPFed transfers knowledge by distillation on a reference set; here neighbours'
    parameters are averaged (as in every other P2P baseline of the table) so bytes are
    model payloads. Extra metrics: ``lsh_candidates`` (mean |C_i|), ``quality_mean``.
    """

    name = "wpfed"
    seconds_per_round = 0.75
    Params = WpfedParams
    #: drawn by setup from the seed (the LSH planes are ~8 MB): rebuilt, not checkpointed
    static_state = ("p", "theta0", "probe", "planes")

    def setup(self, ctx: Context) -> None:
        p = self.p
        self.theta0 = {k: ctx.params[k].detach().clone() for k in ctx.exchanged}
        if p.embedding == "params":
            dim = sum(int(v[0].numel()) for v in self.theta0.values())
        else:
            dim = p.probe_rows
            self.probe = torch.randn(1, p.probe_rows, ctx.data.d, generator=ctx.rng)
        self.planes = torch.randn(dim, p.lsh_bits, generator=ctx.rng, dtype=torch.float64)
        self.quality = torch.full((ctx.n,), float(p.quality_prior), dtype=torch.float64)
        self._n_cand = 0.0

    def embedding(self, ctx: Context) -> torch.Tensor:
        """``[n, D]`` the vectors hashed this round (see :class:`WpfedParams`)."""
        theta = ctx.pre_exchange
        if self.p.embedding == "params":
            return torch.cat([(theta[k] - self.theta0[k]).flatten(1) for k in ctx.exchanged], dim=1)

        x = self.probe.expand(ctx.n, -1, -1)
        with torch.no_grad():
            return forward(theta, x)[0]

    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        n, p = ctx.n, self.p
        lam = p.similarity_weight
        codes = simhash_codes(self.embedding(ctx), self.planes)
        sim = hamming_similarity(codes)
        cand = lsh_candidates(sim, p.candidates, p.min_similarity)
        self._n_cand = float(cand.sum(1).double().mean())
        omega = lam * sim + (1.0 - lam) * self.quality.unsqueeze(0)
        pick = select_one_edge_each(torch.where(cand, omega, torch.full_like(omega, -torch.inf)))
        ok = pick >= 0
        adj = torch.zeros(n, n, dtype=torch.bool)
        adj[torch.arange(n)[ok], pick[ok]] = True
        adj = adj | adj.T
        w = torch.where(adj, omega, torch.zeros((), dtype=torch.float64))
        w = w + torch.diag(lam + (1.0 - lam) * self.quality)
        w = w / w.sum(1, keepdim=True)
        # peer ranking of the received models (one batched evaluation)
        recv, send = adj.nonzero(as_tuple=True)
        m = recv.numel()
        wc = torch.zeros(m, n, dtype=torch.float64)
        wc[torch.arange(m), send] = 1.0
        r = ctx.evaluate_mixtures(wc, recv, split="val") if m else torch.empty(0, dtype=torch.float64)
        ok_r = ~torch.isnan(r)
        tot = torch.zeros(n, dtype=torch.float64).index_add_(0, send[ok_r], r[ok_r])
        cnt = torch.zeros(n, dtype=torch.float64).index_add_(0, send[ok_r], torch.ones_like(r[ok_r]))
        mu = p.quality_decay
        self.quality = torch.where(cnt > 0, mu * self.quality + (1.0 - mu) * tot / cnt.clamp(min=1.0), self.quality)
        meta = n * ((p.lsh_bits + 7) // 8) + 8 * m
        return RoundPlan(w=w, adjacency=adj, metadata_bytes=meta)

    def after_exchange(self, ctx: Context, round_idx: int, plan: RoundPlan) -> dict[str, float]:
        return {"lsh_candidates": self._n_cand, "quality_mean": float(self.quality.mean())}


DECENTRALIZED: tuple[type[Method], ...] = (DeceFL, DeFTA, WPFed)


__all__ = [
    "DECENTRALIZED", "DeceFL", "DeFTA", "WPFed", "GraphParams", "DeceFLParams", "DeftaParams", "WpfedParams",
    "consensus_distance", "defta_base_weights", "trust_evidence", "simhash_codes", "hamming_similarity",
    "lsh_candidates", "select_one_edge_each",
]

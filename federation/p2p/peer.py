"""One center as one process: :func:`run_peer` loads the center's own rows, builds its engine and a
replica of the method, and runs the rounds with its peers over :class:`federation.p2p.transport.Node`.

The replica: every peer holds the method object with the same planning state (beliefs, candidate
sets, counters, random generators), and that state changes only through values every peer sees
(announced counts and metadata, coalition scores, validation scores), so every peer computes the
same round plan; each one trains and mixes only its own center. Protocol: docs/p2p.md.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from etl.errors import InputError
from federation.core.checks import check_finite, check_finite_params
from federation.core.config import RunConfig
from federation.core.ledger import Ledger
from federation.core.loop import EvalSchedule, drive
from federation.core.metrics import summarize
from federation.core.seeding import mix_seed
from federation.engine.mixing import apply_momentum, check_row_stochastic
from federation.engine.mlp import AdamState, StackedParams
from federation.methods import Context, Method, get_method
from federation.methods.base import RoundPlan
from federation.p2p.engine import PeerEngine
from federation.p2p.local import announce, build_local, read_own_rows
from federation.p2p.transport import Node, PeerUnavailable, TlsFiles
from federation.p2p.wire import Message
from federation.run import checkpoint
from federation.run.realworld import mask_mixing
from federation.run.runner import early_stop_step, finalize_run, round_metrics

__all__ = ["PeerSpec", "run_peer", "check_p2p_config", "SERVER"]

#: the center whose process also plays the server of a star method (FedAvg)
SERVER = 0


def check_p2p_config(cfg: RunConfig) -> None:
    """Refuse what a peer-to-peer run cannot do exactly as the simulator (one line naming it).

    Raises:
        InputError: a method outside the peer-to-peer set, or a config section it does not apply.
    """
    cls = get_method(cfg.method)
    if cls.pooled or cls.has_local_loss():
        raise InputError(f"--method {cfg.method}: peer-to-peer runs drive fedavg and the ABPS family "
                         "(a pooled model or a local loss is not supported)")
    family = getattr(cls, "family", "")
    if cfg.method != "fedavg" and family not in ("abps", "goal", "abps-x"):
        raise InputError(f"--method {cfg.method}: peer-to-peer runs drive fedavg and the ABPS family")
    if cfg.method == "fedavg" and cfg.exchange.bf16_wire:
        raise InputError("exchange.bf16_wire: the peer-to-peer star sends fp32 models")
    for what, bad in (("drift", cfg.drift is not None), ("realworld", cfg.realworld is not None),
                      ("exchange.variance_correction", cfg.exchange.variance_correction),
                      ("params.watch_centers", bool(cfg.params.get("watch_centers"))),
                      ("params.drift_window", bool(cfg.params.get("drift_window")))):
        if bad:
            raise InputError(f"{what}: not supported by a peer-to-peer run (needs every center's rows in one place)")


class PublicFederation:
    """What every peer knows about the federation: center ids, announced row counts and metadata
    vectors; the ``data`` a replica method's :class:`Context` sees (no row of any center)."""

    metric_name = "auroc"
    clinical = False

    def __init__(self, center_ids: list[str], hellos: list[dict[str, Any]]) -> None:
        self.center_ids = list(center_ids)
        self.meta = torch.tensor([h["meta"] for h in hellos], dtype=torch.float32)
        self.meta_base = self.meta[:, :3].clone()
        self.splits = {s: SimpleNamespace(n=torch.tensor([h["counts"][s] for h in hellos], dtype=torch.int64))
                       for s in ("train", "val", "test")}
        self.dropped: dict[str, int] = {}

    @property
    def n_centers(self) -> int:
        return len(self.center_ids)

    @property
    def n_train(self) -> torch.Tensor:
        return self.splits["train"].n


class PeerContext(Context):
    """The replica's :class:`Context`: ``params`` / ``pre_exchange`` are ``[n, ...]`` with the
    peer's own row and the rows its partners sent (zeros elsewhere); a coalition score is computed
    by the target's own peer on its own validation rows and shared."""

    peer: PeerRound

    def evaluate(self, split: str = "val", params: StackedParams | None = None) -> torch.Tensor:
        raise InputError("a peer scores only its own center; the method needs every center's scores")

    def evaluate_mixtures(self, wc: torch.Tensor, tc: torch.Tensor, split: str = "val",
                          params: StackedParams | None = None, chunk: int | None = None) -> torch.Tensor:
        theta = params if params is not None else self.pre_exchange
        return self.peer.shared_scores(wc, tc, split, theta, chunk)


@dataclass
class PeerSpec:
    """Everything one peer process needs.

    Attributes:
        cohort: cohort directory (only this center's rows are read).
        index: the center's position in ``center_ids``.
        center_ids: the federation's centers in centers.parquet order.
        cfg: validated run config; seed: run seed.
        addresses: ``{index: host:port}`` of every peer (own: where to listen).
        tls: certificates (None: plaintext).
        output: where the peer's result JSON goes.
        timeout: seconds to wait for a peer's message in a round.
        start_timeout: seconds to wait for every peer's hello.
        listen: ``host:port`` to serve on (default: the own address).
        payload_log: append every message sent to this file.
        checkpoint: write the center's own round state here after every round (:func:`federation.run.checkpoint.save`).
        rejoin: the peer was restarted: it asks the coordinator for the federation's public log,
            replays it, takes its own model from ``checkpoint`` and goes on with the next round.
        await_rejoin: the launcher restarts a peer that dies: the coordinator counts a center that
            stopped answering unavailable for that round, then holds the next roster until it asks
            to rejoin (at most ``start_timeout`` seconds; after that it goes on without it).
    """

    cohort: Path
    index: int
    center_ids: list[str]
    cfg: RunConfig
    seed: int
    addresses: dict[int, str]
    tls: TlsFiles | None
    output: Path
    timeout: float = 60.0
    start_timeout: float = 120.0
    listen: str | None = None
    payload_log: Path | None = None
    checkpoint: Path | None = None
    rejoin: bool = False
    await_rejoin: bool = False


class PeerRound:
    """The messaging of a run: rosters, broadcasts, waits, the scores shared between replicas and the
    public log a restarted peer replays (docs/p2p.md, "Faults")."""

    def __init__(self, spec: PeerSpec, node: Node, engine: PeerEngine, ctx: PeerContext) -> None:
        self.spec, self.node, self.engine, self.ctx = spec, node, engine, ctx
        self.n = len(spec.center_ids)
        self.me = spec.index
        self.others = [j for j in range(self.n) if j != self.me]
        self.round = -1
        self.roster: list[int] = list(range(self.n))  # centers taking part in the current round
        self.down: set[int] = set()  # centers that stopped answering in the current round
        self.log: list[dict[str, Any]] = []  # per round: roster, coalition scores, val / test AUROC
        self.hellos: list[dict[str, Any]] = []
        self.replay: dict[str, Any] | None = None  # the log entry being replayed (a restarted peer)
        self.pending: Message | None = None  # a roster received before its round (a restarted peer)
        self.awaited: set[int] = set()  # centers being restarted, waited for at the next roster

    @property
    def coordinator(self) -> int:
        return min(self.roster)

    def broadcast(self, msg: Message, to: list[int] | None = None) -> None:
        """Send to ``to`` (default: every other center in the roster); a center that does not take
        it is down for the rest of the round."""
        targets = [j for j in (self.others if to is None else to) if j in self.roster and j not in self.down]
        self.down.update(self.node.send_many(targets, msg, self.spec.timeout, wait_for_ready=False))

    def wait_for(self, kind: str) -> float:
        """Seconds to wait for a ``kind`` message: the timeout for the first messages of a round
        (models, uploads, roll call), three times it for those a live peer may send only after
        waiting out a peer that went down itself (scores, rosters, the server's answer); a roster
        held for a restarting center (``await_rejoin``) is waited for ``start_timeout`` longer."""
        if kind == "roster" and self.spec.await_rejoin:  # the coordinator may hold it for a restarting center
            return self.spec.start_timeout + 3 * self.spec.timeout
        return self.spec.timeout if kind in ("model", "up", "alive") else 3 * self.spec.timeout

    def gather(self, kind: str, senders: list[int]) -> dict[int, Message]:
        """The round's ``kind`` messages of ``senders`` in the roster; a center missing at the
        timeout (:meth:`wait_for`) is down for the rest of the round."""
        want = [j for j in senders if j in self.roster and j not in self.down]
        got = self.node.wait(kind, self.round, want, self.wait_for(kind)) if want else {}
        self.down.update(set(want) - set(got))
        return got

    def roll_call(self, r: int) -> torch.Tensor | None:
        """The roster of round ``r``, decided by the coordinator (the lowest center of the last
        roster): the centers that answered, plus restarted ones that asked to rejoin. Returns the
        ``[n]`` availability mask (None: every center)."""
        self.round, self.down = r, set()
        if self.pending is not None and self.pending.round == r:
            roster, joins = self.pending.body["roster"], []
            self.pending = None
        elif self.me == self.coordinator:
            got = self.node.wait("alive", r, [j for j in self.roster if j != self.me], self.spec.timeout)
            joined = {j for j in self.node.take("join") if j != self.me}  # restarted: state lost
            if self.spec.await_rejoin:
                deadline = time.monotonic() + self.spec.start_timeout
                while self.awaited - joined and time.monotonic() < deadline:
                    time.sleep(0.05)
                    joined |= {j for j in self.node.take("join") if j != self.me}
                self.awaited = set(self.roster) - set(got) - joined - {self.me}
            joins = sorted(joined)
            for j in joins:  # a restarted center: a fresh channel to it before the roster and the log go out
                self.node.reset(int(j))
            roster = sorted({self.me, *got, *joins})
            body = {"roster": roster, "joined": joins}
            self.node.send_many([j for j in roster if j != self.me and j not in joins],
                                Message("roster", r, self.me, body=body), self.spec.timeout, wait_for_ready=False)
            if joins:  # a restarted center gets the public log to replay
                state = Message("roster", r, self.me, body={**body, "hellos": self.hellos, "log": self.log})
                self.node.send_many(joins, state, self.spec.timeout)  # they just asked: up, connecting
        else:
            c = self.coordinator
            try:
                self.node.send(c, Message("alive", r, self.me), self.spec.timeout, wait_for_ready=False)
            except PeerUnavailable:
                raise PeerUnavailable(f"the coordinator, center {c}, is down") from None
            msg = self.node.wait("roster", r, [c], self.wait_for("roster")).get(c)
            if msg is None:
                raise PeerUnavailable(f"no roster from the coordinator, center {c}, in round {r + 1}")
            roster = msg.body["roster"]
            joins = msg.body["joined"]
            for j in joins:  # a restarted center: a fresh channel to it
                self.node.reset(int(j))
        self.roster = [int(j) for j in roster]
        self.log.append({"roster": self.roster})
        if len(self.roster) == self.n:
            return None
        mask = torch.zeros(self.n, dtype=torch.bool)
        mask[self.roster] = True
        return mask

    def shared_scores(self, wc: torch.Tensor, tc: torch.Tensor, split: str, theta: StackedParams,
                      chunk: int | None) -> torch.Tensor:
        """``[m]`` metric of every candidate mixture: this peer scores the rows that target its own
        center on its own ``split`` and broadcasts them; the other rows come from their targets' peers.
        Rows of a center that went down in the round score 0.5 each (all coalitions equal: no
        credit either way), the same on every replica."""
        if self.replay is not None:
            return torch.tensor(self.replay["util"], dtype=torch.float64)
        mine = torch.nonzero(tc == self.me).flatten()
        w_mine = wc.index_select(0, mine) if wc.is_sparse else wc[mine]
        own = self.engine.evaluate_mixtures(theta, w_mine, tc[mine], split, self.ctx.exchanged, self.ctx.bf16, chunk)
        self.broadcast(Message("util", self.round, self.me, arrays={"v": own.to(torch.float64)}))
        out = torch.full((tc.numel(),), 0.5, dtype=torch.float64)
        out[mine] = own
        for j, msg in self.gather("util", self.others).items():
            rows = torch.nonzero(tc == j).flatten()
            v = msg.arrays["v"]
            if v.numel() != rows.numel():
                raise PeerUnavailable(f"center {j} sent {v.numel()} coalition scores, expected {rows.numel()}")
            out[rows] = v
        self.log[-1]["util"] = out.tolist()
        return out


def _stack(n: int, me: int, own: StackedParams, rows: dict[int, dict[str, torch.Tensor]] | None = None) -> StackedParams:
    """``[n, ...]`` parameters: row ``me`` = ``own`` (``[1, ...]``), row j = ``rows[j]`` for the
    keys it holds, zeros elsewhere."""
    out = {}
    for k, v in own.items():
        t = v.new_zeros((n, *v.shape[1:]))
        t[me] = v[0]
        for j, r in (rows or {}).items():
            if k in r:
                t[j] = r[k].to(v.dtype)
        out[k] = t
    return out


def _digest(w: torch.Tensor | None) -> str:
    """Short hash of a round's mixing matrix (replicas compare plans)."""
    if w is None:
        return "none"
    return hashlib.sha256(w.double().contiguous().numpy().tobytes()).hexdigest()[:16]


def run_peer(spec: PeerSpec) -> dict[str, Any]:
    """Run one center of a peer-to-peer federation to the end; write and return its result.

    Returns:
        ``{"summary": results.json seed entry, "history": per-round metrics, "per_center": ...,
        "bytes": counters, "ledger": per-round ledger}`` (also written to ``spec.output``).

    Raises:
        InputError: bad cohort / config (one line); PeerUnavailable: a peer stopped answering.
    """
    cfg, me, n = spec.cfg, spec.index, len(spec.center_ids)
    check_p2p_config(cfg)
    cls = get_method(cfg.method)
    rows = read_own_rows(spec.cohort, spec.center_ids[me])
    node = Node(me, spec.listen or spec.addresses[me], spec.addresses, spec.tls, spec.payload_log)
    try:
        return _run(spec, cfg, cls, rows, node, me, n)
    finally:
        node.close()


def _hellos(spec: PeerSpec, node: Node, rows: Any, cfg: RunConfig, me: int, n: int) -> tuple[list[dict[str, Any]], Message | None]:
    """Every center's announcement (:func:`federation.p2p.local.announce`), in center order; for a
    restarted peer, those the coordinator sends with the roster of the round it rejoins."""
    others = [j for j in range(n) if j != me]
    if spec.rejoin:
        # The request goes to every center (this peer does not know which one coordinates now). A
        # send that failed (a peer still connecting, a loaded machine) is tried again each second:
        # a request that reached the coordinator twice only puts this center in one more roster.
        deadline = time.monotonic() + spec.start_timeout
        unsent, next_try = others, 0.0
        while time.monotonic() < deadline:
            if unsent and time.monotonic() >= next_try:
                unsent = node.send_many(unsent, Message("join", -1, me), spec.timeout, wait_for_ready=False)
                next_try = time.monotonic() + 1.0
            got = node.take("roster")
            if got:
                msg = next(iter(got.values()))
                return list(msg.body["hellos"]), msg
            time.sleep(0.05)
        raise PeerUnavailable(f"--rejoin: no answer to the rejoin request within {spec.start_timeout:g} s "
                              "(is the federation running?)")
    hello = announce(rows, cfg.data)
    failed = node.send_many(others, Message("hello", -1, me, body=hello), spec.start_timeout)
    if failed:
        raise PeerUnavailable(f"center {failed[0]} did not come up within {spec.start_timeout:g} s")
    got = node.wait("hello", -1, others, spec.start_timeout)
    if len(got) != len(others):
        raise PeerUnavailable(f"no hello from center {sorted(set(others) - set(got))[0]}")
    return [hello if j == me else got[j].body for j in range(n)], None


def _run(spec: PeerSpec, cfg: RunConfig, cls: type[Method], rows: Any, node: Node, me: int, n: int) -> dict[str, Any]:
    seed = spec.seed
    others = [j for j in range(n) if j != me]
    # 1. hello: counts, categorical values, metadata vector, numeric aggregates (never a row)
    hellos, joined = _hellos(spec, node, rows, cfg, me, n)
    for j, h in enumerate(hellos):
        if h.get("center_id") != spec.center_ids[j]:
            raise InputError(f"center {j} announced center_id {h.get('center_id')!r}, expected {spec.center_ids[j]!r}")
    data, enc_bytes = build_local(rows, hellos, me, cfg.data)
    public = PublicFederation(spec.center_ids, hellos)
    n_train = public.n_train
    small = [spec.center_ids[j] for j in range(n) if int(n_train[j]) < cfg.min_train]
    if small:
        raise InputError(f"min_train {cfg.min_train}: center {small[0]!r} has fewer train rows; a peer-to-peer "
                         "run needs every listed center to take part")
    engine = PeerEngine(data, cfg.engine, seed, me, n_train)
    method: Method = cls(cls.Params.model_validate(cfg.params))
    ex, hd, sizes = engine.layout(cfg.exchange.head_layers)
    ledger = Ledger(n, sum(sizes.values()), cfg.reference_rounds)
    ctx = PeerContext(cfg=cfg, data=public, engine=engine, seed=seed, ledger=ledger,  # type: ignore[arg-type]
                      exchanged=ex, head=hd, bf16=cfg.exchange.bf16_wire,
                      rng=torch.Generator().manual_seed(mix_seed(seed, 0x3E7)))
    peer = PeerRound(spec, node, engine, ctx)
    peer.hellos = hellos
    ctx.peer = peer
    params = engine.init_params()  # [1, ...]: this center only
    state = AdamState.zeros_like(params)
    ctx.params = _stack(n, me, params)
    method.setup(ctx)
    payload = sum(sizes[k] for k in ex) * cls.payloads_per_link
    bpp = 2 if cfg.exchange.bf16_wire else 4
    momentum: StackedParams | None = None
    rb: Any = None
    extras: dict[str, Any] = {}
    es = cfg.early_stopping
    best: tuple = (-math.inf, -1, None)
    last: dict[str, torch.Tensor] = {}
    digests: list[str] = []

    def sent_block() -> dict[str, torch.Tensor]:
        """The exchanged block as it goes on the wire (bf16 values when ``bf16_wire``)."""
        return {k: (params[k][0].to(torch.bfloat16) if cfg.exchange.bf16_wire else params[k][0].clone()) for k in ex}

    def plan_of(r: int) -> RoundPlan:
        """The method's plan under this round's roster (:func:`federation.run.realworld.mask_mixing`)."""
        plan = method.plan_round(ctx, r)
        a = ctx.available
        if a is not None and plan.w is not None:
            adj = plan.adjacency.bool() & a.unsqueeze(0) & a.unsqueeze(1) if plan.adjacency is not None else None
            plan = RoundPlan(w=mask_mixing(plan.w, a, a), adjacency=adj,
                             server_links=int(a.sum()) if plan.server_links else 0,
                             probe_bytes=plan.probe_bytes, metadata_bytes=plan.metadata_bytes)
        if plan.w is not None:
            if tuple(plan.w.shape) != (n, n):
                raise ValueError(f"{cfg.method}: mixing matrix must be [n, n] = [{n}, {n}]")
            check_finite("mixing matrix W", plan.w, cfg.method, seed, r + 1)
            check_row_stochastic(plan.w)
        return plan

    def book(r: int, plan: RoundPlan) -> None:
        """The round's ledger record and method update (the same on every replica)."""
        nonlocal rb, extras
        digests.append(_digest(plan.w))
        meta_bytes = plan.metadata_bytes + (enc_bytes if r == 0 else 0)
        rb = ledger.record(r, plan.adjacency, plan.server_links if plan.w is not None else 0,
                           payload, bpp, plan.probe_bytes, meta_bytes)
        ctx.params = _stack(n, me, params)
        extras = method.after_exchange(ctx, r, plan)
        extras = {k: v for k, v in extras.items() if not (isinstance(v, float) and math.isnan(v))}
        for k, v in extras.items():
            check_finite(f"method output {k!r}", v, cfg.method, seed, r + 1)

    def step(r: int) -> None:
        nonlocal state, momentum
        ctx.available = peer.roll_call(r)
        round_start = {k: v.clone() for k, v in params.items()}
        ctx.round_start = _stack(n, me, round_start)
        if cfg.engine.reset_optimizer_each_round:
            state = AdamState.zeros_like(params)
        engine.train_round(params, state, r, None)
        check_finite_params("parameters after local training", params, cfg.method, seed, r + 1)
        ctx.params = _stack(n, me, params)
        ctx.pre_exchange = {k: v.clone() for k, v in ctx.params.items()}
        plan = plan_of(r)
        if plan.w is not None:
            w = plan.w
            if plan.server_links:  # star: every center uploads to the server's endpoint, which answers each
                node.send(SERVER, Message("up", r, me, arrays=sent_block()), spec.timeout, wait_for_ready=False)
                if me == SERVER:
                    ups = peer.gather("up", [j for j in range(n) if j != SERVER])
                    ups[SERVER] = node.wait("up", r, [SERVER], spec.timeout)[SERVER]
                    got = torch.zeros(n, dtype=torch.bool)
                    got[list(ups)] = True
                    if not bool(got[peer.roster].all()):  # a center went down after the roll call
                        w = mask_mixing(w, got, got)
                    theta = _stack(n, me, params, {j: m.arrays for j, m in ups.items()})
                    mixed_all = method.aggregate(ctx, w, theta)
                    for j in sorted(ups):
                        try:
                            node.send(j, Message("down", r, SERVER, arrays={k: v[j] for k, v in mixed_all.items()}),
                                      spec.timeout, wait_for_ready=False)
                        except PeerUnavailable:
                            peer.down.add(j)
                down = node.wait("down", r, [SERVER], peer.wait_for("down")).get(SERVER)
                if down is None:
                    raise PeerUnavailable(f"no model from the server (center {SERVER}) in round {r + 1}")
                mixed = {k: down.arrays[k].unsqueeze(0).to(params[k].dtype) for k in ex}
            else:  # mesh: models go both ways along every edge of the plan
                wt = (w != 0) | (w.T != 0)
                if plan.adjacency is not None:
                    wt = wt | plan.adjacency.bool() | plan.adjacency.bool().T
                nbrs = [j for j in range(n) if j != me and bool(wt[me, j])]
                peer.broadcast(Message("model", r, me, arrays=sent_block()), to=nbrs)
                got = peer.gather("model", nbrs)
                # a partner that went down after the roll call: its row holds this center's own model
                received = {j: (got[j].arrays if j in got else {k: sent_block()[k] for k in ex}) for j in nbrs}
                ctx.pre_exchange = _stack(n, me, {k: v.clone() for k, v in params.items()}, received)
                mixed_all = method.aggregate(ctx, w, _stack(n, me, params, received))
                mixed = {k: v[me : me + 1] for k, v in mixed_all.items()}
            prev = {k: round_start[k] for k in mixed}
            mixed = method.after_mix(ctx, r, prev, mixed)
            if cfg.exchange.server_momentum > 0:
                mixed, momentum = apply_momentum(prev, mixed, momentum, cfg.exchange.server_momentum)
            for k, v in mixed.items():
                params[k].copy_(v)
        book(r, plan)

    def metrics_of(vals: torch.Tensor, tests: torch.Tensor) -> dict[str, float]:
        last["val"], last["test"] = vals, tests
        return {**round_metrics(summarize(vals), summarize(tests), rb, ledger),
                **{k: float(v) for k, v in extras.items()}}

    def evaluate(tau: int) -> dict[str, float]:
        """Own val / test AUROC, shared with every peer (with the round's plan digest)."""
        mine = {}
        for s in ("val", "test"):
            scores = method.scores(ctx, params, s, tau - 1)
            check_finite(f"{s} scores", scores[data.splits[s].mask], cfg.method, seed, tau)
            mine[s] = data.split_metric(scores, s)[0]
        dig = digests[-1] if digests else "start"
        peer.broadcast(Message("eval", peer.round, me, body={"digest": dig},
                               arrays={"v": torch.stack([mine["val"], mine["test"]]).double()}))
        vals = torch.full((n,), math.nan, dtype=torch.float64)  # a center that went down: no score
        tests = vals.clone()
        vals[me], tests[me] = mine["val"], mine["test"]
        for j, msg in peer.gather("eval", others).items():
            if msg.body.get("digest") != dig:
                raise RuntimeError(f"center {j}'s round plan differs from this center's (replicas diverged)")
            vals[j], tests[j] = msg.arrays["v"][0], msg.arrays["v"][1]
        peer.log[-1]["eval"] = [vals.tolist(), tests.tolist()]
        return metrics_of(vals, tests)

    def stop(tau: int, metrics: dict[str, float]) -> bool:
        nonlocal best
        halt, best = early_stop_step(es, best, tau, metrics["val_auroc_mean"],
                                     lambda: ({k: v.clone() for k, v in params.items()},
                                              last["val"].clone(), last["test"].clone()))
        return halt

    def save(tau: int) -> None:
        """The center's own round state (a restarted peer goes on from it)."""
        if spec.checkpoint is not None:
            checkpoint.save(spec.checkpoint, {"round": tau, "params": params, "adam": (state.m, state.v, state.t),
                                              "momentum": momentum})

    records: list[tuple[int, dict[str, float]]] = []
    start = 0
    if joined is not None:  # replay the public log: the replica's state as every other peer holds it
        for r, entry in enumerate(joined.body["log"]):
            peer.round, peer.replay = r, entry
            peer.log.append(entry)
            roster = entry["roster"]
            ctx.available = None if len(roster) == n else torch.isin(torch.arange(n), torch.tensor(roster))
            book(r, plan_of(r))
            m = metrics_of(torch.tensor(entry["eval"][0], dtype=torch.float64),
                           torch.tensor(entry["eval"][1], dtype=torch.float64))
            records.append((r + 1, m))
            stop(r + 1, m)
        peer.replay, peer.pending = None, joined
        peer.roster = list(joined.body["roster"])
        start = len(records)
        if spec.checkpoint is not None and spec.checkpoint.is_file():  # own model: where this center stopped
            snap = checkpoint.read(spec.checkpoint, who="--checkpoint")
            for k, v in snap["params"].items():
                params[k].copy_(v)
            state = AdamState(*snap["adam"])
            momentum = snap["momentum"]
    outcome = drive(cfg.max_rounds, step, evaluate, EvalSchedule(every=1), stop=stop, start=start,
                    records=records, after=save)
    history = [{"round": float(tau), **m} for tau, m in outcome.records]
    res = finalize_run(cfg, public, seed, ledger, history, outcome.steps_run, best, params,  # type: ignore[arg-type]
                       last.get("val"), last.get("test"),
                       artifacts=lambda: dict(method.artifacts(ctx)),
                       method_summary=lambda: dict(method.final_metrics(ctx)))
    counters = [{"direction": d, "peer": p, "kind": k, "messages": c[0], "message_bytes": c[1], "payload_bytes": c[2]}
                for (d, p, k), c in sorted(node.counters.items())]
    out = {"center": me, "summary": res.summary(), "history": history, "per_center": res.per_center,
           "artifacts": res.artifacts, "counters": counters, "refused": node.refused,
           "model_sent": [{"round": r, "peer": p, "kind": k, "bytes": b}
                          for (r, p, k), b in sorted(node.model_sent.items())],
           "ledger": [{"round": x.round_idx, "edges": x.edges, "model_bytes": x.model_bytes,
                       "metadata_bytes": x.metadata_bytes, "probe_bytes": x.probe_bytes} for x in ledger.rounds],
           "rosters": [e["roster"] for e in peer.log], "pid": os.getpid(),
           "listen": spec.listen or spec.addresses[me], "addresses": {str(i): a for i, a in spec.addresses.items()}}
    # bye: every peer's counters go to every peer, so any one result holds the federation's bytes
    mine = {"center": me, "counters": counters, "model_sent": out["model_sent"], "refused": node.refused}
    peer.round, peer.down = -2, set()
    peer.broadcast(Message("bye", -2, me, body=mine))
    byes = peer.gather("bye", others)
    out["federation_results"] = [mine if j == me else byes[j].body for j in sorted({me, *byes})]
    tmp = spec.output.with_name(spec.output.name + ".tmp")
    from federation.run.results import strict_json

    tmp.write_text(strict_json(out))
    os.replace(tmp, spec.output)
    return out

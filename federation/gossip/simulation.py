"""Tick-based gossip-learning simulation, all nodes stacked (Tian et al., arXiv 2404.04616, Sec. III-A).

Design notes: docs/gossip.md, "Module notes".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import networkx as nx
import numpy as np
import torch
from pydantic import ConfigDict, Field, field_validator, model_validator

from etl.errors import InputError
from etl.images import ImageDataset
from etl.partition import dirichlet_partition, iid_partition
from federation.core import graphs
from federation.core.config import NumbersNotFlags, unused
from federation.core.loop import EvalSchedule, drive
from federation.core.variance import correct_flat, flat_layer_variance
from federation.gossip.metrics import plateau_delay, reaching_times, weight_difference
from federation.gossip.model import (
    LAYERS,
    LENET5_LAYOUT,
    PIXEL_SCALE,
    accuracy_own,
    accuracy_stacked,
    init_stacked,
    inv_lr,
    sgd_step,
    stacked_gradients,
)

#: Sec. III-C3 threshold (0.8) over the paper's reaching target (0.9 on MNIST).
TL_THRESHOLD_RATIO = 0.8 / 0.9

#: the :class:`GossipConfig` fields that only some settings of a switch read: switch -> setting ->
#: fields. A field that the chosen setting does not read is refused unless it is at its default.
#: ``transfer_threshold``'s settings are ``set`` (a number or ``target``) and ``None`` (:func:`switch_setting`).
SWITCHED: dict[str, dict[object, tuple[str, ...]]] = {
    "topology": {"regular": ("degree",), "star": ()},
    "partition": {"iid": (), "dirichlet": ("alpha",)},
    "transfer_threshold": {"set": ("transfer_check", "own_subset"), "None": ()},
}


def switch_setting(switch: str, value: object) -> object:
    """The key of :data:`SWITCHED` ``[switch]`` that ``value`` selects."""
    if switch == "transfer_threshold":
        return "None" if value is None else "set"
    return value


def idle_fields(values: dict) -> set[str]:
    """The fields that the switches in ``values`` (GossipConfig keyword arguments; a switch left out
    is at its default) leave unread."""
    out: set[str] = set()
    for switch, uses in SWITCHED.items():
        setting = switch_setting(switch, values.get(switch, GossipConfig.model_fields[switch].get_default()))
        out |= {f for fs in uses.values() for f in fs} - set(uses.get(setting, ()))
    return out


class GossipConfig(NumbersNotFlags):
    """One gossip-learning simulation (defaults: the paper's baseline network, Sec. III-A).

    Attributes:
        n_nodes: N. degree: k of Regular(N, k) (``topology: regular`` only).
        topology: "regular" (networkx.random_regular_graph, seeded) or "star" (hub = node 0).
        ticks: simulated ticks.
        t_acquisition: fixed interval (int, 10) or ``[lo, hi]`` uniform (1..19, asynchronous).
        interval_ratio: R = T_averaging / T_training; buffer capacity R * deg_i.
        beta: weight of the old model in eq. (1) (0.5 baseline; 0 = model replacement).
        averaging: "plain" (eq. (1)) or "variance_corrected" (Algorithm 3 then eq. (1)).
        compression_ratio: share of weights sent per message (Sec. III-C2; 1 = whole model).
        transfer_threshold: own-data accuracy that lets a node add a peer (Sec. III-C3; None = off;
            ``"target"`` = ``target_accuracy * 0.8 / 0.9``, the paper's threshold-to-target ratio,
            so a lowered reaching target lowers the threshold with it).
        transfer_check: when a node tests its own-data accuracy: ``"acquisition"`` (after each of
            its training steps, the paper's rule "once its accuracy reaches 0.8") or
            ``"evaluation"`` (only at evaluation ticks, the earlier reading).
        batch_size: samples per acquisition (64).
        lr, momentum, weight_decay, lr_gamma, lr_power: SGD and Caffe "inv" policy.
        partition: "iid" or "dirichlet"; alpha: Dirichlet concentration (0.5; ``dirichlet`` only).
        eval_every: E, ticks between evaluations; test_subset: test images per evaluation;
        own_subset: own-data samples per node for the transfer-learning rule (with a
            ``transfer_threshold`` only, as ``transfer_check``).
        A field that the chosen topology, partition or transfer_threshold does not read
        (:data:`SWITCHED`) is refused unless it is at its default.
        target_accuracy: reaching target (0.9 is the paper's on MNIST; 0.7 default for
            Fashion-MNIST, docs/gossip.md). most_fraction: share of nodes that counts as "most".
        plateau_smooth: moving-average width for eq. (2) on the noisy mean accuracy.
        engine: "grouped" or "vmap" (federation.gossip.model).
        variance_node: node whose layer variances are reported (Fig. 7 used node 49; None = last).
        initial_model: "independent" Xavier draws per node (the paper's gossip setting);
            "broadcast_average" = the global broadcast of Sec. IV / Fig. 6: before any training every
            node is replaced by the average of all independent initial models; "shared" = every
            node starts from node 0's draw (federated learning's w_0, Algorithm 1 line 2).
        server: Fig. 8's federated-learning reference (Sec. VI-A): needs ``topology: star``; node 0
            is a parameter server that never trains; when its buffer holds one model from each
            of the N - 1 clients it averages them (eq. (1), ``beta``; Algorithm 3 if
            ``averaging: variance_corrected``) and sends the new global model to every client,
            which replaces its own (Algorithm 1). ``n_nodes`` counts the server (51 = 50 clients).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    n_nodes: int = Field(50, ge=2)
    degree: int = Field(8, ge=1)
    topology: Literal["regular", "star"] = "regular"
    ticks: int = Field(1000, ge=1)
    t_acquisition: int | tuple[int, int] = 10
    interval_ratio: int = Field(1, ge=1)
    beta: float = Field(0.5, ge=0.0, le=1.0)
    averaging: Literal["plain", "variance_corrected"] = "plain"
    compression_ratio: float = Field(1.0, gt=0.0, le=1.0)
    transfer_threshold: float | Literal["target"] | None = None
    transfer_check: Literal["acquisition", "evaluation"] = "acquisition"
    batch_size: int = Field(64, ge=1)
    lr: float = Field(0.01, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(5e-4, ge=0.0)
    lr_gamma: float = Field(1e-4, ge=0.0)
    lr_power: float = Field(0.75, ge=0.0)
    partition: Literal["iid", "dirichlet"] = "iid"
    alpha: float = Field(0.5, gt=0.0)
    eval_every: int = Field(50, ge=1)
    test_subset: int = Field(1000, ge=10)
    own_subset: int = Field(128, ge=8)
    target_accuracy: float = Field(0.7, gt=0.0, le=1.0)
    most_fraction: float = Field(0.9, gt=0.0, le=1.0)
    plateau_smooth: int = Field(3, ge=1)
    engine: Literal["grouped", "vmap"] = "grouped"
    variance_node: int | None = None
    initial_model: Literal["independent", "broadcast_average", "shared"] = "independent"
    server: bool = False

    @field_validator("t_acquisition")
    @classmethod
    def _check_tacq(cls, v):
        if isinstance(v, int):
            if v < 1:
                raise ValueError("t_acquisition must be >= 1")
        elif not (1 <= v[0] <= v[1]):
            raise ValueError("t_acquisition range must satisfy 1 <= lo <= hi")
        return v

    @field_validator("transfer_threshold")
    @classmethod
    def _check_threshold(cls, v):
        if isinstance(v, float) and not 0.0 <= v <= 1.0:
            raise ValueError("transfer_threshold must be in [0, 1] or 'target'")
        return v

    @property
    def transfer_accuracy(self) -> float | None:
        """The own-data accuracy that lets a node connect one more peer (None: variant off)."""
        if self.transfer_threshold == "target":
            return self.target_accuracy * TL_THRESHOLD_RATIO
        return self.transfer_threshold

    @model_validator(mode="after")
    def _check_graph(self):
        for switch, uses in SWITCHED.items():
            unused(self, "simulation", switch, uses, switch_setting(switch, getattr(self, switch)),
                   shown=str if switch == "transfer_threshold" else repr)
        if self.topology == "regular" and (self.degree >= self.n_nodes or (self.n_nodes * self.degree) % 2):
            raise ValueError(f"Regular(N={self.n_nodes}, k={self.degree}) needs k < N and N*k even")
        if self.server and self.topology != "star":
            raise ValueError("server: true needs topology: star (node 0 is the parameter server)")
        if self.plateau_smooth % 2 == 0:
            raise ValueError("plateau_smooth must be odd")
        if self.variance_node is not None and not 0 <= self.variance_node < self.n_nodes:
            raise ValueError("variance_node must be a node index")
        return self


@dataclass
class GossipResult:
    """Curves and summary numbers of one simulation.

    Attributes:
        eval_ticks: ``[T]`` ticks of the evaluations (state after all events of earlier ticks).
        accuracy: ``[T, N]`` per-node test-subset accuracy.
        layer_variance_mean: ``[T, 4]`` mean over nodes of each layer's weight variance (conv1,
            conv2, ip1, ip2; Fig. 7). layer_variance_node: ``[T, 4]`` the same for one node.
        weight_diff: ``[T, 4]`` model weight difference per layer (Sec. III-A).
        degree_mean: ``[T]`` mean current degree (changes only in the transfer-learning variant).
        t_first_average: first tick with an averaging anywhere (None: never).
        plateau_delay: eq. (2) in ticks (None: undefined). first_reach / most_reach: ticks.
        n_train_steps, n_averages, n_messages: totals. params_sent: parameters sent in messages.
        wall_s: seconds; train_s: seconds in stacked training steps.
    """

    eval_ticks: np.ndarray
    accuracy: np.ndarray
    layer_variance_mean: np.ndarray
    layer_variance_node: np.ndarray
    weight_diff: np.ndarray
    degree_mean: np.ndarray
    t_first_average: int | None
    plateau_delay: float | None
    first_reach: float | None
    most_reach: float | None
    n_train_steps: int
    n_averages: int
    n_messages: int
    params_sent: float
    wall_s: float
    train_s: float
    variance_node: int = 0
    extra: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """JSON-ready scalar summary."""
        return {"t_first_average": self.t_first_average, "plateau_delay": self.plateau_delay,
                "first_reach": self.first_reach, "most_reach": self.most_reach,
                "final_mean_accuracy": float(self.accuracy[-1].mean()),
                "max_mean_accuracy": float(self.accuracy.mean(1).max()),
                "n_train_steps": self.n_train_steps, "n_averages": self.n_averages,
                "n_messages": self.n_messages, "params_sent": self.params_sent,
                "wall_s": self.wall_s, "train_s": self.train_s}

    def curves(self) -> dict:
        """JSON-ready curves (lists)."""
        return {"eval_ticks": self.eval_ticks.tolist(), "accuracy": self.accuracy.round(4).tolist(),
                "layers": list(LAYERS),
                "layer_variance_mean": self.layer_variance_mean.tolist(),
                "layer_variance_node": self.layer_variance_node.tolist(), "variance_node": self.variance_node,
                "weight_diff": self.weight_diff.tolist(), "degree_mean": self.degree_mean.tolist()}


def build_graph(cfg: GossipConfig, seed: int) -> nx.Graph:
    """Regular(N, k) or Star(N) with hub 0, drawn by :func:`federation.core.graphs.build_graph`."""
    return graphs.build_graph(cfg.topology, cfg.n_nodes, seed, k=cfg.degree)


def partition_table(labels: np.ndarray, cfg: GossipConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each node's training indices as a padded table.

    Returns:
        (table int64 ``[N, max_len]`` padded with the row's first index, lengths int64 ``[N]``).
    """
    if cfg.partition == "iid":
        parts = iid_partition(len(labels), cfg.n_nodes, seed)
    else:
        parts = dirichlet_partition(labels, cfg.n_nodes, cfg.alpha, seed, min_size=1)  # batches resample
    lengths = torch.tensor([len(p) for p in parts], dtype=torch.int64)
    table = torch.zeros(cfg.n_nodes, int(lengths.max()), dtype=torch.int64)
    for i, p in enumerate(parts):  # setup only, not the hot path
        table[i, :len(p)] = torch.from_numpy(p)
        table[i, len(p):] = int(p[0])
    return table, lengths


class _Sampler:
    """Draws each node's fresh batch uniformly (with replacement) from its own partition."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, table: torch.Tensor, lengths: torch.Tensor,
                 gen: torch.Generator):
        self.x, self.y, self.table, self.lengths, self.gen = x, y, table, lengths, gen

    def draw(self, nodes: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        u = torch.rand(len(nodes), size, generator=self.gen, dtype=torch.float64)
        pos = (u * self.lengths[nodes].unsqueeze(1)).long().clamp_max_(self.lengths[nodes].unsqueeze(1) - 1)
        idx = self.table[nodes.unsqueeze(1), pos]
        return self.x[idx].float().mul_(PIXEL_SCALE), self.y[idx]


def train_nodes(flat: torch.Tensor, mom: torch.Tensor, iters: torch.Tensor, active: torch.Tensor,
                xb: torch.Tensor, yb: torch.Tensor, cfg: GossipConfig) -> torch.Tensor:
    """One SGD step of the ``active`` nodes only, as one stacked computation; others untouched.

    The active rows of ``flat`` / ``mom`` are gathered, stepped (lr from each node's own
    iteration counter, Caffe "inv" policy) and scattered back; ``iters[active]`` += 1. Inactive
    nodes keep parameters, momentum and iteration counter (the masking of Sec. III-A's
    per-node acquisition times).

    Args:
        flat, mom: ``[N, P]`` parameters and momentum (updated in place).
        iters: int64 ``[N]`` iteration counters (updated in place).
        active: int64 ``[n_a]`` node indices; xb ``[n_a, B, 1, 28, 28]``, yb ``[n_a, B]``.
    Returns:
        the active nodes' new parameters ``[n_a, P]``.
    """
    p_act = flat.index_select(0, active)
    m_act = mom.index_select(0, active)
    grads, _ = stacked_gradients(p_act, xb, yb, cfg.engine)
    lr = inv_lr(cfg.lr, iters[active], cfg.lr_gamma, cfg.lr_power)
    sgd_step(p_act, m_act, grads, lr, cfg.momentum, cfg.weight_decay)
    flat.index_copy_(0, active, p_act)
    mom.index_copy_(0, active, m_act)
    iters[active] += 1
    return p_act


def simulate(cfg: GossipConfig, data: ImageDataset, seed: int,
             on_eval: Callable[[int, dict], None] | None = None,
             checkpoint: Callable[[int, Callable[[], dict]], None] | None = None,
             resume: dict | None = None) -> GossipResult:
    """Run one gossip-learning simulation (module docstring) with stacked nodes.

    Args:
        cfg: the configuration.
        data: an image data set of 1x28x28 images (Fashion-MNIST / MNIST).
        seed: seeds the graph, partition, initialization, acquisition times and batches.
        on_eval: optional callback ``(tick, metrics)`` after each evaluation (for MLflow).
        checkpoint: ``checkpoint(t, snapshot)`` after every tick t the run goes on from;
            ``snapshot()`` is the tick state (parameters, momentum, iteration counters, buffers,
            acquisition times, peers switched on, the random stream, totals, curves so far;
            federation/run/checkpoint.py).
        resume: a state ``snapshot()`` returned (same cfg, data and seed): the run goes on after its
            tick; ``on_eval`` sees only the later evaluations. Same figures as uninterrupted (the
            ``wall_s`` / ``train_s`` seconds aside).
    Returns:
        :class:`GossipResult`.
    Raises:
        InputError: images are not 1x28x28, or the test subset is larger than the test set.
    """
    if tuple(data.x_train.shape[1:]) != (1, 28, 28):
        raise InputError(f"gossip: LeNet-5 needs 1x28x28 images, data set {data.name} has {data.x_train.shape[1:]}")
    if cfg.test_subset > len(data.y_test):
        raise InputError(f"gossip: test_subset {cfg.test_subset} exceeds the {len(data.y_test)} test images")
    t0 = time.perf_counter()
    layout = LENET5_LAYOUT
    n = cfg.n_nodes
    gen = torch.Generator().manual_seed(seed)

    # ---- graph: directed edge list (src -> dst) of the base topology
    g = build_graph(cfg, seed)
    und = np.array(sorted(g.edges()), dtype=np.int64).reshape(-1, 2)
    src = torch.from_numpy(np.concatenate([und[:, 0], und[:, 1]]))
    dst = torch.from_numpy(np.concatenate([und[:, 1], und[:, 0]]))
    transfer = cfg.transfer_threshold is not None
    tl_acc = cfg.transfer_accuracy
    edge_on = torch.zeros(len(src), dtype=torch.bool) if transfer else torch.ones(len(src), dtype=torch.bool)
    base_deg = torch.bincount(dst, minlength=n)
    # waiting list of the transfer-learning variant: each node's base peers in a random order
    max_deg = int(base_deg.max())
    waiting = torch.full((n, max_deg), -1, dtype=torch.int64)
    for i in range(n):  # setup only
        nb = torch.tensor(sorted(g.neighbors(i)), dtype=torch.int64)
        waiting[i, :len(nb)] = nb[torch.randperm(len(nb), generator=gen)]
    wait_ptr = torch.zeros(n, dtype=torch.int64)
    edge_index = {(int(s), int(d)): e for e, (s, d) in enumerate(zip(src.tolist(), dst.tolist()))}

    # ---- data
    xtr = torch.from_numpy(data.x_train)
    ytr = torch.from_numpy(data.y_train)
    table, lengths = partition_table(data.y_train, cfg, seed)
    sampler = _Sampler(xtr, ytr, table, lengths, gen)
    test_idx = torch.randperm(len(data.y_test), generator=torch.Generator().manual_seed(seed + 7919))[:cfg.test_subset]
    x_test = torch.from_numpy(data.x_test)[test_idx].float().mul_(PIXEL_SCALE)
    y_test = torch.from_numpy(data.y_test)[test_idx]

    # ---- state
    flat = init_stacked(n, gen, layout)
    if cfg.initial_model == "broadcast_average":      # Sec. IV, Fig. 6: global broadcast at t = 0
        flat[:] = flat.mean(0, keepdim=True)
    elif cfg.initial_model == "shared":               # one w_0 for every node (Algorithm 1)
        flat[:] = flat[0:1].clone()
    mom = torch.zeros_like(flat)
    iters = torch.zeros(n, dtype=torch.int64)
    n_layers = len(layout.names)
    buf_sum = torch.zeros_like(flat)
    buf_cnt = torch.zeros(n, dtype=torch.float32)
    buf_var = torch.zeros(n, n_layers, dtype=torch.float64)
    compress = cfg.compression_ratio < 1.0
    buf_pcnt = torch.zeros_like(flat) if compress else None
    fixed = isinstance(cfg.t_acquisition, int)
    lo, hi = (cfg.t_acquisition, cfg.t_acquisition) if fixed else cfg.t_acquisition

    def draw_interval(k: int) -> torch.Tensor:
        return torch.randint(lo, hi + 1, (k,), generator=gen, dtype=torch.int64)

    next_train = draw_interval(n) - 1
    if cfg.server:
        next_train[0] = cfg.ticks + 1                 # the parameter server never trains
    var_node = n - 1 if cfg.variance_node is None else cfg.variance_node
    weight_cols = [layout.names.index(f"{name}.weight") for name in LAYERS]

    ev_ticks, ev_acc, ev_var_mean, ev_var_node, ev_diff, ev_deg = [], [], [], [], [], []
    t_first_avg: int | None = None
    n_steps = n_avg = n_msg = 0
    params_sent = 0.0
    train_s = 0.0

    def evaluate(t: int) -> dict[str, float]:
        """The state at tick t (after all events of earlier ticks): per-node accuracy, layer
        variances, weight difference, degree; the transfer check at evaluation ticks."""
        acc = accuracy_stacked(flat, x_test, y_test, layout)
        lv = flat_layer_variance(flat, layout)[:, weight_cols]
        diff = weight_difference(flat, layout)
        deg_now = torch.bincount(dst[edge_on], minlength=n).float()
        ev_ticks.append(t)
        ev_acc.append(acc.numpy())
        ev_var_mean.append(lv.mean(0).numpy())
        ev_var_node.append(lv[var_node].numpy())
        ev_diff.append(np.array([diff[name] for name in LAYERS]))
        ev_deg.append(float(deg_now.mean()))
        m = {"acc_mean": float(acc.mean()), "acc_min": float(acc.min()), "acc_max": float(acc.max()),
             "frac_at_target": float((acc >= cfg.target_accuracy).float().mean()),
             "degree_mean": float(deg_now.mean())}
        for j, name in enumerate(LAYERS):
            m[f"var_{name}"] = float(lv[:, j].mean())
            m[f"var_{name}_node{var_node}"] = float(lv[var_node, j])
            m[f"diff_{name}"] = float(diff[name])
        if transfer and cfg.transfer_check == "evaluation" and t < cfg.ticks:
            own_x, own_y = sampler.draw(torch.arange(n), cfg.own_subset)
            own_acc = accuracy_own(flat, own_x, own_y, layout)
            _connect_next_peer(own_acc >= tl_acc, waiting, wait_ptr, base_deg, edge_on, edge_index)
        return m

    def step(t: int) -> None:
        """Tick t: train the nodes whose acquisition is due, send, average full buffers."""
        nonlocal n_steps, n_avg, n_msg, params_sent, train_s, t_first_avg, buf_sum, buf_cnt, buf_var, buf_pcnt
        active = torch.nonzero(next_train == t).flatten()
        if active.numel() == 0:
            return
        # ---- 1. train the active nodes as one stacked step
        ts = time.perf_counter()
        xb, yb = sampler.draw(active, cfg.batch_size)
        p_act = train_nodes(flat, mom, iters, active, xb, yb, cfg)
        next_train[active] += draw_interval(active.numel())
        n_steps += int(active.numel())
        train_s += time.perf_counter() - ts
        if transfer and cfg.transfer_check == "acquisition":
            # Sec. III-C3: a node that just trained checks its own-data accuracy and, at >= the
            # threshold, connects to its next waiting peer before it sends.
            pending = active[wait_ptr[active] < base_deg[active]]
            if pending.numel():
                own_x, own_y = sampler.draw(pending, cfg.own_subset)
                ok = torch.zeros(n, dtype=torch.bool)
                ok[pending] = accuracy_own(flat.index_select(0, pending), own_x, own_y, layout) >= tl_acc
                _connect_next_peer(ok, waiting, wait_ptr, base_deg, edge_on, edge_index)

        # ---- 2. send to current peers: A_t [N, n_active] sparse
        is_active = torch.zeros(n, dtype=torch.bool)
        is_active[active] = True
        sel = edge_on & is_active[src]
        if not bool(sel.any()):
            return
        pos_in_active = torch.full((n,), -1, dtype=torch.int64)
        pos_in_active[active] = torch.arange(active.numel())
        e_src, e_dst = pos_in_active[src[sel]], dst[sel]
        A = torch.sparse_coo_tensor(torch.stack([e_dst, e_src]), torch.ones(len(e_dst)),
                                    (n, active.numel()), check_invariants=False).coalesce()
        n_msg += len(e_dst)
        if compress:
            mask = (torch.rand(p_act.shape, generator=gen) < cfg.compression_ratio).float()
            buf_sum += torch.sparse.mm(A, p_act * mask)
            buf_pcnt += torch.sparse.mm(A, mask)
            params_sent += float((mask.sum(1)[e_src]).sum())
        else:
            buf_sum += torch.sparse.mm(A, p_act)
            params_sent += float(len(e_dst) * layout.total)
        buf_cnt += torch.sparse.mm(A, torch.ones(active.numel(), 1)).squeeze(1)
        if cfg.averaging == "variance_corrected":
            buf_var += torch.sparse.mm(A.double(), flat_layer_variance(p_act, layout))

        # ---- 3. average the full buffers, eq. (1) (+ Algorithm 3)
        cur_deg = torch.bincount(dst[edge_on], minlength=n).float()
        cap = cfg.interval_ratio * cur_deg
        full = torch.nonzero((cap > 0) & (buf_cnt >= cap)).flatten()
        if full.numel() == 0:
            return
        old = flat.index_select(0, full)
        if compress:
            pc = buf_pcnt.index_select(0, full)
            avg = torch.where(pc > 0, buf_sum.index_select(0, full) / pc.clamp_min(1.0), old)
            buf_pcnt.index_fill_(0, full, 0.0)
        else:
            avg = buf_sum.index_select(0, full) / buf_cnt[full].unsqueeze(1)
        if cfg.averaging == "variance_corrected":
            target = buf_var.index_select(0, full) / buf_cnt[full].double().unsqueeze(1)
            correct_flat(avg, target, layout)
            buf_var.index_fill_(0, full, 0.0)
        flat.index_copy_(0, full, old.mul_(cfg.beta).add_(avg, alpha=1.0 - cfg.beta))
        buf_sum.index_fill_(0, full, 0.0)
        buf_cnt[full] = 0.0
        n_avg += int(full.numel())
        if cfg.server and bool((full == 0).any()):
            # Algorithm 1: the server sends the new global model; every client replaces its own.
            flat[1:] = flat[0:1]
            n_msg += n - 1
            params_sent += float((n - 1) * layout.total)
        if t_first_avg is None:
            t_first_avg = t

    tensors = {"flat": flat, "mom": mom, "iters": iters, "buf_sum": buf_sum, "buf_cnt": buf_cnt, "buf_var": buf_var,
               "buf_pcnt": buf_pcnt, "next_train": next_train, "edge_on": edge_on, "wait_ptr": wait_ptr}
    curves = {"ticks": ev_ticks, "acc": ev_acc, "var_mean": ev_var_mean, "var_node": ev_var_node, "diff": ev_diff,
              "deg": ev_deg}

    def snapshot(t: int) -> dict:
        """Everything tick t reads (federation/run/checkpoint.py)."""
        return {"tick": t, "tensors": tensors, "gen": gen.get_state(), "curves": curves,
                "totals": (t_first_avg, n_steps, n_avg, n_msg, params_sent, train_s),
                "wall_s": time.perf_counter() - t0}

    start = 0
    if resume is not None:
        start = int(resume["tick"])
        for k, v in resume["tensors"].items():
            if v is not None:
                tensors[k].copy_(v)
        gen.set_state(resume["gen"])
        for k, v in resume["curves"].items():
            curves[k][:] = v
        t_first_avg, n_steps, n_avg, n_msg, params_sent, train_s = resume["totals"]
        t0 = time.perf_counter() - float(resume["wall_s"])
    after = (lambda t: checkpoint(t, lambda: snapshot(t))) if checkpoint is not None else None
    drive(cfg.ticks, step, evaluate, EvalSchedule(every=cfg.eval_every, at_start=True), on_record=on_eval,
          start=start, after=after)

    ticks_arr = np.asarray(ev_ticks, dtype=np.int64)
    acc_arr = np.stack(ev_acc)
    pd_ = (plateau_delay(ticks_arr, acc_arr.mean(1), t_first_avg, cfg.plateau_smooth)
           if t_first_avg is not None and len(ticks_arr) > 1 else None)
    reach = reaching_times(ticks_arr, acc_arr, cfg.target_accuracy, cfg.most_fraction)
    return GossipResult(ticks_arr, acc_arr, np.stack(ev_var_mean), np.stack(ev_var_node), np.stack(ev_diff),
                        np.asarray(ev_deg), t_first_avg, pd_, reach["first"], reach["most"], n_steps, n_avg,
                        n_msg, params_sent, time.perf_counter() - t0, train_s, var_node)


def _connect_next_peer(eligible: torch.Tensor, waiting: torch.Tensor, wait_ptr: torch.Tensor,
                       base_deg: torch.Tensor, edge_on: torch.Tensor, edge_index: dict) -> None:
    """Transfer-learning variant (Sec. III-C3): each eligible node connects to its next waiting peer.

    Peers already connected (by the other side) are skipped. Connections are mutual: both
    directed edges are switched on. Runs at most once per node and acquisition (or evaluation).
    """
    todo = torch.nonzero(eligible & (wait_ptr < base_deg)).flatten().tolist()
    for i in todo:  # at most N per evaluation; not the per-tick hot path
        while wait_ptr[i] < base_deg[i]:
            j = int(waiting[i, wait_ptr[i]])
            wait_ptr[i] += 1
            e = edge_index[(i, j)]
            if not bool(edge_on[e]):
                edge_on[e] = True
                edge_on[edge_index[(j, i)]] = True
                break

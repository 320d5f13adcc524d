"""Stacked local training of all centers in one computation.

The local model is the ABPS paper's MLP (Sec. 6.3): ``d -> 128 -> 64 -> 1`` with ReLU and
dropout 0.2 after each hidden layer, trained with Adam (lr 1e-3, weight decay 1e-5,
PyTorch's L2-in-gradient form), batch 128, 2 local epochs per round.

Every parameter carries a leading center axis ``[n, ...]``; the forward pass is three
batched matmuls (``torch.baddbmm``), so one autograd graph trains every center at once and
the gradient of the summed per-center losses is each center's own gradient. Each center

* shuffles its own train rows every local epoch with its own counter-based stream
  (:class:`RandomStreams`; center i's permutation depends only on (seed, i, round, epoch)),
* takes consecutive batches of 128 of that permutation, the last one partial
  (``DataLoader(shuffle=True, drop_last=False)`` semantics); a center whose rows are
  exhausted at a step is simply left out of that step (no update, no fake rows),
* draws its own dropout masks (a slice of one per-step draw keyed by (seed, round, epoch,
  step)),
* keeps its own Adam moments and its own step counter.

The plain per-center loop in :mod:`federation.reference` consumes the same streams and gives
the same parameters within float tolerance (tests/test_federation_engine.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from federation.config import EngineConfig
from federation.data import FederatedData

PARAM_NAMES: tuple[str, ...] = ("w1", "b1", "w2", "b2", "w3", "b3")
Params = dict[str, torch.Tensor]

_M32 = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer hash (C. Wellons) on int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def _mix_int(*parts: int) -> int:
    """SplitMix64-style combination of Python ints to a 63-bit generator seed."""
    h = 0x243F6A8885A308D3
    for p in parts:
        h = (h ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
        h = h * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h & 0x7FFFFFFFFFFFFFFF


class RandomStreams:
    """Per-center random streams of a run (seed).

    * :meth:`permutations`: counter-based; key(i, r) = hash(seed, center i, round, epoch, r),
      so center i's batch order does not depend on other centers or on n.
    * :meth:`dropout_keep`: one ``torch.Generator`` seeded by hash(seed, round, epoch, step)
      draws ``[n, B, units]``; center i uses slice i.
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def permutations(self, n_rows: torch.Tensor, max_rows: int, round_idx: int, epoch: int) -> torch.Tensor:
        """``[n, max_rows]`` int64: row i holds a uniform permutation of 0..n_rows[i]-1 first,
        then the padding positions n_rows[i]..max_rows-1 in order."""
        n = n_rows.shape[0]
        base = _hash32(torch.tensor([_mix_int(self.seed, round_idx, epoch) & _M32], dtype=torch.int64))
        c = _hash32(base ^ torch.arange(n, dtype=torch.int64))  # per-center key
        r = torch.arange(max_rows, dtype=torch.int64)
        key = _hash32(_hash32(c.unsqueeze(1) ^ r.unsqueeze(0)) ^ 0x5BD1E995)
        pad = r.unsqueeze(0) >= n_rows.unsqueeze(1)
        key = torch.where(pad, (1 << 32) + r.unsqueeze(0), key)
        return torch.argsort(key, dim=1, stable=True)

    def dropout_keep(
        self, round_idx: int, epoch: int, step: int, n: int, rows: int, units: int, p: float
    ) -> torch.Tensor:
        """``[n, rows, units]`` bool keep-mask (True with probability 1 - p)."""
        g = torch.Generator().manual_seed(_mix_int(self.seed, round_idx, epoch, step, 0xD0))
        return torch.rand(n, rows, units, generator=g) >= p


@dataclass
class Batch:
    """One local step of the active centers (what ``local_loss`` hooks receive).

    Attributes:
        centers: ``[a]`` int64 indices of the active centers (rows of every tensor below).
        x: ``[a, B, d]`` features; y: ``[a, B]`` labels; rows: ``[a, B]`` bool real rows.
        logits: ``[a, B]`` model output; rep: ``[a, B, h2]`` trunk output (after the second
            hidden layer's ReLU and dropout), with gradient.
        round_idx, epoch, step: position in training.
    """

    centers: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    rows: torch.Tensor
    logits: torch.Tensor
    rep: torch.Tensor
    round_idx: int
    epoch: int
    step: int


LocalLoss = Callable[[Params, Batch], torch.Tensor]


def init_params(d: int, hidden: tuple[int, int], n: int, seed: int) -> Params:
    """Stacked parameters, every center starting from the same draw.

    Same scheme as ``torch.nn.Linear``'s default: weight and bias ~ U(-1/sqrt(fan_in),
    1/sqrt(fan_in)). Shapes: w1 ``[n, d, h1]``, b1 ``[n, h1]``, w2 ``[n, h1, h2]``,
    b2 ``[n, h2]``, w3 ``[n, h2, 1]``, b3 ``[n, 1]`` (weights stored input-major for bmm).
    """
    g = torch.Generator().manual_seed(_mix_int(seed, 0x1717))
    dims = [d, hidden[0], hidden[1], 1]
    out: Params = {}
    for k in range(3):
        bound = 1.0 / math.sqrt(dims[k])
        w = (torch.rand(dims[k], dims[k + 1], generator=g) * 2 - 1) * bound
        b = (torch.rand(dims[k + 1], generator=g) * 2 - 1) * bound
        out[f"w{k + 1}"] = w.expand(n, -1, -1).clone()
        out[f"b{k + 1}"] = b.expand(n, -1).clone()
    return out


def n_params(d: int, hidden: tuple[int, int]) -> dict[str, int]:
    """Parameter count per tensor of one center's model."""
    h1, h2 = hidden
    return {"w1": d * h1, "b1": h1, "w2": h1 * h2, "b2": h2, "w3": h2, "b3": 1}


def forward(
    params: Params, x: torch.Tensor, keep: torch.Tensor | None = None, p: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """MLP forward for stacked centers.

    Args:
        params: stacked parameters with leading axis m (any m).
        x: ``[m, rows, d]``.
        keep: optional ``[m, rows, h1 + h2]`` bool dropout keep-mask (None = eval mode).
        p: dropout probability (kept units are scaled by 1 / (1 - p), as ``nn.Dropout``).

    Returns:
        ``(logits [m, rows], rep [m, rows, h2])``.
    """
    h1 = torch.relu(torch.baddbmm(params["b1"].unsqueeze(1), x, params["w1"]))
    n1 = h1.shape[-1]
    if keep is not None:
        h1 = h1 * keep[..., :n1] / (1.0 - p)
    h2 = torch.relu(torch.baddbmm(params["b2"].unsqueeze(1), h1, params["w2"]))
    if keep is not None:
        h2 = h2 * keep[..., n1:] / (1.0 - p)
    logits = torch.baddbmm(params["b3"].unsqueeze(1), h2, params["w3"]).squeeze(-1)
    return logits, h2


@dataclass
class AdamState:
    """Per-center Adam state: first/second moments per parameter and step count ``t [n]``."""

    m: Params
    v: Params
    t: torch.Tensor

    @classmethod
    def zeros_like(cls, params: Params) -> "AdamState":
        """Fresh state (t = 0) for stacked ``params``."""
        n = next(iter(params.values())).shape[0]
        return cls(
            {k: torch.zeros_like(p) for k, p in params.items()},
            {k: torch.zeros_like(p) for k, p in params.items()},
            torch.zeros(n, dtype=torch.int64),
        )


class StackedEngine:
    """Trains and evaluates all centers of a :class:`FederatedData` as one computation.

    Args:
        data: the federated data (train split used for training).
        cfg: :class:`federation.config.EngineConfig` (model width, dropout, Adam, batch, epochs).
        seed: run seed (initial parameters and all streams).
    """

    def __init__(self, data: FederatedData, cfg: EngineConfig, seed: int) -> None:
        self.data = data
        self.cfg = cfg
        self.seed = int(seed)
        self.streams = RandomStreams(seed)
        self.hidden = (cfg.hidden[0], cfg.hidden[1])

    @property
    def n(self) -> int:
        """Number of centers."""
        return self.data.n_centers

    def init_params(self) -> Params:
        """Initial stacked parameters (same draw for every center; see :func:`init_params`)."""
        return init_params(self.data.d, self.hidden, self.n, self.seed)

    def steps_per_epoch(self) -> int:
        """ceil(max_i n_train_i / batch): local steps of the largest center per epoch."""
        return int(math.ceil(int(self.data.n_train.max()) / self.cfg.batch_size))

    def adam_step(self, params: Params, grads: Params, state: AdamState, idx: torch.Tensor) -> None:
        """In-place Adam update (``torch.optim.Adam`` single-tensor formulas, L2 weight decay)
        of the centers ``idx``; every other center's parameters and state are untouched."""
        b1, b2 = self.cfg.betas
        lr, wd, eps = self.cfg.lr, self.cfg.weight_decay, self.cfg.eps
        state.t[idx] += 1
        t = state.t[idx].double()
        bc1 = (1 - b1**t).float()
        bc2_sqrt = (1 - b2**t).sqrt().float()
        for k, p in params.items():
            shape = (-1,) + (1,) * (p.dim() - 1)
            ps = p[idx]
            g = grads[k]
            if wd:
                g = g + wd * ps
            m = state.m[k][idx].lerp_(g, 1 - b1)
            v = state.v[k][idx].mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v.sqrt() / bc2_sqrt.view(shape)).add_(eps)
            ps = ps - (lr / bc1).view(shape) * m / denom
            p.index_copy_(0, idx, ps)
            state.m[k].index_copy_(0, idx, m)
            state.v[k].index_copy_(0, idx, v)

    def train_round(
        self, params: Params, state: AdamState, round_idx: int, local_loss: LocalLoss | None = None
    ) -> Params:
        """Run ``local_epochs`` epochs of every center's local training (in place).

        At each step only the centers that still have rows in this epoch take part; their
        parameters and Adam state are gathered, one batched forward/backward runs, and the
        update is scattered back. ``local_loss(params_active, batch) -> [a]`` adds per-center
        terms (FedProx, FedDyn, MOON) to the mean BCE of each center's batch.

        Returns ``params`` (the same dict, updated).
        """
        tr = self.data.splits["train"]
        n_rows, max_rows = tr.n, tr.x.shape[1]
        bs, p_drop = self.cfg.batch_size, self.cfg.dropout
        units = self.hidden[0] + self.hidden[1]
        for epoch in range(self.cfg.local_epochs):
            perm = self.streams.permutations(n_rows, max_rows, round_idx, epoch)
            for step in range(self.steps_per_epoch()):
                lo = step * bs
                idx = torch.nonzero(n_rows > lo).squeeze(1)
                cols = perm[idx, lo : lo + bs]
                width = cols.shape[1]
                rows = (lo + torch.arange(width)).unsqueeze(0) < n_rows[idx].unsqueeze(1)
                xb = tr.x[idx.unsqueeze(1), cols]
                yb = tr.y[idx.unsqueeze(1), cols]
                keep = self.streams.dropout_keep(round_idx, epoch, step, self.n, width, units, p_drop)[idx]
                sub = {k: p[idx].requires_grad_(True) for k, p in params.items()}
                logits, rep = forward(sub, xb, keep, p_drop)
                bce = F.binary_cross_entropy_with_logits(logits, yb, reduction="none")
                rowsf = rows.to(bce.dtype)
                loss_c = (bce * rowsf).sum(1) / rowsf.sum(1)
                if local_loss is not None:
                    batch = Batch(idx, xb, yb, rows, logits, rep, round_idx, epoch, step)
                    loss_c = loss_c + local_loss(sub, batch)
                grads = torch.autograd.grad(loss_c.sum(), [sub[k] for k in PARAM_NAMES])
                with torch.no_grad():
                    self.adam_step(params, dict(zip(PARAM_NAMES, grads)), state, idx)
        return params

    @torch.no_grad()
    def predict(self, params: Params, split: str, centers: torch.Tensor | None = None) -> torch.Tensor:
        """Eval-mode logits ``[m, rows]`` of ``params`` (leading axis m) on ``split`` of
        ``centers`` (``[m]`` center indices; default all centers, m = n)."""
        s = self.data.splits[split]
        x = s.x if centers is None else s.x[centers]
        return forward(params, x)[0]

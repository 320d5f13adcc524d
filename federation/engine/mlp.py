"""Stacked local training of all centers in one computation.

Design notes: docs/runtime.md, "Module notes".
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.optim.adam import adam as _adam

from etl.errors import InputError
from federation.core.config import EngineConfig
from federation.core.metrics import batched_auroc
from federation.core.seeding import M32, hash32, mix_seed
from federation.data.tensors import FederatedData
from federation.engine import kernels
from federation.engine.mixing import SPARSE_RATIO, mix, sparse_rows, wire

PARAM_NAMES: tuple[str, ...] = ("w1", "b1", "w2", "b2", "w3", "b3")
StackedParams = dict[str, torch.Tensor]


#: the personalized head of each ``exchange.head_layers`` value: none (0), last layer (1), last two (2)
_HEAD_KEYS = {0: (), 1: ("w3", "b3"), 2: ("w2", "b2", "w3", "b3")}


def head_keys(head_layers: int) -> tuple[str, ...]:
    """Parameter names of the personalized head: none (0), last layer (1), last two (2)."""
    return _HEAD_KEYS[head_layers]


def exchanged_keys(head_layers: int) -> tuple[str, ...]:
    """Parameter names that cross the network: all, or the trunk only."""
    head = set(head_keys(head_layers))
    return tuple(k for k in PARAM_NAMES if k not in head)

class RandomStreams:
    """Per-center random streams of a run (seed).

    * :meth:`permutations`: counter-based; key(i, r) = hash(seed, center i, round, epoch, r),
      so center i's batch order does not depend on other centers or on n.
    * :meth:`dropout_bits` / :meth:`dropout_scale`: one NumPy PCG64 stream seeded by
      hash(seed, round, epoch, step) draws ``[a, B, units]`` for the a centers active at that step (those with rows left),
      ordered by train size descending (ties: center index); each center uses its own slice. The active set is a function of the
      center sizes only, so the masks are reproducible.
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def permutations(
        self, n_rows: torch.Tensor, max_rows: int, round_idx: int, epoch: int, centers: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[n, max_rows]`` int64: row i holds a uniform permutation of 0..n_rows[i]-1 first,
        then the padding positions n_rows[i]..max_rows-1 in order. ``centers`` ``[n]`` gives
        the center index that keys row i's stream (default ``arange(n)``)."""
        n = n_rows.shape[0]
        cid = torch.arange(n, dtype=torch.int64) if centers is None else centers.to(torch.int64)
        base = hash32(torch.tensor([mix_seed(self.seed, round_idx, epoch) & M32], dtype=torch.int64))
        c = hash32(base ^ cid)  # per-center key
        # keys of the real rows only (a federation of unequal sizes has far fewer real rows than
        # n * max_rows): row r of center i sorts by hash(c_i ^ r), ties by r; one stable sort of
        # (i, key) over the packed rows orders every center at once. Padding positions keep
        # their order after the real rows (what sorting them with keys above 2^32 gave).
        counts = n_rows.to(torch.int64).clamp(0, max_rows)
        owner = torch.repeat_interleave(torch.arange(n, dtype=torch.int64), counts)
        r = torch.arange(owner.numel(), dtype=torch.int64) - (torch.cumsum(counts, 0) - counts)[owner]
        key = hash32(hash32(c[owner] ^ r) ^ 0x5BD1E995)
        order = torch.argsort((owner << 32) | key, stable=True)
        perm = torch.arange(max_rows, dtype=torch.int64).repeat(n, 1)
        perm[owner, r] = r[order]  # sorted position j belongs to the same center as position j
        return perm

    def dropout_bits(self, round_idx: int, epoch: int, step: int, n: int, rows: int, units: int) -> torch.Tensor:
        """``[n, rows, units]`` int16 uniform draws of one step (keyed by (seed, round, epoch, step)).

        Four 16-bit draws per 64-bit output of NumPy's PCG64 (a fixed, version-stable bit stream;
        about 4x faster than ``torch.Generator.random_``, which matters at ~5 M units per step).
        """
        numel = n * rows * units
        bg = np.random.PCG64(mix_seed(self.seed, round_idx, epoch, step, 0xD0))
        if kernels.library() is not None:  # the same words from federation.engine.kernels (about 4x faster)
            st = bg.state["state"]
            words = kernels.pcg64_words(st["state"], st["inc"], (numel + 3) // 4)
        else:
            words = bg.random_raw((numel + 3) // 4)
        return torch.from_numpy(words.view(np.int16)[:numel]).view(n, rows, units)

    def keep_masks(
        self, round_idx: int, epoch: int, step: int, n: int, rows: int, hidden: tuple[int, int], p: float
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Kept units of one step as float32 0/1 tensors ``([n, rows, h1], [n, rows, h2])``
        (contiguous; the non-zeros of :meth:`dropout_scale`, unscaled); None when
        ``round(p * 65536) == 0`` (no dropout)."""
        k = int(round(p * 65536))
        if k == 0:
            return None
        return keep_from_bits(self.dropout_bits(round_idx, epoch, step, n, rows, hidden[0] + hidden[1]), hidden, k)

    def dropout_scale(
        self, round_idx: int, epoch: int, step: int, n: int, rows: int, units: int, p: float
    ) -> torch.Tensor:
        """``[n, rows, units]`` float32 inverted-dropout multipliers (``nn.Dropout`` semantics).

        Each unit draws a uniform 16-bit integer (:meth:`dropout_bits`) and is dropped when it
        falls in the lowest
        ``k = round(p * 65536)`` values, so the drop probability is ``k / 65536`` (0.2 ->
        0.19999695); kept units are scaled by ``65536 / (65536 - k)``, which keeps
        ``E[multiplier] = 1`` exactly.
        """
        k = int(round(p * 65536))
        if k == 0:
            return torch.ones(n, rows, units)
        keep = self.dropout_bits(round_idx, epoch, step, n, rows, units) >= (k - 32768)
        return keep.to(torch.float32).mul_(65536.0 / (65536 - k))


def keep_from_bits(bits: torch.Tensor, hidden: tuple[int, int], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """0/1 float32 kept-unit masks ``([..., h1], [..., h2])`` (contiguous) from int16 draws
    ``bits [..., h1 + h2]`` (:meth:`RandomStreams.dropout_bits`): a unit is kept when its draw is
    not among the lowest ``k`` of the 65,536 values."""
    u = bits.numpy()
    out = []
    for part in (u[..., : hidden[0]], u[..., hidden[0] :]):
        f = np.empty(part.shape, dtype=np.float32)
        np.greater_equal(part, k - 32768, out=f, casting="unsafe")  # one pass, no bool temporary
        out.append(torch.from_numpy(f))
    return out[0], out[1]


#: glibc ``mallopt`` parameters set by :func:`tune_allocator` (bytes)
MALLOC_MMAP_THRESHOLD = 32 * 2**20
MALLOC_TRIM_THRESHOLD = 256 * 2**20
MALLOC_TOP_PAD = 16 * 2**20
_TUNED: int | None = None  # pid of the process whose allocator was tuned


def tune_allocator() -> bool:
    """Let glibc's ``malloc`` keep freed activation buffers for reuse (once per process).

    Every training step allocates and frees a few dozen tensors of 2-15 MB at n = 230 (bmm
    outputs, gradients, dropout masks). With glibc's defaults many of them are fresh ``mmap``
    regions whose pages fault in on first touch and go back to the kernel on free: 26-37 k minor
    page faults and 0.07-0.23 s of system CPU per round of the 230-center benchmark. Serving blocks below
    :data:`MALLOC_MMAP_THRESHOLD` from the heap and trimming the heap only above
    :data:`MALLOC_TRIM_THRESHOLD` removes nearly all of them (measured with the engine benchmark, docs/benchmarks.md).
    Larger blocks (large n) are still ``mmap``-ed and returned at once, so memory peaks do not
    grow by more than about the trim threshold. Set ``ABPS_MALLOC_TUNE=0`` to leave the
    allocator alone. No effect (returns False) off glibc.

    Returns:
        True when the parameters were set in this process (now or before).
    """
    global _TUNED
    if _TUNED == os.getpid():
        return True
    if os.environ.get("ABPS_MALLOC_TUNE", "1") == "0":
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        ok = all(libc.mallopt(opt, val) == 1 for opt, val in
                 ((-3, MALLOC_MMAP_THRESHOLD), (-1, MALLOC_TRIM_THRESHOLD), (-2, MALLOC_TOP_PAD)))
    except (OSError, AttributeError):  # not glibc (macOS, musl, Windows)
        return False
    if ok:
        _TUNED = os.getpid()
    return ok


_POOL: tuple[int, ThreadPoolExecutor] | None = None


def _mask_pool() -> ThreadPoolExecutor:
    """The process's one helper thread for dropout masks (re-created after a fork)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="abps-dropout"))
    return _POOL[1]


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


LocalLoss = Callable[[StackedParams, Batch], torch.Tensor]


def stacked_param_count(d: int, hidden: tuple[int, int], n: int) -> int:
    """Parameters of ``n`` stacked MLPs ``d -> hidden[0] -> hidden[1] -> 1`` (weights and biases)."""
    h1, h2 = int(hidden[0]), int(hidden[1])
    return n * (d * h1 + h1 + h1 * h2 + h2 + h2 + 1)


def check_model_fits(d: int, hidden: tuple[int, int], n: int) -> None:
    """Refuse, before anything is allocated, a model whose stacked parameters, gradients and two
    Adam moments (four float32 copies: a lower bound of what training holds) exceed this
    machine's physical memory; without it a width such as ``hidden: [100000000, 100000000]``
    ends in the kernel's out-of-memory kill, without a message.

    Raises:
        InputError: naming ``engine.hidden``, the centers and the bytes needed.
    """
    need = 4 * 4 * stacked_param_count(d, hidden, n)
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on this platform: nothing to compare with
        return
    if need > have:
        raise InputError(f"engine.hidden {list(hidden)}: {n} centers' models with {d} features need at least "
                         f"{need / 2**30:,.1f} GiB (parameters, gradients and Adam moments), more than this "
                         f"machine's {have / 2**30:,.1f} GiB")


def init_params(d: int, hidden: tuple[int, int], n: int, seed: int) -> StackedParams:
    """Stacked parameters, every center starting from the same draw.

    Same scheme as ``torch.nn.Linear``'s default: weight and bias ~ U(-1/sqrt(fan_in),
    1/sqrt(fan_in)). Shapes: w1 ``[n, d, h1]``, b1 ``[n, h1]``, w2 ``[n, h1, h2]``,
    b2 ``[n, h2]``, w3 ``[n, h2, 1]``, b3 ``[n, 1]`` (weights stored input-major for bmm).
    """
    g = torch.Generator().manual_seed(mix_seed(seed, 0x1717))
    dims = [d, hidden[0], hidden[1], 1]
    out: StackedParams = {}
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


def forward(params: StackedParams, x: torch.Tensor, drop: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """MLP forward for stacked centers.

    Args:
        params: stacked parameters with leading axis m (any m).
        x: ``[m, rows, d]``.
        drop: optional ``[m, rows, h1 + h2]`` dropout multipliers (0 or 1 / (1 - p), from
            :meth:`RandomStreams.dropout_scale`); None = eval mode.

    Returns:
        ``(logits [m, rows], rep [m, rows, h2])``.
    """
    # bmm then an in-place bias add: cheaper than baddbmm, which first copies the broadcast bias
    h1 = torch.bmm(x, params["w1"]).add_(params["b1"].unsqueeze(1)).relu_()
    n1 = h1.shape[-1]
    if drop is not None:
        h1 = h1 * drop[..., :n1]
    h2 = torch.bmm(h1, params["w2"]).add_(params["b2"].unsqueeze(1)).relu_()
    if drop is not None:
        h2 = h2 * drop[..., n1:]
    logits = torch.bmm(h2, params["w3"]).squeeze(-1).add_(params["b3"])
    return logits, h2


@dataclass
class AdamState:
    """Per-center Adam state: first/second moments per parameter and step count ``t [n]``."""

    m: StackedParams
    v: StackedParams
    t: torch.Tensor

    @classmethod
    def zeros_like(cls, params: StackedParams) -> AdamState:
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
        cfg: :class:`federation.core.config.EngineConfig` (model width, dropout, Adam, batch, epochs).
        seed: run seed (initial parameters and all streams).
    """

    #: draw the next step's dropout masks in a helper thread when one step's draws and masks
    #: (6 bytes a unit) fit in this many bytes; else in place, so a large n keeps its memory peak.
    #: 0 turns the helper off (same results either way).
    prefetch_bytes: int = 256 * 2**20

    def __init__(self, data: FederatedData, cfg: EngineConfig, seed: int) -> None:
        check_model_fits(data.d, cfg.hidden, data.n_centers)
        tune_allocator()
        self.data = data
        self.cfg = cfg
        self.seed = int(seed)
        self.streams = RandomStreams(seed)
        self.hidden = (cfg.hidden[0], cfg.hidden[1])
        #: centers per group of partial last batches (see :meth:`_segments`)
        self.partial_group = 24
        #: most centers in one batched computation (bounds activation memory at large n)
        self.max_segment = 2048

    @property
    def n(self) -> int:
        """Number of centers."""
        return self.data.n_centers

    def init_params(self) -> StackedParams:
        """Initial stacked parameters (same draw for every center; see :func:`init_params`)."""
        return init_params(self.data.d, self.hidden, self.n, self.seed)

    def state_dict(self) -> dict[str, Any]:
        """``{}``: the runner's :class:`AdamState` and counter-based streams hold all state (a
        round checkpoint, federation/run/checkpoint.py)."""
        return {}

    def load_state_dict(self, state: dict[str, Any], optimizer: Any) -> None:
        """Nothing to restore (see :meth:`state_dict`)."""

    def steps_per_epoch(self) -> int:
        """ceil(max_i n_train_i / batch): local steps of the largest center per epoch."""
        return int(math.ceil(int(self.data.n_train.max()) / self.cfg.batch_size))

    def _sorted_train(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Train split with centers ordered by n_train descending (cached): (order, x, y, n)."""
        if not hasattr(self, "_sorted"):
            tr = self.data.splits["train"]
            order, n_sorted = self._size_order()
            self._sorted = (order, tr.x[order], tr.y[order], n_sorted)
        return self._sorted

    def adam_step(self, params: StackedParams, grads: StackedParams, state: AdamState, a: int, start: int = 0) -> None:
        """In-place Adam update (``torch.optim.Adam`` formulas, L2 weight decay added to the
        gradient, per-center bias correction from each center's own step count) of centers
        ``start .. a-1`` of ``params`` / ``state`` (``grads`` hold exactly those rows); the
        other centers are untouched.

        Runs PyTorch's fused Adam kernel (one pass over parameter, gradient and moments) on
        each run of consecutive centers with equal step count (centers ordered by size share
        it, so a step makes one call per distinct number of local steps per epoch).
        """
        b1, b2 = self.cfg.betas
        t = state.t[start:a]
        t += 1
        counts, lens = torch.unique_consecutive(t, return_counts=True)
        keys = list(params)
        lo = start
        for count, length in zip(counts.tolist(), lens.tolist()):
            hi = lo + length
            _adam([params[k][lo:hi] for k in keys], [grads[k][lo - start : hi - start] for k in keys],
                  [state.m[k][lo:hi] for k in keys], [state.v[k][lo:hi] for k in keys], [],
                  [torch.tensor(float(count - 1)) for _ in keys], fused=True, amsgrad=False, beta1=b1, beta2=b2,
                  lr=self.cfg.lr, weight_decay=self.cfg.weight_decay, eps=self.cfg.eps, maximize=False)
            lo = hi

    def _segments(self, n_rows: torch.Tensor, lo: int, a: int) -> list[tuple[int, int, int]]:
        """Split the active prefix ``[:a]`` (sizes descending) of a step into groups that run
        as separate batched computations (each of at most ``max_segment`` centers): the centers
        with a full batch, then the centers in
        their last, partial batch in groups of ``partial_group`` (each padded only to its own
        widest batch; a group extends over the following centers of the same width, so equal
        sizes make one unpadded group). Returns ``(start, stop, width)`` triples."""
        bs, cap = self.cfg.batch_size, self.max_segment
        f = int((n_rows[:a] >= lo + bs).sum())
        segs = [(c0, min(f, c0 + cap), bs) for c0 in range(0, f, cap)]
        g = self.partial_group
        last = (n_rows[f:a] - lo).tolist()
        c0 = f
        while c0 < a:  # groups of at most g centers, or a longer run of equal width (no padding)
            c1 = min(a, c0 + g)
            while c1 < a and c1 - c0 < cap and last[c1 - f] == last[c0 - f]:
                c1 += 1
            segs.append((c0, c1, last[c0 - f]))
            c0 = c1
        return segs

    def train_round(
        self, params: StackedParams, state: AdamState, round_idx: int, local_loss: LocalLoss | None = None
    ) -> StackedParams:
        """Run ``local_epochs`` epochs of every center's local training (in place).

        Internally the centers are ordered by train size (largest first), so the centers that
        still have rows at a step are a prefix ``[:a]``. The step runs batched
        forward/backward passes on views of their parameters (one for all full batches, one per
        group of partial last batches, see :meth:`_segments`) and updates parameters and Adam
        state in place. ``local_loss(params_seg, batch) -> [c]`` adds per-center terms
        (FedProx, FedDyn, MOON) to the mean BCE of each center's batch; ``batch.centers`` holds
        the segment's original center indices.

        Returns ``params`` (the same dict, updated).
        """
        order, n_rows = self._size_order()
        tr = self.data.splits["train"]
        max_rows, d = tr.mask.shape[1], self.data.d
        bs, p_drop = self.cfg.batch_size, self.cfg.dropout
        units = self.hidden[0] + self.hidden[1]
        k_drop = int(round(p_drop * 65536))
        scale = 65536.0 / (65536 - k_drop)  # inverted-dropout multiplier of a kept unit
        in_place = self._identity_order and all(params[k].is_contiguous() for k in PARAM_NAMES)
        if in_place:  # centers already in size order: train the caller's tensors directly
            ps, st = params, state
        else:
            ps = {k: params[k][order] for k in PARAM_NAMES}
            st = AdamState({k: v[order] for k, v in state.m.items()}, {k: v[order] for k, v in state.v.items()},
                           state.t[order])
        # rows are gathered from the packed data: flat row of (sorted slot c, position q) is
        # offsets[order[c]] + q, or the trailing zero row for a position past the center's rows
        x_flat, y_flat = tr.packed_x, tr.packed_y
        base, zero_row = tr.offsets[order].unsqueeze(1), x_flat.shape[0] - 1
        n_steps = self.steps_per_epoch()
        # the fused kernels (federation.engine.kernels) read the int16 draws directly; the eager and
        # autograd paths get 0/1 float masks
        fused = (local_loss is None and all(ps[k].dtype == torch.float32 for k in PARAM_NAMES)
                 and kernels.library() is not None)

        def step_masks(epoch: int, step: int) -> list:
            """The kept-unit masks of every segment of one step (None per segment: no dropout);
            on the fused path the segment's int16 draws instead."""
            lo = step * bs
            a = int((n_rows > lo).sum())
            segs = self._segments(n_rows, lo, a)
            if not k_drop:
                return [None] * len(segs)
            bits = self.streams.dropout_bits(round_idx, epoch, step, a, min(bs, max_rows - lo), units)
            if fused:
                return [bits[c0:c1, :w] for c0, c1, w in segs]
            return [keep_from_bits(bits[c0:c1, :w], self.hidden, k_drop) for c0, c1, w in segs]

        # the next step's masks are drawn in a helper thread while this step computes (NumPy
        # releases the GIL): the same values as drawing them in place, off the serial path
        order_of_steps = [(e, s) for e in range(self.cfg.local_epochs) for s in range(n_steps)]
        prefetch = bool(k_drop) and int(n_rows.numel()) * min(bs, max_rows) * units * 6 <= self.prefetch_bytes
        pending = _mask_pool().submit(step_masks, 0, 0) if prefetch and order_of_steps else None
        for i, (epoch, step) in enumerate(order_of_steps):
            if step == 0:
                perm = self.streams.permutations(n_rows, max_rows, round_idx, epoch, centers=order)
            lo = step * bs
            a = int((n_rows > lo).sum())
            if pending is not None:
                masks = pending.result()
                nxt = order_of_steps[i + 1] if i + 1 < len(order_of_steps) else None
                pending = _mask_pool().submit(step_masks, *nxt) if nxt is not None else None
            else:
                masks = step_masks(epoch, step)
            for (c0, c1, w), keep_seg in zip(self._segments(n_rows, lo, a), masks):
                pos = perm[c0:c1, lo : lo + w]
                flat = torch.where(pos < n_rows[c0:c1].unsqueeze(1), pos + base[c0:c1], zero_row).view(-1)
                xb = x_flat.index_select(0, flat).view(c1 - c0, w, d)
                yb = y_flat.index_select(0, flat).view(c1 - c0, w)
                real = (n_rows[c0:c1] - lo).clamp(max=w)  # [c] real rows of each center's batch
                rows = None if bool((real == w).all()) else torch.arange(w).unsqueeze(0) < real.unsqueeze(1)
                if fused:
                    grads = self._grads_fused(
                        {k: ps[k][c0:c1] for k in PARAM_NAMES}, xb, yb, rows, real, keep_seg, k_drop, scale)
                elif local_loss is None:
                    grads = self._grads(
                        {k: ps[k][c0:c1] for k in PARAM_NAMES}, xb, yb, rows, real, keep_seg, scale)
                else:
                    grads = self._grads_autograd(
                        {k: ps[k][c0:c1] for k in PARAM_NAMES}, xb, yb, rows, real, keep_seg, scale,
                        local_loss, Batch(order[c0:c1], xb, yb, rows if rows is not None
                                          else torch.ones(c1 - c0, w, dtype=torch.bool),
                                          None, None, round_idx, epoch, step))  # type: ignore[arg-type]
                self.adam_step(ps, grads, st, c1, start=c0)
        if in_place:
            return params
        return self.scatter_back(params, state, ps, st, order, PARAM_NAMES)

    def _size_order(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(order, n_train[order]): centers by train size, descending (stable; cached)."""
        if not hasattr(self, "_order"):
            n = self.data.splits["train"].n
            order = torch.argsort(n, descending=True, stable=True)
            self._order = (order, n[order])
        return self._order

    @property
    def _identity_order(self) -> bool:
        """True when the centers are already ordered by train size (descending, stable)."""
        if not hasattr(self, "_identity"):
            order = self._size_order()[0]
            self._identity = bool(torch.equal(order, torch.arange(order.numel())))
        return self._identity

    def _grads(self, p: StackedParams, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor | None, real: torch.Tensor,
               keep: tuple[torch.Tensor, torch.Tensor] | None, scale: float) -> StackedParams:
        """Gradients of the summed per-center mean BCE of one segment, by hand (no autograd).

        Same values as :meth:`_grads_autograd` without a local loss, in fewer passes over the
        ``[c, B, h]`` activations: ReLU and dropout are applied in place to the pre-activation
        (``h' = relu(z) * keep``, unscaled), the dropout scale ``s`` is moved into the next
        layer's weights (``z_next = h' (s W) + b``), and the ReLU-and-dropout gradient is one
        ``threshold_backward`` on ``h'`` (a unit passes gradient iff ``h' > 0``).

        Args:
            p: the segment's stacked parameters (views, ``[c, ...]``).
            x: ``[c, w, d]``; y: ``[c, w]``; rows: ``[c, w]`` bool real rows or None (all real);
            real: ``[c]`` real rows per center; keep: 0/1 float masks ``([c, w, h1], [c, w, h2])``
            of kept units (:meth:`RandomStreams.keep_masks`) or None (no dropout);
            scale: the kept-unit multiplier ``s``.
        Returns:
            ``{name: [c, ...]}`` gradients.
        """
        s = scale if keep is not None else 1.0
        h1 = torch.bmm(x, p["w1"]).add_(p["b1"].unsqueeze(1)).relu_()
        if keep is not None:
            h1.mul_(keep[0])
        w2s = p["w2"] * s if s != 1.0 else p["w2"]
        h2 = torch.bmm(h1, w2s).add_(p["b2"].unsqueeze(1)).relu_()
        if keep is not None:
            h2.mul_(keep[1])
        w3s = p["w3"] * s
        logits = torch.baddbmm(p["b3"].unsqueeze(1), h2, w3s).squeeze(-1)
        dl = torch.sigmoid(logits).sub_(y)  # d BCE / d logit
        if rows is not None:
            dl.mul_(rows)
        dl.div_(real.to(dl.dtype).unsqueeze(1))
        # q = s * dL/dz2 (the s of layer 1's dropout, moved here)
        q = torch.ops.aten.threshold_backward(dl.unsqueeze(-1) * (w3s * s).transpose(1, 2), h2, 0.0)
        # matmul, not bmm: bmm with a transposed right operand runs a slower kernel (1 thread:
        # 9-14 ms vs 7.5-8 ms for [230, 128, 64] x [230, 64, 128])
        dz1 = torch.ops.aten.threshold_backward(torch.matmul(q, p["w2"].transpose(1, 2)), h1, 0.0)
        return {
            "w1": torch.bmm(x.transpose(1, 2), dz1), "b1": dz1.sum(1),
            "w2": torch.bmm(h1.transpose(1, 2), q), "b2": q.sum(1).div_(s),
            "w3": torch.bmm(h2.transpose(1, 2), dl.unsqueeze(-1)).mul_(s), "b3": dl.sum(1, keepdim=True),
        }

    def _grads_fused(self, p: StackedParams, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor | None,
                     real: torch.Tensor, bits: torch.Tensor | None, k_drop: int, scale: float) -> StackedParams:
        """:meth:`_grads` with the element-wise passes of each layer fused (:mod:`federation.engine.kernels`).

        Same formulas: the forward's bias + ReLU + dropout is one pass per hidden layer reading the
        int16 draws ``bits`` ``[c, w, h1 + h2]`` (:meth:`RandomStreams.dropout_bits`; None = no
        dropout) directly, the second one also computing the logits; the backward's outer
        product, ReLU-and-dropout gradient and bias sum is one pass per hidden layer (the second
        also giving w3's gradient). Layer 1's activations equal :meth:`_grads`'s bit for bit; the
        sums (logits, bias and w3 gradients) add their terms in another order, so the rest agrees
        within float rounding (tests/test_federation_kernels.py).
        """
        s = scale if bits is not None else 1.0
        thr = k_drop - 32768
        h1 = kernels.bias_relu_drop_(torch.bmm(x, p["w1"]), p["b1"], bits, 0, thr)[0]
        w2s = p["w2"] * s if s != 1.0 else p["w2"]
        w3s = p["w3"].squeeze(-1) * s  # [c, h2]
        # layer 2's bias + ReLU + dropout and the output layer's logits in one pass
        h2, logits = kernels.bias_relu_drop_(torch.bmm(h1, w2s), p["b2"], bits, self.hidden[0], thr, w3s, p["b3"])
        dl = torch.sigmoid(logits).sub_(y)  # d BCE / d logit
        if rows is not None:
            dl.mul_(rows)
        dl.div_(real.to(dl.dtype).unsqueeze(1))
        # q = s * dL/dz2, b2's gradient and w3's in one pass
        q, gb2, gw3 = kernels.outer_relu_grad(dl, w3s * s, h2, s, out_grad=True)
        dz1 = torch.matmul(q, p["w2"].transpose(1, 2))  # (a contiguous W2^T costs more than it saves)
        gb1 = kernels.relu_grad_(dz1, h1)
        return {
            "w1": torch.bmm(x.transpose(1, 2), dz1), "b1": gb1,
            "w2": torch.bmm(h1.transpose(1, 2), q), "b2": gb2,
            "w3": gw3.unsqueeze(-1), "b3": dl.sum(1, keepdim=True),  # type: ignore[union-attr]
        }

    def _grads_autograd(self, p: StackedParams, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor | None,
                        real: torch.Tensor, keep: tuple[torch.Tensor, torch.Tensor] | None, scale: float,
                        local_loss: LocalLoss | None = None, batch: Batch | None = None) -> StackedParams:
        """Gradients of one segment by autograd: the summed per-center mean BCE plus, when
        given, ``local_loss(params, batch)`` (``batch.logits`` / ``batch.rep`` are filled in
        here). Arguments as :meth:`_grads`."""
        sub = {k: v.detach().requires_grad_(True) for k, v in p.items()}
        drop = None if keep is None else torch.cat(keep, dim=-1).mul_(scale)
        logits, rep = forward(sub, x, drop)
        bce = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
        if rows is not None:
            bce = bce * rows
        loss_c = bce.sum(1) / real.to(bce.dtype)
        if local_loss is not None and batch is not None:
            batch.logits, batch.rep = logits, rep
            loss_c = loss_c + local_loss(sub, batch)
        grads = torch.autograd.grad(loss_c.sum(), [sub[k] for k in PARAM_NAMES])
        return dict(zip(PARAM_NAMES, grads))

    @staticmethod
    def scatter_back(params: StackedParams, state: AdamState, ps: StackedParams, st: AdamState, order: torch.Tensor,
                     keys: tuple[str, ...]) -> StackedParams:
        """Write size-sorted copies (``ps``, ``st``; row r is center ``order[r]``) back into
        ``params`` / ``state`` in center order, in place; returns ``params``."""
        for k in keys:
            params[k].index_copy_(0, order, ps[k])
            state.m[k].index_copy_(0, order, st.m[k])
            state.v[k].index_copy_(0, order, st.v[k])
        state.t.index_copy_(0, order, st.t)
        return params

    @torch.no_grad()
    def predict(
        self, params: StackedParams, split: str, centers: torch.Tensor | None = None, chunk: int = 32
    ) -> torch.Tensor:
        """Eval-mode logits ``[m, rows]`` of ``params`` (leading axis m) on ``split`` of
        ``centers`` (``[m]`` center indices; default all centers, m = n).

        Centers are processed in groups sorted by split size (at least ``chunk`` centers, or
        about 8,192 rows), each group padded only to its own largest center, so padding costs
        little compute; logits on padding positions are 0.
        """
        s = self.data.splits[split]
        idx = torch.arange(self.n) if centers is None else centers
        n_rows = s.n[idx]
        order = torch.argsort(n_rows, descending=True, stable=True)
        sizes = n_rows[order].tolist()
        out = torch.zeros(idx.numel(), s.mask.shape[1])
        lo = 0
        while lo < idx.numel() and sizes[lo] > 0:
            r = sizes[lo]
            hi = min(idx.numel(), lo + max(chunk, 8192 // r))  # at least `chunk` centers, ~8k rows
            sel = order[lo:hi]
            first = int(sel[0])
            if bool((sel == first + torch.arange(sel.numel())).all()):  # consecutive rows: views, no copy
                model = {k: v[first : first + sel.numel()] for k, v in params.items()}
            else:
                model = {k: v[sel] for k, v in params.items()}
            out[sel, :r] = forward(model, s.rows(idx[sel], r))[0]
            lo = hi
        return out

    def layout(self, head_layers: int) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, int]]:
        """(exchanged names, personalized head names, parameters per tensor of one center) for
        ``exchange.head_layers`` 0, 1 or 2 (ledger payload = the exchanged tensors' sizes)."""
        return exchanged_keys(head_layers), head_keys(head_layers), n_params(self.data.d, self.hidden)

    @torch.no_grad()
    def evaluate_mixtures(self, theta: StackedParams, wc: torch.Tensor, tc: torch.Tensor, split: str,
                          exchanged: tuple[str, ...], bf16: bool, chunk: int | None = None) -> torch.Tensor:
        """``[m]`` float64 AUROC of candidate mixtures (:meth:`federation.methods.base.Context.evaluate_mixtures`):
        row r mixes the exchanged block as ``sum_j wc[r, j] wire(theta_j)`` (target ``tc[r]``'s own copy
        unrounded), keeps ``tc[r]``'s own head and is scored on ``tc[r]``'s ``split``; NaN where that
        split holds one class.

        ``chunk`` (default 512) rows per batched forward, processed by target split size, at most
        ``32 * chunk`` row-by-split-row cells. Sparse rows (at most ``n / SPARSE_RATIO`` members, e.g.
        ABPS coalitions) never build a dense ``[m, n] @ [n, P]`` product: the first layer, linear in the
        parameters, is one ``x_t W1_j + b1_j`` per distinct (target, member) pair combined per row; the
        later layers' parameters are weighted sums of the members' rows (``embedding_bag``). Equal to
        the dense evaluation up to float summation order.
        """
        chunk = chunk or 512
        s = self.data.splits[split]
        n, m_rows = next(iter(theta.values())).shape[0], wc.shape[0]  # senders (this engine's centers)
        if m_rows == 0:
            return torch.empty(0, dtype=torch.float64)
        cols, vals = sparse_rows(wc)  # [m, K] members and weights of each row
        # rows by target split size, largest first; a chunk holds at most `chunk` rows and at
        # most `chunk * 32` (row, split row) cells, so a few large targets do not pad many small
        order = torch.argsort(s.n[self.split_index(tc)], descending=True, stable=True)
        tc, cols, vals = tc[order], cols[order], vals[order].to(torch.float32)
        sizes = s.n[self.split_index(tc)].tolist()
        bounds, lo = [], 0
        while lo < m_rows:
            hi = min(m_rows, lo + max(1, min(chunk, chunk * 32 // max(1, sizes[lo]))))
            bounds.append((lo, hi))
            lo = hi
        sparse = (set(theta) == set(PARAM_NAMES) and {"w1", "b1"} <= set(exchanged) and n >= SPARSE_RATIO
                  and cols.shape[1] * SPARSE_RATIO <= n)
        out = torch.empty(m_rows, dtype=torch.float64)
        if not sparse:
            dense = (wc.to_dense() if wc.is_sparse else wc)[order]
            for lo, hi in bounds:
                w, t = dense[lo:hi], tc[lo:hi]
                model = {k: (mix(w, theta[k], bf16, own=t) if k in exchanged else theta[k][t])
                         for k in theta}
                rows = max(1, sizes[lo])  # real rows come first: trim the padding
                ti = self.split_index(t)
                logits = forward(model, s.rows(ti, rows))[0]
                out[order[lo:hi]] = batched_auroc(logits, s.y[ti, :rows], s.mask[ti, :rows])
            return out
        # Sparse rows (e.g. ABPS coalitions: kappa + 1 members each). Row r's member k sends
        # wire(theta_j), or theta_t itself when it is the target t: index src into [theta; wire(theta)].
        table = {k: torch.cat([theta[k], wire(theta[k], True)]) if bf16 else theta[k] for k in exchanged}
        src = cols + n * (cols != tc.unsqueeze(1)) if bf16 else cols
        span = 2 * n if bf16 else n
        h1 = theta["w1"].shape[-1]
        for lo, hi in bounds:
            t, sr, a = tc[lo:hi], src[lo:hi], vals[lo:hi]
            c, rows = t.numel(), max(1, sizes[lo])
            # layer 1 is linear in the parameters: z1 = sum_k a_k (x_t W1_k + b1_k), one product
            # per distinct (target, member) pair, then a weighted sum per row
            pair, inv = torch.unique(t.unsqueeze(1) * span + sr, return_inverse=True)
            pt, pj = pair // span, pair % span
            z = torch.bmm(s.rows(self.split_index(pt), rows), table["w1"][pj]).add_(table["b1"][pj].unsqueeze(1))  # [U, rows, h1]
            hid = F.embedding_bag(inv, z.view(pair.numel(), -1), per_sample_weights=a, mode="sum")
            hid = hid.view(c, rows, h1).relu_()

            def layer(k: str) -> torch.Tensor:
                if k not in exchanged:
                    return theta[k][t]
                mixed = F.embedding_bag(sr, table[k].reshape(span, -1), per_sample_weights=a, mode="sum")
                return mixed.view(c, *theta[k].shape[1:])

            hid = torch.bmm(hid, layer("w2")).add_(layer("b2").unsqueeze(1)).relu_()
            logits = torch.bmm(hid, layer("w3")).squeeze(-1).add_(layer("b3"))
            ti = self.split_index(t)
            out[order[lo:hi]] = batched_auroc(logits, s.y[ti, :rows], s.mask[ti, :rows])
        return out

    def split_index(self, centers: torch.Tensor) -> torch.Tensor:
        """Rows of this engine's splits that hold ``centers`` (indices on the senders' axis of
        :meth:`evaluate_mixtures`): the same indices here; a one-center peer engine
        (federation/p2p/engine.py) maps its own center to row 0."""
        return centers

    def probe_view(self, params: StackedParams) -> tuple[Any, Any]:
        """(probe model, shards) for :func:`federation.methods.probe.probe` over the ``val`` split:
        center k's anchor pool is its validation rows."""
        s = self.data.splits["val"]
        n, width = s.y.shape
        shards = SimpleNamespace(anchor_index=torch.arange(n * width).view(n, width), n_anchor=s.n.clone(),
                                 x_train=s.x.reshape(n * width, -1), y_train=s.y.reshape(-1).long())
        return _MlpProbe(params), shards

    def probe_heads(self, params: StackedParams) -> StackedParams:
        """The classifier head a selector reads (PFedDST): the last layer under the image model's names."""
        return {f"head.{k}": params[k] for k in ("w3", "b3")}

    def probe_bytes_per_anchor(self) -> int:
        """Bytes one probe moves per anchor: the features out, one logit back."""
        return 4 * self.data.d + 4


class _MlpProbe:
    """The probe interface of :func:`federation.methods.probe.probe` over the MLP: ``pair_logits(x_all,
    models, rows) -> [P, M, 2]`` two-class logits ``(0, z)`` of center ``models[p]`` on rows ``rows[p]``."""

    def __init__(self, params: StackedParams, chunk: int = 256) -> None:
        self.params, self.chunk = params, chunk

    @torch.no_grad()
    def pair_logits(self, x_all: torch.Tensor, model_index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(*rows.shape, 2)
        for lo in range(0, rows.shape[0], self.chunk):
            j = model_index[lo:lo + self.chunk]
            out[lo:lo + self.chunk, :, 1] = forward({k: v[j] for k, v in self.params.items()},
                                                    x_all[rows[lo:lo + self.chunk]])[0]
        return out



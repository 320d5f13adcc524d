"""One center's share of the stacked engine: :class:`PeerEngine` trains and scores a single center
(its own rows only) and draws exactly the random numbers that center draws inside the K-center
stacked engine, so a peer's local training equals its row of the simulator's (docs/p2p.md,
"Same numbers as the simulator").
"""

from __future__ import annotations

import torch

from federation.core.config import EngineConfig
from federation.data.tensors import FederatedData
from federation.engine.mlp import RandomStreams, StackedEngine

__all__ = ["PeerEngine", "PeerStreams"]


def size_rank(n_train: torch.Tensor) -> torch.Tensor:
    """``[n]`` int64 position of every center in the engine's size order (train rows descending,
    ties by center index; :meth:`StackedEngine._size_order`)."""
    order = torch.argsort(n_train, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    return rank


class PeerStreams(RandomStreams):
    """The random streams of center ``center`` of a K-center federation, for an engine holding that
    center alone.

    Batch orders are keyed by the global center index. Dropout draws of a step are one stream of
    ``[a, B, units]`` for the ``a`` centers active at that step in size order
    (:meth:`RandomStreams.dropout_bits`): this draws the whole step and keeps the center's slice,
    so the mask equals the simulator's bit for bit (cost: the federation's draws on every peer).

    Args:
        seed: run seed.
        center: global index of the peer's center.
        n_train: ``[n]`` train rows of every center (public: each peer announces its own count).
        batch_size: the engine's batch size.
    """

    def __init__(self, seed: int, center: int, n_train: torch.Tensor, batch_size: int) -> None:
        super().__init__(seed)
        self.batch_size = int(batch_size)
        self.center = int(center)
        self.n_train = n_train.to(torch.int64)
        self.rank = int(size_rank(self.n_train)[self.center])

    def permutations(self, n_rows: torch.Tensor, max_rows: int, round_idx: int, epoch: int,
                     centers: torch.Tensor | None = None) -> torch.Tensor:
        """``[1, max_rows]``: the batch order of the peer's center (keyed by its global index)."""
        return super().permutations(n_rows, max_rows, round_idx, epoch,
                                    centers=torch.full_like(n_rows, self.center))

    def dropout_bits(self, round_idx: int, epoch: int, step: int, n: int, rows: int, units: int) -> torch.Tensor:
        """``[n, rows, units]`` (n = 1, or 0 when the center has no rows left at this step): the
        center's slice of the federation's draw of the step."""
        if n == 0:
            return torch.empty(0, rows, units, dtype=torch.int16)
        a = int((self.n_train > step * self.batch_size).sum())  # the stacked engine's active prefix
        return super().dropout_bits(round_idx, epoch, step, a, rows, units)[self.rank : self.rank + 1]


class PeerEngine(StackedEngine):
    """The stacked engine of one center of a K-center federation.

    ``data`` holds the peer's center alone, its splits padded to the federation's widths (the
    widest center's rows per split, :func:`federation.p2p.local.pad_splits`), so batches, dropout
    masks and segment widths match the K-center engine's row of this center.

    Args:
        data: one-center federation (own rows only).
        cfg: engine config of the run.
        seed: run seed.
        center: global index of the center.
        n_train: ``[n]`` train rows of every center.
    """

    def __init__(self, data: FederatedData, cfg: EngineConfig, seed: int, center: int, n_train: torch.Tensor) -> None:
        super().__init__(data, cfg, seed)
        self.center = int(center)
        self.global_n_train = n_train.to(torch.int64)
        self.streams = PeerStreams(seed, center, n_train, cfg.batch_size)
        self._global_sorted = self.global_n_train[torch.argsort(self.global_n_train, descending=True, stable=True)]

    def _segments(self, n_rows: torch.Tensor, lo: int, a: int) -> list[tuple[int, int, int]]:
        """The center's segment of the step: ``[(0, 1, width)]`` with the width of the segment
        that holds it in the K-center engine (a partial batch is padded as there), or ``[]``
        when it has no rows left."""
        if a == 0:
            return []
        g = self._global_sorted
        rank = self.streams.rank
        a_g = int((g > lo).sum())
        for c0, c1, w in StackedEngine._segments(self, g, lo, a_g):
            if c0 <= rank < c1:
                return [(0, 1, w)]
        raise RuntimeError("center active locally but not in the federation's step")  # sizes disagree

    def split_index(self, centers: torch.Tensor) -> torch.Tensor:
        """Row 0 (the peer's own) for its center; any other center has no rows here."""
        if bool((centers != self.center).any()):
            raise ValueError("a peer scores models only on its own center's rows")
        return torch.zeros_like(centers)

"""The project-wide seed hashes: every random stream of a run is keyed by ``mix_seed(seed, ...)``,
so the same seed gives the same run whatever the order of the draws."""

from __future__ import annotations

import torch

__all__ = ["M32", "hash32", "mix_seed"]

#: the 32-bit mask of :func:`hash32`
M32 = 0xFFFFFFFF


def hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer hash (C. Wellons) on int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def mix_seed(*parts: int) -> int:
    """SplitMix64-style combination of Python ints to a 63-bit generator seed."""
    h = 0x243F6A8885A308D3
    for p in parts:
        h = (h ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
        h = h * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h & 0x7FFFFFFFFFFFFFFF

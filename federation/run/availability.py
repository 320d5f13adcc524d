"""Center availability per round: a boolean mask ``[rounds, n]`` from the ``bernoulli``, ``daily`` or
``trace`` model, computed over the center axis. Details: docs/realworld.md, "Module notes".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl
import torch

from etl.errors import InputError
from federation.core.config import AvailabilityConfig
from federation.core.seeding import M32, hash32, mix_seed

__all__ = ["Availability", "read_center_csv", "uniforms"]


def uniforms(seed: int, stream: int, rows: torch.Tensor, n: int) -> torch.Tensor:
    """``[len(rows), n]`` float64 uniforms in [0, 1): ``hash(seed, stream, row, center) / 2^32``.

    Counter-based: entry (r, i) depends only on (seed, stream, rows[r], i)."""
    base = hash32(torch.tensor(mix_seed(seed, stream) & M32, dtype=torch.int64) ^ rows.to(torch.int64))
    cid = (torch.arange(n, dtype=torch.int64) * 0x9E3779B1) & M32
    key = hash32(hash32(base.unsqueeze(1) ^ cid.unsqueeze(0)) ^ 0x68E31DA4)
    return key.to(torch.float64) / float(1 << 32)


def read_center_csv(path: str | Path, numeric: Sequence[str], center_ids: Sequence[str]) -> tuple[
        torch.Tensor, dict[str, torch.Tensor]]:
    """Read a per-center CSV with columns ``center`` + ``numeric`` (header row required).

    Returns ``(center index [K] int64, {column: [K] float64})``, index into ``center_ids``.

    Raises:
        InputError: one line naming the file and the column: missing file, missing column, a
            value that is not a finite number >= 0, a center_id not in the cohort.
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: file not found")
    try:
        df = pl.read_csv(p, infer_schema=False)
    except Exception as exc:  # polars raises several types for unreadable CSV
        raise InputError(f"{p}: not a readable CSV ({exc.__class__.__name__})") from None
    for col in ("center", *numeric):
        if col not in df.columns:
            raise InputError(f"{p}: column '{col}' missing (expected columns: center, {', '.join(numeric)})")
    index = {c: i for i, c in enumerate(center_ids)}
    centers = df["center"].to_list()
    unknown = [c for c in centers if c not in index]
    if unknown:
        raise InputError(f"{p}: column 'center': {len(unknown)} value(s) are not center_ids of the cohort "
                         f"(first: {str(unknown[0])[:40]!r})")
    values: dict[str, torch.Tensor] = {}
    for col in numeric:
        v = df[col].cast(pl.Float64, strict=False)
        bad = v.is_null() | v.is_nan() | v.is_infinite() | (v < 0)
        if bool(bad.any()):
            row = int(bad.arg_max())  # type: ignore[arg-type]
            raise InputError(f"{p}: column '{col}': row {row + 2} is not a finite number >= 0 "
                             f"({str(df[col][row])[:40]!r})")
        values[col] = torch.tensor(v.to_list(), dtype=torch.float64)
    return torch.tensor([index[c] for c in centers], dtype=torch.int64), values


class Availability:
    """Availability model of one run.

    Args:
        cfg: the ``realworld.availability`` block.
        center_ids: ``[n]`` center_ids (order of the center axis).
        seed: the run seed (Bernoulli draws combine it with ``cfg.seed``).

    Raises:
        InputError: bad trace file (see :func:`read_center_csv`; also ``end <= start``) or a
            ``utc_offsets`` list whose length is not n.
    """

    def __init__(self, cfg: AvailabilityConfig, center_ids: Sequence[str], seed: int = 0) -> None:
        self.cfg = cfg
        self.n = len(center_ids)
        self.seed = int(seed)
        if cfg.kind == "daily":
            self.offsets = self._offsets(cfg, self.n)
        if cfg.kind == "trace":
            assert cfg.trace is not None
            self.centers, vals = read_center_csv(cfg.trace, ("start", "end"), center_ids)
            self.start, self.end = vals["start"], vals["end"]
            bad = self.end <= self.start
            if bool(bad.any()):
                row = int(torch.nonzero(bad)[0, 0])
                raise InputError(f"{cfg.trace}: column 'end': row {row + 2} is not after column 'start' "
                                 f"({float(self.end[row])} <= {float(self.start[row])})")
            self.listed = torch.zeros(self.n, dtype=torch.bool)
            self.listed[self.centers] = True

    @staticmethod
    def _offsets(cfg: AvailabilityConfig, n: int) -> torch.Tensor:
        """``[n]`` float64 UTC offsets in hours."""
        if cfg.utc_offsets == "utc":
            return torch.zeros(n, dtype=torch.float64)
        if cfg.utc_offsets == "spread":
            u = uniforms(cfg.seed, 0x7E2, torch.zeros(1, dtype=torch.int64), n)[0]
            return u * 24.0 - 12.0
        off = torch.tensor(cfg.utc_offsets, dtype=torch.float64)
        if off.numel() != n:
            raise InputError(f"realworld.availability.utc_offsets: {off.numel()} values for {n} centers")
        return off

    @property
    def always(self) -> bool:
        """True when every center is up in every round (the mask need not be computed)."""
        return self.cfg.kind == "always" or (self.cfg.kind == "bernoulli" and self.cfg.rate >= 1.0)

    def mask(self, rounds: torch.Tensor, hours: torch.Tensor) -> torch.Tensor:
        """``[R, n]`` bool: center i is up in round ``rounds[r]`` starting at virtual UTC hour ``hours[r]``.

        Args:
            rounds: ``[R]`` int64 0-based round indices (Bernoulli draws are keyed by them).
            hours: ``[R]`` float64 virtual time of each round's start, hours since the run's start
                (daily cycle: hour 0 = 00:00 UTC).
        """
        c = self.cfg
        r_n = int(rounds.numel())
        if self.always:
            return torch.ones(r_n, self.n, dtype=torch.bool)
        if c.kind == "bernoulli":
            return uniforms(mix_seed(self.seed, c.seed), 0xA7A1, rounds, self.n) < c.rate
        t = hours.to(torch.float64).reshape(-1, 1)
        if c.kind == "daily":
            local = torch.remainder(t + self.offsets.unsqueeze(0), 24.0)
            lo, hi = c.work_hours
            return (local >= lo) & (local < hi) if lo <= hi else (local >= lo) | (local < hi)
        if c.trace_period_hours is not None:
            t = torch.remainder(t, c.trace_period_hours)
        hit = (t >= self.start.unsqueeze(0)) & (t < self.end.unsqueeze(0))  # [R, K] intervals covering t
        up = torch.zeros(r_n, self.n, dtype=torch.int64).index_add_(1, self.centers, hit.to(torch.int64)) > 0
        if c.trace_unlisted == "available":
            up |= ~self.listed.unsqueeze(0)
        return up

    def row(self, round_idx: int, hour: float) -> torch.Tensor:
        """``[n]`` bool availability of one round (:meth:`mask` of one row)."""
        return self.mask(torch.tensor([round_idx]), torch.tensor([hour], dtype=torch.float64))[0]

"""Per-center compute and link profiles and the virtual clock of a round: a round lasts as long as
its slowest participant (or the deadline). The timing model: docs/realworld.md, "Module notes".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from etl.errors import InputError
from federation.core.config import DeadlineConfig, ProfilesConfig, Spread
from federation.run.availability import read_center_csv, uniforms

__all__ = ["Profiles", "finish_times", "deadline_cut"]

_FIELDS = ("rows_per_s", "uplink", "downlink", "latency_s")


def _draw(spread: Spread | None, u: torch.Tensor, rate: bool) -> torch.Tensor:
    """``[n]`` float64 values of ``spread`` at uniforms ``u``; None -> +inf for a rate, 0 for a latency."""
    if spread is None:
        return torch.full_like(u, math.inf if rate else 0.0)
    lo, hi = spread.low, spread.high
    if spread.scale == "log":
        return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
    return lo + u * (hi - lo)


@dataclass
class Profiles:
    """Per-center profiles, each ``[n]`` float64 (rates +inf = infinitely fast, latency seconds).

    Attributes:
        rows_per_s: training rows per second.
        uplink: bytes per second a center sends at.
        downlink: bytes per second a center receives at.
        latency_s: seconds added once per round in which the center transfers anything.
    """

    rows_per_s: torch.Tensor
    uplink: torch.Tensor
    downlink: torch.Tensor
    latency_s: torch.Tensor

    @classmethod
    def build(cls, cfg: ProfilesConfig, center_ids: Sequence[str]) -> Profiles:
        """Draw every center's profile from ``cfg`` (counter-based uniforms keyed by (cfg.seed,
        field, center)), then apply ``cfg.file`` rows.

        Raises:
            InputError: bad profile file (one line naming the file and column; see
                :func:`federation.run.availability.read_center_csv`), or a zero rate in it.
        """
        n = len(center_ids)
        u = uniforms(cfg.seed, 0xC10C, torch.arange(4), n)  # [4, n], one row per field
        vals = {f: _draw(getattr(cfg, f), u[j], f != "latency_s") for j, f in enumerate(_FIELDS)}
        if cfg.file is not None:
            idx, rows = read_center_csv(cfg.file, _FIELDS, center_ids)
            for f in _FIELDS:
                if f != "latency_s" and bool((rows[f] == 0).any()):
                    row = int(torch.nonzero(rows[f] == 0)[0, 0])
                    raise InputError(f"{cfg.file}: column '{f}': row {row + 2} is 0 (a rate must be > 0)")
                vals[f][idx] = rows[f]
        return cls(**vals)

    @property
    def ideal(self) -> bool:
        """True when every center is infinitely fast (every round lasts 0 seconds)."""
        return bool(torch.isinf(self.rows_per_s).all() and torch.isinf(self.uplink).all()
                    and torch.isinf(self.downlink).all() and (self.latency_s == 0).all())


def finish_times(profiles: Profiles, n_train: torch.Tensor, local_epochs: int, trains: torch.Tensor,
                 links: torch.Tensor, payload_bytes: int, extra_up_bytes: float = 0.0) -> torch.Tensor:
    """``[n]`` float64 seconds from the round's start until center i has computed and transferred.

    Args:
        profiles: the run's profiles.
        n_train: ``[n]`` train rows per center.
        local_epochs: epochs per round.
        trains: ``[n]`` bool, centers that train this round (the available ones).
        links: ``[n]`` int, payloads center i sends (and receives) this round.
        payload_bytes: bytes of one model transfer (the ledger's per-edge bytes).
        extra_up_bytes: probe / metadata bytes each participant sends besides.

    Returns:
        ``finish_i = compute_i + transfer_i`` (module docstring); 0 for a center that neither
        trains nor transfers.
    """
    t = trains.to(torch.float64)
    compute = torch.where(trains, local_epochs * n_train.to(torch.float64) / profiles.rows_per_s,
                          torch.zeros_like(t))
    up = links.to(torch.float64) * payload_bytes + torch.where(trains, torch.full_like(t, extra_up_bytes), 0.0)
    down = links.to(torch.float64) * payload_bytes
    sends = (up > 0) | (down > 0)
    transfer = torch.where(sends, profiles.latency_s + up / profiles.uplink + down / profiles.downlink,
                           torch.zeros_like(t))
    return compute + transfer


def deadline_cut(finish: torch.Tensor, participants: torch.Tensor, cfg: DeadlineConfig) -> tuple[
        torch.Tensor, float]:
    """Which participants' updates reach a server-based aggregation, and the round's duration.

    Args:
        finish: ``[n]`` seconds (:func:`finish_times`).
        participants: ``[n]`` bool, the available centers.
        cfg: the deadline policy.

    Returns:
        ``(on_time [n] bool, duration seconds)``. ``none``: every participant, duration = the
        slowest finish. ``fixed``: ``finish <= seconds``; the round lasts ``min(slowest, seconds)``.
        ``over_selection``: the fastest ``ceil(keep_fraction * participants)`` (ties at the cut
        kept); the round lasts until the last of them finishes.
    """
    if not bool(participants.any()):
        return participants.clone(), 0.0
    slowest = float(finish[participants].max())
    if cfg.policy == "none":
        return participants.clone(), slowest
    if cfg.policy == "fixed":
        return participants & (finish <= cfg.seconds), min(slowest, cfg.seconds)
    k = max(1, math.ceil(cfg.keep_fraction * int(participants.sum())))
    cut = float(torch.kthvalue(finish[participants], k).values)
    return participants & (finish <= cut), cut

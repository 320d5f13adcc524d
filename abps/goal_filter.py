"""Goal-aware metadata pre-filter (ABPS paper Sec. 4.1, eq. 3; Algorithm 1 line 10).

Design notes: docs/abps.md, "Module notes".
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "GOALS", "TAU_MODES", "CANDIDACY", "Goal", "normalize_metadata", "goal_scores", "calibrate_tau_sim",
    "calibrate_tau_sim_per_center", "candidate_mask",
]

Goal = Literal["homogeneity", "diversity", "alignment"]
GOALS: tuple[str, ...] = ("homogeneity", "diversity", "alignment")
TAU_MODES: tuple[str, ...] = ("global", "per_center")
CANDIDACY: tuple[str, ...] = ("proposer", "mutual")


def normalize_metadata(meta: Tensor) -> Tensor:
    """Z-score each metadata coordinate across centers.

    Args:
        meta: ``[n, d]`` metadata vectors (cohort-level aggregates).
    Returns:
        ``[n, d]`` float64, each column with mean 0 and population std 1; a column with zero spread is 0.
    Raises:
        ValueError: not 2-D or holding a non-finite value.
    """
    if meta.ndim != 2:
        raise ValueError(f"metadata must be [n, d], got shape {tuple(meta.shape)}")
    x = meta.to(torch.float64)
    if not torch.isfinite(x).all():
        raise ValueError("metadata holds a non-finite value")
    mu = x.mean(dim=0, keepdim=True)
    sd = x.std(dim=0, unbiased=False, keepdim=True)
    return torch.where(sd > 1e-12, (x - mu) / torch.where(sd > 1e-12, sd, torch.ones_like(sd)), torch.zeros_like(x))


def goal_scores(meta: Tensor, goal: str, normalize: bool = True) -> Tensor:
    """Pairwise goal score ``f_i(v_i, v_j)`` of eq. (3) for all pairs.

    Args:
        meta: ``[n, d]`` metadata; column 0 is the positive rate.
        goal: ``"homogeneity"``, ``"diversity"`` or ``"alignment"``.
        normalize: z-score the coordinates before the cosine (see the module docstring).
    Returns:
        ``[n, n]`` float64, symmetric; the diagonal is NaN (a center is not its own candidate).
        A zero vector has cosine 0 with every other vector.
    Raises:
        ValueError: unknown goal or bad metadata.
    """
    if goal not in GOALS:
        raise ValueError(f"unknown goal {goal!r}; expected one of {', '.join(GOALS)}")
    if meta.ndim != 2 or meta.shape[1] < 1:
        raise ValueError(f"metadata must be [n, d>=1], got shape {tuple(meta.shape)}")
    n = meta.shape[0]
    if goal == "alignment":
        p = meta[:, 0].to(torch.float64)
        s = -(p[:, None] - p[None, :]).abs()
    else:
        x = normalize_metadata(meta) if normalize else meta.to(torch.float64)
        norm = x.norm(dim=1, keepdim=True)
        unit = x / torch.where(norm > 1e-12, norm, torch.ones_like(norm))
        cos = unit @ unit.T
        s = cos if goal == "homogeneity" else -cos
    s = s.clone()
    s[torch.arange(n), torch.arange(n)] = float("nan")
    return s


def calibrate_tau_sim(scores: Tensor, keep_fraction: float = 0.25) -> float:
    """Threshold ``tau_sim`` that keeps ``keep_fraction`` of the (unordered) peer pairs (Sec. 4.1).

    ``tau_sim`` is the ``k``-th largest off-diagonal pair score with ``k = ceil(keep_fraction * P)``,
    ``P = n (n - 1) / 2``; ``scores >= tau_sim`` then keeps exactly ``k`` pairs unless scores tie.
    The scores of eq. (3) are symmetric, so the same fraction of ordered pairs is kept.

    Args:
        scores: ``[n, n]`` symmetric scores from :func:`goal_scores`.
        keep_fraction: in (0, 1].
    Returns:
        ``tau_sim`` (float); ``-inf`` when ``n < 2``.
    Raises:
        ValueError: ``keep_fraction`` outside (0, 1].
    """
    if not 0.0 < keep_fraction <= 1.0:
        raise ValueError(f"keep_fraction must be in (0, 1], got {keep_fraction}")
    n = scores.shape[0]
    if n < 2:
        return float("-inf")
    iu = torch.triu_indices(n, n, offset=1)
    vals = scores[iu[0], iu[1]].to(torch.float64)
    k = max(1, math.ceil(keep_fraction * vals.numel() - 1e-9))
    return float(torch.topk(vals, k).values[-1])


def calibrate_tau_sim_per_center(scores: Tensor, keep_fraction: float = 0.25) -> Tensor:
    """Per-center thresholds ``tau_sim_i`` keeping the top ``keep_fraction`` of each center's peers
    (Sec. 6.5 "25% of peers per center"; App. C.2 "top-rho quantile of peers under f_i").

    ``tau_sim_i`` is the ``k``-th largest of row ``i``'s off-diagonal scores, ``k = ceil(keep_fraction
    (n - 1))``; ``scores[i, j] >= tau_sim_i`` keeps exactly ``k`` peers of ``i`` unless scores tie
    (ties at the threshold are all kept).

    Args:
        scores: ``[n, n]`` scores from :func:`goal_scores` (NaN diagonal).
        keep_fraction: in (0, 1].
    Returns:
        ``[n]`` float64 thresholds; all ``-inf`` when ``n < 2``.
    Raises:
        ValueError: ``keep_fraction`` outside (0, 1] or ``scores`` not square.
    """
    if not 0.0 < keep_fraction <= 1.0:
        raise ValueError(f"keep_fraction must be in (0, 1], got {keep_fraction}")
    n = scores.shape[0]
    if scores.ndim != 2 or scores.shape[1] != n:
        raise ValueError(f"scores must be [n, n], got {tuple(scores.shape)}")
    if n < 2:
        return torch.full((n,), float("-inf"), dtype=torch.float64)
    s = scores.to(torch.float64).clone()
    s[torch.arange(n), torch.arange(n)] = float("-inf")  # a center is not its own peer
    k = max(1, math.ceil(keep_fraction * (n - 1) - 1e-9))
    return torch.topk(s, k, dim=1).values[:, -1]


def candidate_mask(
    meta: Tensor,
    goal: str | None,
    keep_fraction: float = 0.25,
    normalize: bool = True,
    tau_mode: str = "global",
    candidacy: str = "proposer",
) -> tuple[Tensor, Tensor]:
    """Candidate sets ``C_i`` of Algorithm 1 line 10 as a boolean matrix.

    Args:
        meta: ``[n, d]`` metadata vectors.
        goal: one of :data:`GOALS`, or None for no filter (``tau_sim = 0`` in the paper's base ABPS).
        keep_fraction: fraction of peer pairs (``global``) or of each center's peers (``per_center``) kept.
        normalize: z-score before the cosine.
        tau_mode: ``global`` (one threshold) or ``per_center`` (one per center), see the module docstring.
        candidacy: ``proposer`` (``mask[i, j]`` iff ``j in C_i``) or ``mutual`` (also ``i in C_j``).
            Only matters when ``C`` is not symmetric (``per_center``).
    Returns:
        ``(mask, tau_sim)``: ``mask`` ``[n, n]`` bool, False on the diagonal, ``mask[i, j]`` True iff
        ``i`` may propose to ``j``; ``tau_sim`` ``[n]`` float64, the threshold each center applied
        (all equal under ``global``; ``-inf`` with no goal).
    Raises:
        ValueError: unknown goal, tau_mode or candidacy; bad metadata or keep_fraction.
    """
    if tau_mode not in TAU_MODES:
        raise ValueError(f"unknown tau_mode {tau_mode!r}; expected one of {', '.join(TAU_MODES)}")
    if candidacy not in CANDIDACY:
        raise ValueError(f"unknown candidacy {candidacy!r}; expected one of {', '.join(CANDIDACY)}")
    n = meta.shape[0]
    eye = torch.eye(n, dtype=torch.bool)
    if goal is None:
        return ~eye, torch.full((n,), float("-inf"), dtype=torch.float64)
    s = goal_scores(meta, goal, normalize=normalize)
    if tau_mode == "global":
        tau = torch.full((n,), calibrate_tau_sim(s, keep_fraction), dtype=torch.float64)
    else:
        tau = calibrate_tau_sim_per_center(s, keep_fraction)
    mask = (s >= tau[:, None]) & ~eye  # NaN diagonal compares False
    if candidacy == "mutual":
        mask = mask & mask.T
    return mask, tau

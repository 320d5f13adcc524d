"""Goal-aware metadata pre-filter (ABPS paper Sec. 4.1, eq. 3; Algorithm 1 line 10).

Each center publishes a cohort-level metadata vector ``v_i`` (``d = 3``: positive rate, log n_train,
mean year / 2030; or ``d = 15`` with the 12 Charlson prevalences, docs/data_dictionary.md). Before
ranking, center ``i`` keeps as candidates ``C_i = {j != i : f_i(v_i, v_j) >= tau_sim}`` with

* homogeneity: ``f = cos(v_i, v_j)``
* diversity:   ``f = -cos(v_i, v_j)``
* alignment:   ``f = -|v_{i,0} - v_{j,0}|`` (``v_{.,0}`` = positive rate, the KPI marker)

``tau_sim`` is calibrated per goal so that a fixed fraction (default 25 %) of peers is kept, in one of
two readings of the paper (``tau_mode``):

* ``global`` (Sec. 4.1: "retain a fixed fraction (we use 25%) of candidate pairs"): one threshold per
  goal, the ``ceil(0.25 n (n - 1) / 2)``-th largest pair score. ``C`` is symmetric, but a center can
  end with many candidates (a hub) or none.
* ``per_center`` (Sec. 6.5: "retain 25% of peers per center"; App. C.2: ``C_i`` is "the top-rho
  quantile of peers under f_i"): each center ``i`` has its own ``tau_sim_i``, the
  ``ceil(0.25 (n - 1))``-th largest of ``f_i(v_i, v_j)`` over ``j != i``, so every center keeps the
  same number of candidates. ``C`` is then not symmetric: ``j in C_i`` does not imply ``i in C_j``.
  :func:`candidate_mask` resolves one-sided candidacy with ``candidacy`` (docs/abps.md): ``proposer``
  (default: ``i`` may propose to ``j`` iff ``j in C_i``, the literal Algorithm 1, line 10 filters the
  proposer's list and line 17 lets the receiver check only its UCB and capacity) or ``mutual``
  (``j in C_i`` and ``i in C_j``).

With no goal there is no filter (every other center is a candidate).

Optional normalization before the cosine (``normalize=True``; ABPS's default is off since the fidelity
study, docs/fidelity.md, found that only raw vectors reproduce Sec. 6.5): the raw vector is
dominated by ``log n_train`` (about 4 to 7) next to a positive rate of about 0.1 and a year coordinate
of about 1.05, so ``cos(v_i, v_j)`` of raw vectors is above 0.99 for every pair and the homogeneity and
diversity rankings would be decided by tiny differences in centre size. Each coordinate is therefore
z-scored across centers (mean 0, population std 1; a constant coordinate becomes 0) before the cosine.
The vectors are cohort-level aggregates that the paper already lets cross between centers, so the
federation-wide mean and std of each coordinate reveal nothing beyond what is shared. After z-scoring
the cosine measures whether two centers deviate from the federation average in the same direction
(similar case mix) or in opposite directions (dissimilar), giving both signs and a spread of values.
Alignment uses the raw positive rate (an affine rescaling would not change its ranking).
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

"""Batched AUROC for all centers at once (rank-based Mann-Whitney U with tie handling).

For one center with P positives and N negatives and mid-ranks r (ties share the average
rank, 1-based), AUROC = (sum_{positives} r - P (P + 1) / 2) / (P N)
(Mann & Whitney 1947; Hanley & McNeil 1982, Eq. 2). This equals scikit-learn's
``roc_auc_score`` (trapezoidal ROC area) including ties. A center whose split holds only
one class has no AUROC: it is NaN, excluded from the mean and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from federation.core.checks import NonFiniteError


def _finite_double(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``scores`` as float64; raises NonFiniteError when a (masked-in) score is NaN or infinite."""
    s = scores.detach().double()
    bad = ~torch.isfinite(s)
    bad = int((bad & mask).sum()) if mask is not None else int(bad.sum())
    if bad:
        raise NonFiniteError(f"AUROC: {bad} score(s) are NaN or infinite")
    return s


def u_auroc(rank_sum: torch.Tensor, n_pos: torch.Tensor, n_neg: torch.Tensor) -> torch.Tensor:
    """AUROC from the Mann-Whitney quantities (float64, any shape): ``(R - P (P + 1) / 2) / (P N)``
    with ``R`` the sum of the positives' 1-based mid-ranks, ``P`` / ``N`` the positive / negative
    counts; NaN where ``P`` or ``N`` is 0 (Mann & Whitney 1947; Hanley & McNeil 1982, Eq. 2)."""
    auc = (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)
    return torch.where((n_pos > 0) & (n_neg > 0), auc, torch.full_like(auc, float("nan")))


def _mann_whitney(rank: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """``[m]`` AUROC from 1-based ranks ``[m, rows]`` and bool positive / negative members;
    NaN where a row has no positive or no negative member."""
    return u_auroc((rank * pos).sum(1), pos.sum(1).double(), neg.sum(1).double())


def batched_auroc(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row AUROC of padded score tensors.

    Args:
        scores: ``[m, rows]`` real-valued scores (logits or probabilities; any monotone map
            gives the same AUROC). Values at masked-out positions are ignored.
        labels: ``[m, rows]`` 0/1 labels.
        mask: ``[m, rows]`` bool, True on real rows.

    Returns:
        ``[m]`` float64 AUROC in [0, 1]; NaN where a row has no positive or no negative real row
        (the only NaN it returns).

    Raises:
        NonFiniteError: a real (masked-in) score is NaN or infinite. Such a score has no rank, so
            there is no AUROC to return (a number outside [0, 1] used to come out).
    """
    s = _finite_double(scores, mask)
    # padding sorts last and ties only with padding: real scores are finite (checked above)
    s = torch.where(mask, s, torch.full_like(s, float("inf")))
    s_sorted, order = torch.sort(s, dim=1, stable=True)
    left = torch.searchsorted(s_sorted, s_sorted, right=False)
    right = torch.searchsorted(s_sorted, s_sorted, right=True)
    mid_rank = (left + right + 1).double() / 2.0  # 1-based average rank of each tie group
    y = labels.double().gather(1, order)
    valid = mask.gather(1, order)
    return _mann_whitney(mid_rank, (y > 0.5) & valid, (y <= 0.5) & valid)


class CountedAuroc:
    """Rows of scores sorted once, for the AUROC of many resamples or subsets of them given as counts.

    A resample (e.g. a bootstrap replicate, federation/core/clinical.py) that draws real row ``i`` of a
    row of scores ``c_i`` times gives each drawn copy the mid-rank ``below_i + (tied_i + 1) / 2`` among the drawn rows (``below_i``: drawn rows
    with a lower score, ``tied_i``: drawn rows with the same score, itself included), i.e.
    ``(C(left_i) + C(right_i) + 1) / 2`` with ``C(p)`` the running sum of the counts before sorted
    position ``p`` and ``[left_i, right_i)`` the tie group of row ``i``. The rank sum
    ``sum_i c_i y_i rank_i`` is a sum of half-integers below 2^52, exact in float64, as are the
    class counts, so the AUROC (:func:`u_auroc`) equals, bit for bit, the one of the resampled
    rows sorted afresh (:func:`batched_auroc`), without a sort per resample. A 0/1 count is a subset (a subgroup: :func:`grouped_auroc`).

    Args:
        scores: ``[m, rows]`` scores (finite on real rows).
        mask: ``[m, rows]`` bool, True on real rows (the others are never drawn).
        positive: ``[m, rows]`` bool labels.

    Raises:
        NonFiniteError: a real score is NaN or infinite.
    """

    def __init__(self, scores: torch.Tensor, mask: torch.Tensor, positive: torch.Tensor) -> None:
        s = _finite_double(scores, mask)
        s = torch.where(mask, s, torch.full_like(s, float("inf")))  # padding sorts last (never drawn)
        s_sorted, self.order = torch.sort(s, dim=1, stable=True)
        self.left = torch.searchsorted(s_sorted, s_sorted, right=False)  # first position of the tie group
        self.right = torch.searchsorted(s_sorted, s_sorted, right=True)  # one past its last position
        self.positive = positive.gather(1, self.order).to(torch.float64)

    def auroc(self, counts: torch.Tensor) -> torch.Tensor:
        """``[b, m]`` AUROC of ``b`` resamples given as ``[b, m, rows]`` float64 draw counts per
        row (columns in the order of ``scores``; 0 on padding)."""
        b = counts.shape[0]
        w = counts.gather(2, self.order[None].expand(b, -1, -1))
        run = F.pad(torch.cumsum(w, dim=2), (1, 0))  # [b, m, rows + 1]: C(p)
        twice_rank = (run.gather(2, self.left[None].expand(b, -1, -1))
                      + run.gather(2, self.right[None].expand(b, -1, -1)) + 1.0)
        w_pos = w * self.positive
        n_pos = w_pos.sum(2)
        return u_auroc((w_pos * twice_rank).sum(2) * 0.5, n_pos, w.sum(2) - n_pos)


def grouped_auroc(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor, k: int) -> torch.Tensor:
    """AUROC of every subgroup of every row from one sort per row (Mann-Whitney form).

    Equal to ``batched_auroc(scores, labels, mask & (groups == j))`` for each ``j`` (ties get the
    average rank inside the subgroup), but the rows are sorted and their tie groups located once
    and shared by the ``k`` subgroups (:class:`CountedAuroc` with each subgroup's 0/1 membership as
    counts): the rank of a member inside its subgroup is the number of members strictly below its
    score plus half of (the members tied with it + 1), both read from a running count of members
    along the shared order.

    Args:
        scores: ``[m, rows]`` finite real-valued scores (every position is a real row).
        labels: ``[m, rows]`` 0/1 labels.
        groups: ``[m, rows]`` int64 subgroup code per position (``-1`` or any value outside
            ``0..k-1``: in no subgroup).
        k: number of subgroups.

    Returns:
        ``[m, k + 1]`` float64 AUROC: column ``j < k`` for subgroup ``j``, column ``k`` over all
        positions of the row (``batched_auroc`` with an all-True mask); NaN where a subgroup has
        no positive or no negative member.

    Raises:
        NonFiniteError: a score is NaN or infinite.
    """
    rows = CountedAuroc(scores, torch.ones_like(groups, dtype=torch.bool), labels > 0.5)
    member = torch.stack([groups == j for j in range(k)] + [torch.ones_like(groups, dtype=torch.bool)])
    return rows.auroc(member.to(torch.float64)).T  # [k + 1, m] -> [m, k + 1]


@dataclass(frozen=True)
class AurocSummary:
    """Mean and standard deviation (population, ddof=0) of per-center AUROC over the
    centers that have both classes; ``n_excluded`` counts the one-class centers."""

    mean: float
    std: float
    n_excluded: int


def summarize(per_center: torch.Tensor) -> AurocSummary:
    """Summarize a ``[n]`` per-center AUROC tensor with NaN for one-class centers."""
    ok = ~torch.isnan(per_center)
    vals = per_center[ok]
    if vals.numel() == 0:
        return AurocSummary(float("nan"), float("nan"), int((~ok).sum()))
    return AurocSummary(float(vals.mean()), float(vals.std(unbiased=False)), int((~ok).sum()))

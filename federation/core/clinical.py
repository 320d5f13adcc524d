"""Clinical evaluation beyond mean AUROC, batched over centers (no loop over centers).

Design notes: docs/runtime.md, "Module notes".
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from federation.core.metrics import CountedAuroc, batched_auroc


def _check(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> None:
    if scores.shape != labels.shape or scores.shape != mask.shape or scores.dim() != 2:
        raise ValueError(f"scores, labels and mask must share one [m, rows] shape, got "
                         f"{list(scores.shape)}, {list(labels.shape)}, {list(mask.shape)}")
    if not bool(torch.isfinite(scores[mask]).all()):
        raise ValueError("scores hold non-finite values on real rows")


def batched_auprc(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row average precision (area under the precision-recall curve, step-wise).

    Args:
        scores: ``[m, rows]`` real scores (higher = more likely positive).
        labels: ``[m, rows]`` 0/1.
        mask: ``[m, rows]`` bool, True on real rows.

    Returns:
        ``[m]`` float64; equals ``sklearn.metrics.average_precision_score`` (ties included);
        NaN where a row has no positive.

    Raises:
        ValueError: shapes differ, or a real score is not finite.
    """
    _check(scores, labels, mask)
    s = (-scores.detach().double()).masked_fill(~mask, math.inf)  # descending score, padding last
    s_sorted, order = torch.sort(s, dim=1, stable=True)
    y = (labels.double().gather(1, order) > 0.5) & mask.gather(1, order)
    tp = torch.cumsum(y.double(), dim=1)
    end = torch.searchsorted(s_sorted, s_sorted, right=True) - 1  # last index of each tie group
    precision_at_end = tp.gather(1, end) / (end + 1).double()
    n_pos = y.sum(1).double()
    ap = (precision_at_end * y.double()).sum(1) / n_pos
    return torch.where(n_pos > 0, ap, torch.full_like(ap, math.nan))


def batched_brier(prob: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row Brier score ``mean (p - y)^2`` over real rows.

    Args:
        prob: ``[m, rows]`` predicted probabilities in [0, 1].
        labels, mask: as in :func:`batched_auprc`.

    Returns:
        ``[m]`` float64 in [0, 1]; NaN for a row without real rows.
    """
    _check(prob, labels, mask)
    m = mask.double()
    sq = (prob.detach().double() - labels.double()) ** 2 * m
    n = m.sum(1)
    return torch.where(n > 0, sq.sum(1) / n.clamp_min(1), torch.full_like(n, math.nan))


def batched_ece(prob: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, n_bins: int = 10) -> torch.Tensor:
    """Per-row expected calibration error with ``n_bins`` equal-width probability bins.

    Args:
        prob: ``[m, rows]`` predicted probabilities in [0, 1].
        labels, mask: as in :func:`batched_auprc`.
        n_bins: number of bins B >= 1 (bin b = [b/B, (b+1)/B), p = 1 in the last bin).

    Returns:
        ``[m]`` float64 in [0, 1]; NaN for a row without real rows.

    Raises:
        ValueError: ``n_bins < 1`` or probabilities outside [0, 1].
    """
    _check(prob, labels, mask)
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    p = prob.detach().double()
    if bool(((p < 0) | (p > 1))[mask].any()):
        raise ValueError("probabilities must lie in [0, 1]")
    m = mask.double()
    b = torch.clamp((p * n_bins).floor().long(), 0, n_bins - 1)
    b = torch.where(mask, b, torch.zeros_like(b))
    cnt = torch.zeros(p.shape[0], n_bins, dtype=torch.float64).scatter_add_(1, b, m)
    sum_p = torch.zeros_like(cnt).scatter_add_(1, b, p * m)
    sum_y = torch.zeros_like(cnt).scatter_add_(1, b, labels.double() * m)
    n = cnt.sum(1)
    ece = (sum_y - sum_p).abs().sum(1) / n.clamp_min(1)  # sum_b n_b/N |ybar_b - pbar_b|
    return torch.where(n > 0, ece, torch.full_like(n, math.nan))


def batched_calibration(
    logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, max_iter: int = 50, tol: float = 1e-10,
    min_events: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row calibration intercept ``a`` and slope ``b`` of ``logit P(y=1) = a + b z``.

    Newton-Raphson on the unpenalized logistic log-likelihood, all rows at once (a 2 x 2
    system per row, solved in closed form). A row is NaN when it has fewer than ``min_events``
    rows of either class, or its fit has not converged within ``max_iter`` steps (perfect
    separation drives the slope to infinity).

    Args:
        logits: ``[m, rows]`` the model's logits z.
        labels, mask: as in :func:`batched_auprc`.
        min_events: the fewest rows of each class a defined fit needs (1: any two-class row; a
            fit on one or two deaths is defined but says nothing: slopes of -600 on the eICU demo).

    Returns:
        ``(intercept [m], slope [m])`` float64.
    """
    _check(logits, labels, mask)
    z = logits.detach().double().masked_fill(~mask, 0.0)
    y = labels.double()
    m = mask.double()
    a = torch.zeros(z.shape[0], dtype=torch.float64)
    b = torch.ones_like(a)
    converged = torch.zeros_like(a, dtype=torch.bool)
    for _ in range(max_iter):
        p = torch.sigmoid(a[:, None] + b[:, None] * z)
        r = (y - p) * m
        w = p * (1 - p) * m
        g0, g1 = r.sum(1), (r * z).sum(1)
        h00, h01, h11 = w.sum(1), (w * z).sum(1), (w * z * z).sum(1)
        det = h00 * h11 - h01 * h01
        ok = det > 1e-300
        da = torch.where(ok, (h11 * g0 - h01 * g1) / det.clamp_min(1e-300), torch.zeros_like(det))
        db = torch.where(ok, (h00 * g1 - h01 * g0) / det.clamp_min(1e-300), torch.zeros_like(det))
        a, b = a + da, b + db
        converged = ok & (da.abs() + db.abs() < tol * (1 + a.abs() + b.abs()))
        if bool(converged.all()):
            break
    n_pos = (y * m).sum(1)
    n_neg = m.sum(1) - n_pos
    enough = max(1, min_events)
    valid = converged & (n_pos >= enough) & (n_neg >= enough) & torch.isfinite(a) & torch.isfinite(b)
    nan = torch.full_like(a, math.nan)
    return torch.where(valid, a, nan), torch.where(valid, b, nan)


@dataclass(frozen=True)
class Distribution:
    """How a per-center metric is spread across centers (NaN centers left out, counted).

    ``worst10`` is the mean of the lowest ``ceil(0.1 k)`` of the k defined values (the worst
    10 % of centers; "lowest" is worst for AUROC / AUPRC: pass ``higher_is_better=False`` to
    :func:`distribution` for Brier / ECE, whose worst are the highest). ``gini`` is the Gini
    coefficient ``sum_ij |x_i - x_j| / (2 k^2 mean)`` (0 = equal across centers).
    """

    mean: float
    median: float
    worst10: float
    std: float
    gini: float
    n_defined: int
    n_undefined: int


def distribution(per_center: torch.Tensor, higher_is_better: bool = True) -> Distribution:
    """Summarize a ``[n]`` per-center metric (NaN = undefined) across centers."""
    v = per_center.detach().double()
    ok = torch.isfinite(v)
    x = v[ok]
    k = int(x.numel())
    if k == 0:
        nan = math.nan
        return Distribution(nan, nan, nan, nan, nan, 0, int((~ok).sum()))
    srt = torch.sort(x, descending=not higher_is_better).values
    worst = float(srt[: math.ceil(0.1 * k)].mean())
    mean = float(x.mean())
    gini = float((x[:, None] - x[None, :]).abs().sum() / (2 * k * k * mean)) if mean != 0 else math.nan
    return Distribution(mean=mean, median=float(x.quantile(0.5)), worst10=worst, std=float(x.std(unbiased=False)),
                        gini=gini, n_defined=k, n_undefined=int((~ok).sum()))


def bootstrap_mean_auroc(
    scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, n_boot: int = 200, seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean per-center AUROC, patients resampled within center.

    Each replicate draws, for every center, as many rows with replacement from that center's
    own real rows as it has, recomputes every center's AUROC (batched over replicates x
    centers) and takes the mean over centers with both classes. A replicate's AUROC is computed
    from how often it draws each row, along the rows' order sorted once (:class:`federation.core.metrics.CountedAuroc`):
    equal, to the last bit, to :func:`federation.core.metrics.batched_auroc` of the resampled rows.

    Args:
        scores, labels, mask: ``[n, rows]`` as for :func:`federation.core.metrics.batched_auroc`
            (real rows first in each row).
        n_boot: replicates B. seed: the generator seed (same seed, same interval).
        level: two-sided coverage.

    Returns:
        ``(low, high)``; NaN when no replicate has a defined mean.
    """
    n, rows = scores.shape
    tied = CountedAuroc(scores, mask, labels > 0.5)
    parts = []
    for idx in _resample_within_center(mask, n_boot, seed):  # blocks of replicates (bounded memory)
        b = idx.shape[0]
        # how often each real row is drawn (a padded position draws nothing)
        counts = torch.zeros(b, n, rows, dtype=torch.float64).scatter_add_(
            2, idx, mask[None].expand(b, n, rows).to(torch.float64))
        auc = tied.auroc(counts)  # [b, n]
        parts.append(torch.nanmean(auc, dim=1))
    means = torch.cat(parts)
    means = means[torch.isfinite(means)]
    if means.numel() == 0:
        return math.nan, math.nan
    q = torch.tensor([(1 - level) / 2, 1 - (1 - level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(means, q).tolist()
    return lo, hi


#: most (replicate, center, row) cells of one block of bootstrap replicates (bounds memory at
#: many centers: 10,000 centers x 531 test rows x 200 replicates would be 8.5 GB per float64 tensor)
BOOT_BLOCK_CELLS = 1 << 24


def _resample_within_center(mask: torch.Tensor, n_boot: int, seed: int) -> Iterator[torch.Tensor]:
    """Blocks ``[b, n, rows]`` int64 of row indices, replicates in order (together ``n_boot``):
    each center's real rows drawn with replacement. One generator draws the blocks in turn, so
    the indices are those of a single ``[n_boot, n, rows]`` draw, whatever the block size."""
    n, rows = mask.shape
    counts = mask.sum(1)[None, :, None].double()
    g = torch.Generator().manual_seed(seed)
    block = max(1, BOOT_BLOCK_CELLS // max(1, n * rows))
    for lo in range(0, n_boot, block):
        u = torch.rand(min(block, n_boot - lo), n, rows, generator=g, dtype=torch.float64)
        yield (u * counts).floor().long().clamp_max(rows - 1)


#: The small-cell rule for every figure that leaves a run (subgroups, per-center tables): a cell with
#: fewer than MIN_CELL_ROWS rows or fewer than MIN_CELL_EVENTS of either class is suppressed.
MIN_CELL_ROWS = 30
MIN_CELL_EVENTS = 5


def is_small_cell(n: int, n_pos: int | None, min_size: int = MIN_CELL_ROWS, min_events: int = MIN_CELL_EVENTS) -> bool:
    """True when a cell of ``n`` rows with ``n_pos`` positives must be suppressed (the rule above);
    ``n_pos`` None (unknown) judges by ``n`` alone."""
    if n < min_size:
        return True
    return n_pos is not None and (n_pos < min_events or n - n_pos < min_events)


@dataclass(frozen=True)
class SubgroupRow:
    """One subgroup's pooled figures (all centers' test rows of the group together).

    ``suppressed`` is True when the group has fewer than ``min_size`` rows or fewer than
    ``min_events`` of either class; its figures are then NaN (a small cell can identify
    patients, and its AUROC means little). ``*_gap`` = group figure - overall figure;
    ``auroc_gap_ci`` is the percentile bootstrap interval of the AUROC gap.
    """

    group: str
    n: int
    suppressed: bool
    auroc: float
    auroc_gap: float
    auroc_gap_ci: tuple[float, float]
    ece: float
    ece_gap: float


def subgroup_gaps(
    logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor, names: list[str],
    min_size: int = MIN_CELL_ROWS, min_events: int = MIN_CELL_EVENTS, n_boot: int = 200, seed: int = 0, n_bins: int = 10,
) -> list[SubgroupRow]:
    """AUROC and ECE by subgroup, pooled over centers, with the gap to the overall figure.

    Args:
        logits: ``[n, rows]`` model logits. labels, mask: ``[n, rows]`` as in
            :func:`batched_auprc`.
        groups: ``[n, rows]`` int64 group code per row (index into ``names``; -1 = unknown,
            counted in no group but in the overall figure).
        names: group names.
        min_size, min_events: suppression thresholds (see :class:`SubgroupRow`).
        n_boot, seed: bootstrap replicates (patients resampled within center) and seed.

    Returns:
        One :class:`SubgroupRow` per name, in ``names`` order.
    """
    _check(logits, labels, mask)
    n, rows = logits.shape
    flat = lambda t: t.reshape(1, -1)  # noqa: E731 - pooled over centers: one row
    prob = torch.sigmoid(logits.detach().double())
    g_all = torch.arange(len(names))[:, None]
    gm = (groups.reshape(1, -1) == g_all) & flat(mask)  # [G, n * rows]
    k = len(names)
    s_rep = logits.reshape(1, -1).expand(k, -1)
    y_rep = labels.reshape(1, -1).expand(k, -1)
    auc_all = batched_auroc(flat(logits), flat(labels), flat(mask))[0]
    ece_all = batched_ece(flat(prob), flat(labels), flat(mask), n_bins)[0]
    auc_g = batched_auroc(s_rep, y_rep, gm)
    ece_g = batched_ece(prob.reshape(1, -1).expand(k, -1), y_rep, gm, n_bins)
    n_g = gm.sum(1)
    pos_g = (gm & (y_rep > 0.5)).sum(1)
    # bootstrap of the gaps: one resample per replicate shared by the overall figure and every group.
    # Only real rows enter a replicate (a resampled index always lands on a real row of its center),
    # so the real rows are sorted once, pooled, and a replicate is the count of draws of each row
    small = [is_small_cell(int(n_g[j]), int(pos_g[j]), min_size, min_events) for j in range(k)]
    real = int(mask.sum())
    z_real, y_real, g_real = logits[mask].reshape(1, -1), labels[mask].reshape(1, -1) > 0.5, groups[mask]
    every = CountedAuroc(z_real, torch.ones_like(y_real), y_real)
    # each group's own rows, sorted once: a replicate's group AUROC reads only their counts
    sel = {j: torch.nonzero(g_real == j).reshape(-1) for j in range(k) if not small[j]}
    tied = {j: CountedAuroc(z_real[:, c], torch.ones(1, c.numel(), dtype=torch.bool), y_real[:, c])
            for j, c in sel.items()}
    # position among the real rows of each (center, row) slot; padded slots are never drawn
    slot = torch.full((n * rows,), -1, dtype=torch.long)
    slot[mask.reshape(-1)] = torch.arange(real)
    base = (torch.arange(n) * rows)[None, :, None]
    gaps: list[list[torch.Tensor]] = [[] for _ in range(k)]
    for idx in _resample_within_center(mask, n_boot, seed):  # blocks of replicates (bounded memory)
        b = idx.shape[0]
        drawn = slot[base + idx][:, mask]  # [b, real rows drawn]: positions among the real rows
        counts = torch.zeros(b, real, dtype=torch.float64).scatter_add_(
            1, drawn, torch.ones(b, real, dtype=torch.float64))[:, None, :]  # [b, 1, real]
        auc_every = every.auroc(counts)[:, 0]  # [b]: every row of the replicate
        for j, c in sel.items():  # a handful of groups, not centers
            gaps[j].append(tied[j].auroc(counts[..., c])[:, 0] - auc_every)
    q = torch.tensor([0.025, 0.975], dtype=torch.float64)
    out = []
    for j, name in enumerate(names):
        if small[j]:
            nan = math.nan
            out.append(SubgroupRow(name, int(n_g[j]), True, nan, nan, (nan, nan), nan, nan))
            continue
        gap_b = torch.cat(gaps[j])
        gap_b = gap_b[torch.isfinite(gap_b)]
        ci = tuple(torch.quantile(gap_b, q).tolist()) if gap_b.numel() else (math.nan, math.nan)
        out.append(SubgroupRow(name, int(n_g[j]), False, float(auc_g[j]), float(auc_g[j] - auc_all), ci,
                               float(ece_g[j]), float(ece_g[j] - ece_all)))
    return out

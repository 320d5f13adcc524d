"""Gossip-learning metrics of Tian et al. (arXiv 2404.04616): plateau delay (eq. (2)), reaching
times (Sec. VI-A, Fig. 8), model weight difference (Sec. III-A) and per-layer variance (Fig. 7)."""

from __future__ import annotations

import numpy as np
import torch

from etl.errors import InputError


def plateau_delay(ticks: np.ndarray, mean_acc: np.ndarray, t_first_average: float, smooth: int = 1) -> float | None:
    """Plateau delay, eq. (2): the time of the steepest rise of the mean accuracy after the first averaging.

    ``A'(t_pd) >= A'(t)  for all t in (t_first_average, +inf)``. A(t) is observed only at eval
    ticks ``t_0 < t_1 < ...``; A' is the finite-difference slope ``(A_j - A_{j-1}) / (t_j - t_{j-1})``
    of each interval, placed at the interval's midpoint ``(t_{j-1} + t_j) / 2``. Only intervals
    that start at or after ``t_first_average`` count (this excludes the early rise from isolated
    training, Sec. III-B). Ties go to the earliest interval.

    Args:
        ticks: ``[T]`` increasing eval ticks.
        mean_acc: ``[T]`` mean accuracy over nodes A(t_j).
        t_first_average: tick of the first model averaging in the network.
        smooth: width of a centered moving average applied to A before differencing (1 = none;
            odd values >= 1); evaluation on a test subset is noisy.
    Returns:
        the plateau delay in ticks, or None when no interval lies after ``t_first_average``.
    Raises:
        InputError: shapes differ, ticks not increasing, or ``smooth`` not an odd integer >= 1.
    """
    t = np.asarray(ticks, dtype=np.float64)
    a = np.asarray(mean_acc, dtype=np.float64)
    if t.shape != a.shape or t.ndim != 1:
        raise InputError("plateau_delay: ticks and mean_acc must be 1-D of equal length")
    if np.any(np.diff(t) <= 0):
        raise InputError("plateau_delay: ticks must be strictly increasing")
    if smooth < 1 or smooth % 2 == 0:
        raise InputError(f"plateau_delay: smooth must be an odd integer >= 1, got {smooth}")
    if smooth > 1:
        half = smooth // 2
        padded = np.pad(a, half, mode="edge")
        a = np.convolve(padded, np.ones(smooth) / smooth, mode="valid")
    slope = np.diff(a) / np.diff(t)
    start = t[:-1]
    valid = start >= t_first_average
    if not valid.any():
        return None
    j = int(np.flatnonzero(valid)[np.argmax(slope[valid])])
    return float((t[j] + t[j + 1]) / 2.0)


def reaching_times(ticks: np.ndarray, acc: np.ndarray, target: float, most_fraction: float = 0.9) -> dict[str, float | None]:
    """First tick at which the first node, and "most" nodes, reach a target accuracy (Sec. VI-A).

    Args:
        ticks: ``[T]`` eval ticks; acc: ``[T, N]`` per-node accuracy.
        target: accuracy threshold (the paper: 0.9 on MNIST).
        most_fraction: share of nodes that makes "most" (the paper: "over 90% of nodes"; here
            at least this share).
    Returns:
        {"first": tick or None, "most": tick or None}.
    """
    acc = np.asarray(acc, dtype=np.float64)
    reached = acc >= target
    first = np.flatnonzero(reached.any(axis=1))
    most = np.flatnonzero(reached.mean(axis=1) >= most_fraction)
    return {"first": float(ticks[first[0]]) if first.size else None,
            "most": float(ticks[most[0]]) if most.size else None}


def weight_difference(flat: torch.Tensor, layout, names: tuple[str, ...] | None = None) -> dict[str, float]:
    """Model weight difference (Sec. III-A): ``diff = (1/N) sum_n |model_{(n+1) mod N} - model_n|``.

    ``|.|`` is the Manhattan (L1) distance, per layer, between ring-neighbouring node indices.

    Args:
        flat: ``[N, P]`` stacked parameters; layout: its ``ParamLayout``.
        names: parameter names to report (default: the ``*.weight`` tensors, i.e. conv1, conv2,
            ip1, ip2 of Fig. 2(b)).
    Returns:
        name (layer, without ".weight") -> diff.
    """
    views = layout.views(flat)
    names = names or tuple(n for n in layout.names if n.endswith(".weight"))
    out = {}
    for name in names:
        v = views[name].reshape(flat.shape[0], -1)
        d = (torch.roll(v, shifts=-1, dims=0) - v).abs().sum(dim=1).mean()
        out[name.removesuffix(".weight")] = float(d)
    return out

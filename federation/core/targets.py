"""Bytes to target (ABPS paper Sec. 7): the first round, and the cumulative bytes then, at which a
run's mean validation AUROC reaches a target. Details: docs/ledger.md, "Module notes".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["curve_of", "first_reach", "reach_all", "relative_targets", "target_name"]


def curve_of(history: Sequence[Mapping[str, float]]) -> dict[str, list[float]]:
    """The bytes-to-target curve of a run's per-round history (the rows
    :func:`federation.run.runner.round_metrics` makes, each with its ``round``).

    Returns:
        ``{"round": [tau], "val_auroc_mean": [mean val AUROC], "cum_total_bytes": [bytes]}``, lists
        by round; ``cum_total_bytes = cum_bytes + cum_probe_bytes + cum_metadata_bytes``.
    """
    return {
        "round": [int(h["round"]) for h in history],
        "val_auroc_mean": [float(h["val_auroc_mean"]) for h in history],
        "cum_total_bytes": [float(h["cum_bytes"]) + float(h.get("cum_probe_bytes", 0.0))
                            + float(h.get("cum_metadata_bytes", 0.0)) for h in history],
    }


def first_reach(rounds: Sequence[int], auroc: Sequence[float], cum_bytes: Sequence[float],
                target: float) -> tuple[int | None, float | None]:
    """``(round, cumulative bytes)`` of the first round whose mean validation AUROC is ``>= target``;
    ``(None, None)`` when no round reaches it (NaN rounds reach nothing).

    Args:
        rounds, auroc, cum_bytes: one entry per evaluated round, in round order (same length).
        target: the AUROC target.

    Raises:
        ValueError: the three sequences differ in length.
    """
    if not len(rounds) == len(auroc) == len(cum_bytes):
        raise ValueError(f"curve lengths differ: {len(rounds)} rounds, {len(auroc)} AUROC, {len(cum_bytes)} bytes")
    for r, a, b in zip(rounds, auroc, cum_bytes):
        if math.isfinite(a) and a >= target:
            return int(r), float(b)
    return None, None


def reach_all(curve: Mapping[str, Sequence[float]], targets: Sequence[float]) -> list[dict[str, Any]]:
    """:func:`first_reach` of every target on a :func:`curve_of` curve:
    ``[{"auroc": t, "round": tau or None, "bytes": bytes or None}]`` in the order of ``targets``."""
    out = []
    for t in targets:
        r, b = first_reach(curve["round"], curve["val_auroc_mean"], curve["cum_total_bytes"], t)
        out.append({"auroc": float(t), "round": r, "bytes": b})
    return out


def relative_targets(level: float, below: Sequence[float]) -> list[float]:
    """The targets ``level - d`` for each offset ``d`` of ``below``, in increasing order.

    >>> relative_targets(0.813, (0.063, 0.043, 0.028))  # the paper's 0.750 / 0.770 / 0.785
    [0.75, 0.77, 0.785]
    """
    return sorted(round(level - d, 12) for d in below)


def target_name(t: float) -> str:
    """The MLflow suffix of a target: three decimals, e.g. ``0.750`` (``rounds_to_auroc_0.750``)."""
    return f"{t:.3f}"

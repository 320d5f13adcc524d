"""Variance-correction paper Table I (Tian et al., Sec. VI-B) from the runs tagged ``benchmark = vv``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from federation.report.common import csv_text, fmt, md_table, mean_std
from federation.run.tracking import ARM_TAG, GRID_CELL_TAG

__all__ = ["vv_table"]


def vv_table(runs: Sequence[Any]) -> tuple[str, str]:
    """Variance-correction Table I: per grid cell and arm, first / most reaching ticks and plateau delay.

    Reaching times are means over the seeds that reached the target, shown with ``(k/N)``."""
    latest: dict[tuple[str, str, str], Any] = {}
    for r in sorted(runs, key=lambda r: r.info.start_time or 0):
        latest[(r.data.tags.get(GRID_CELL_TAG, ""), r.data.tags[ARM_TAG], r.data.params.get("seed", "?"))] = r
    groups: dict[tuple[str, str], list[Any]] = {}
    for (cell, arm, _seed), r in latest.items():
        groups.setdefault((cell, arm), []).append(r)
    cells = sorted({c for c, _ in groups})
    arms = sorted({a for _, a in groups})
    metrics = ("first_reach", "most_reach", "plateau_delay", "final_mean_accuracy")
    md_rows, csv_rows = [], []
    for cell in cells:
        row = [cell]
        for arm in arms:
            rs = groups.get((cell, arm), [])
            stats = {}
            for m in metrics:
                v = [float(r.data.metrics[m]) for r in rs if m in r.data.metrics]
                mu, sd = mean_std(v)
                stats[m] = (mu, len(v))
                csv_rows.append((cell, arm, m, mu, sd, len(v), len(rs)))
            n = len(rs)
            row.append(f"{fmt(stats['most_reach'][0], 0)} ({stats['most_reach'][1]}/{n})")
            row.append(f"{fmt(stats['first_reach'][0], 0)} ({stats['first_reach'][1]}/{n})")
        md_rows.append(row)
    head = ["Cell"] + [f"{a}: {k}" for a in arms for k in ("most reaching", "first")]
    md = ("Variance-correction Table I (ticks to reach the target accuracy; mean over seeds that reached it, "
          "(reached/seeds))\n\n" + md_table(head, md_rows))
    return md, csv_text(["cell", "arm", "metric", "mean", "std", "n_values", "n_seeds"], csv_rows)

"""Per-seed isolation section of ``abps report`` (ABPS paper Sec. 6.5).

One row per (row label, seed) of the partner-selection runs (``abps*``, ``random-partners``): the
final MLflow metrics that :meth:`abps.method.AbpsMethod.final_metrics` logs for each seed, i.e. the
mean isolation per round (share of centers with ``P_i`` empty), E|P_i| over centers and rounds,
the run's acceptance rate (accepted / sent proposals) and how many centers rested at least once.
Only aggregates over centers and rounds appear; nothing row-level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from federation.report.collect import CellRun
from federation.report.common import fmt, md_table

__all__ = ["isolation_rows", "isolation_markdown", "isolation_section"]


def isolation_rows(cells: Sequence[CellRun]) -> list[dict[str, Any]]:
    """The runs that logged a isolation rate, sorted by (label, seed), as plain dicts with keys label,
    seed, rest_share, partners_mean, acceptance_rate, centers_ever_rested (NaN where not logged)."""
    keep = [c for c in cells if math.isfinite(c.rest_share)]
    return [{"label": c.label, "seed": c.seed, "rest_share": c.rest_share, "partners_mean": c.partners_mean,
             "acceptance_rate": c.acceptance_rate, "centers_ever_rested": c.centers_ever_rested}
            for c in sorted(keep, key=lambda c: (c.label, c.seed))]


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f} %"


def isolation_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table of :func:`isolation_rows` (isolation and acceptance in percent)."""
    return md_table(["Method", "Seed", "Isolation per round", "E\\|P_i\\|", "Acceptance rate", "Centers ever rested"],
                    [[r["label"], r["seed"], _pct(r["rest_share"]), fmt(r["partners_mean"]),
                      _pct(r["acceptance_rate"]), fmt(r["centers_ever_rested"], 0)] for r in rows])


def isolation_section(cells: Sequence[CellRun]) -> tuple[str, dict[str, Any]]:
    """``(markdown, report.json section)``; the markdown says so when no run logged a isolation rate."""
    rows = isolation_rows(cells)
    head = "\n## Isolation per seed (partner-selection runs)\n\n"
    if not rows:
        return head + "No run of this experiment logged its isolation.\n", {"rows": []}
    return head + isolation_markdown(rows), {"rows": rows}

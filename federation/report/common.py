"""Statistics and text formats shared by the report's tables: across-seed mean / std, the
accuracy-bandwidth Pareto front, Markdown and CSV tables."""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["mean_std", "pareto_front", "fmt", "md_table", "csv_text"]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population std (ddof 0) of the finite values; (nan, nan) when none, std 0 for one."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return math.nan, math.nan
    return statistics.fmean(v), (statistics.pstdev(v) if len(v) > 1 else 0.0)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated points when ``x`` (bytes) is minimized and ``y`` (AUROC) maximized.

    Point i is dominated when some j has ``x_j <= x_i`` and ``y_j >= y_i`` with one inequality
    strict; equal points do not dominate each other. Points with a non-finite coordinate are
    never on the front. Returns indices sorted by increasing x (then decreasing y).
    """
    ok = [i for i, (x, y) in enumerate(points) if math.isfinite(x) and math.isfinite(y)]
    front = []
    for i in ok:
        xi, yi = points[i]
        if not any(points[j][0] <= xi and points[j][1] >= yi and (points[j][0] < xi or points[j][1] > yi)
                   for j in ok if j != i):
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], -points[i][1]))


def fmt(x: float, nd: int = 3) -> str:
    """``x`` with ``nd`` decimals, ``n/a`` when missing or not finite."""
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{nd}f}"


def md_cell(value: Any) -> str:
    """``value`` as one Markdown table cell: a ``|`` escaped, line breaks as spaces (a label or
    tag from the store may hold either)."""
    return " ".join(str(value).splitlines()).replace("|", "\\|")


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (cells through :func:`md_cell`)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(md_cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def csv_text(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """CSV text; non-finite floats become empty fields."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(headers)
    for r in rows:
        w.writerow(["" if isinstance(v, float) and not math.isfinite(v) else v for v in r])
    return buf.getvalue()

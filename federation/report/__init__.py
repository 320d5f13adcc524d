"""``abps report``: the papers' tables and figures rebuilt from the FINISHED runs of an MLflow experiment.

Details: docs/runtime.md, "`abps report` sections in full". :func:`build_report` and
:func:`write_report` load their module (plotting, the clinical and cross sections) on first use,
so a command that only reads runs (``abps runs``) does not import it.
"""

from __future__ import annotations

from typing import Any

from federation.report.abps_table1 import (  # noqa: F401
                                          _COLOURS,
                                          DISPLAY,
                                          FAMILY,
                                          PAPER_ORDER,
                                          Table1Row,
                                          figure3,
                                          table1,
                                          table1_markdown,
)
from federation.report.collect import CellRun, Collected, collect_runs, dedupe_cells
from federation.report.common import mean_std, pareto_front
from federation.report.sage_tables import sage_figure, sage_tables
from federation.report.vv_table import vv_table

__all__ = ["CellRun", "Collected", "Table1Row", "pareto_front", "mean_std", "collect_runs", "dedupe_cells", "table1",
           "table1_markdown", "figure3", "sage_tables", "sage_figure", "vv_table", "build_report", "write_report",
           "PAPER_ORDER", "DISPLAY", "FAMILY"]


def __getattr__(name: str) -> Any:
    if name in ("build_report", "write_report"):
        from federation.report import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

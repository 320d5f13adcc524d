"""``abps report``: the papers' tables and figures rebuilt from the FINISHED runs of an MLflow experiment.

Details: docs/runtime.md, "`abps report` sections in full".
"""

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
from federation.report.build import build_report, write_report
from federation.report.collect import CellRun, Collected, collect_runs, dedupe_cells
from federation.report.common import mean_std, pareto_front
from federation.report.sage_tables import sage_figure, sage_tables
from federation.report.vv_table import vv_table

__all__ = ["CellRun", "Collected", "Table1Row", "pareto_front", "mean_std", "collect_runs", "dedupe_cells", "table1",
           "table1_markdown", "figure3", "sage_tables", "sage_figure", "vv_table", "build_report", "write_report",
           "PAPER_ORDER", "DISPLAY", "FAMILY"]

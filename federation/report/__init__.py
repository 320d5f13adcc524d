"""``abps report``: the papers' tables and figures rebuilt from the FINISHED runs of an MLflow experiment.

Sections (each written as Markdown + CSV, figures as PNG, into one folder atomically, and logged as
artifacts of a run named ``report`` with tag ``abps.kind = report`` in the same experiment):

* **ABPS Table 1** (ABPS paper Sec. 6.4): per method label, mean +/- std across seeds of the final
  mean test AUROC across centers, and the bandwidth relative to FedAvg: the mean cumulative model
  bytes of the label divided by FedAvg's in the same experiment (1.00x by definition; Sec. 6.3
  counts each undirected edge once). Without a FedAvg run the runtime's ``rel_bandwidth`` (n x
  full fp32 model x ``reference_rounds``) is shown instead, with a note. Rows are ordered as in
  the paper; labels the paper does not have follow in name order. std is the population std
  across seeds (as ``results.json`` of ``abps train``).
* **ABPS Figure 3**: (a) accuracy ranking (bars, across-seed std, colour by method family, the
  centralized upper bound dashed); (b) AUROC against cumulative bytes (MB, log axis) with the
  Pareto front (min bytes, max AUROC; :func:`pareto_front`) marked. Runs without model traffic
  (local-only, centralized) have no point on the log axis.
* **SAGE Tables I-III and Fig. 3** (SAGE paper Sec. VI), from runs tagged ``benchmark = sage``:
  mean over seeds per (configuration, selector) of global accuracy and macro-F1 (I), client and
  worst-client accuracy (II), budget consumed, stop at the last stage, RG fallback and cost-RG
  rates (III); Fig. 3: (a) accuracy relative to RG per configuration, median marked; (b) the same
  by Dirichlet alpha; (c) budget consumed; (d) model traffic (CommOH).
* **Variance-correction Table I** (Tian et al., Sec. VI-B), from runs tagged ``benchmark = vv``:
  per grid cell and arm, "first" and "most reaching" ticks (mean over the seeds that reached the
  target, with the count) and the plateau delay of eq. (2).

A section without runs is skipped with a note. Only aggregates are read and written: no center
rows, no patient identifiers (the report document is checked for identifier keys).

Modules: :mod:`~federation.report.collect` (reading MLflow), :mod:`~federation.report.common`
(statistics, Markdown / CSV), one module per paper's tables (:mod:`~federation.report.abps_table1`,
:mod:`~federation.report.sage_tables`, :mod:`~federation.report.vv_table`), the clinical and
fairness tables (:mod:`~federation.report.clinical`, beside Table 1) and
:mod:`~federation.report.build` (the document, :func:`write_report`).
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
from federation.report.sage_tables import SAGE_SELECTORS, sage_figure, sage_tables
from federation.report.vv_table import vv_table

__all__ = ["CellRun", "Collected", "Table1Row", "pareto_front", "mean_std", "collect_runs", "dedupe_cells", "table1",
           "table1_markdown", "figure3", "sage_tables", "sage_figure", "vv_table", "build_report", "write_report",
           "PAPER_ORDER", "DISPLAY", "FAMILY", "SAGE_SELECTORS"]

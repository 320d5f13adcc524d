"""`abps report` sections for the clinical figures (federation/core/evaluation.py).

Beside ABPS Table 1: a **clinical table** (per method: worst-10 % and Gini of the per-center
AUROC, the bootstrap interval of its mean, AUPRC, Brier, ECE, median calibration intercept /
slope; means over seeds of each run's final ``clin_*`` MLflow metrics) and a **fairness table**
(per method and subgroup: pooled AUROC, its gap to the overall figure with the bootstrap 95 %
interval of that gap, and the ECE gap, means over the seeds where the group was not suppressed; a suppressed group is said, never shown). Both
read only aggregates the runs logged (final metrics and ``clinical_subgroups.json``).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from federation.report.abps_table1 import DISPLAY
from federation.report.common import csv_text, fmt, md_table, mean_std

#: (MLflow final metric, column header) of the clinical table, in order.
CLINICAL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("clin_auroc_mean", "AUROC mean"),
    ("clin_auroc_worst10", "AUROC worst-10 %"),
    ("clin_auroc_gini", "AUROC Gini"),
    ("clin_auroc_ci_low", "AUROC CI low"),
    ("clin_auroc_ci_high", "AUROC CI high"),
    ("clin_auprc_mean", "AUPRC"),
    ("clin_brier_mean", "Brier"),
    ("clin_ece_mean", "ECE"),
    ("clin_cal_intercept_median", "Cal. intercept (median)"),
    ("clin_cal_slope_median", "Cal. slope (median)"),
)
FILES = ("clinical.md", "clinical.csv", "fairness.md", "fairness.csv")


def _seed_mean(values: Sequence[float]) -> float:
    ok = [v for v in values if v is not None and math.isfinite(v)]
    return mean_std(ok)[0] if ok else math.nan


def clinical_table(client: Any, cells: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per method label: the seed mean of each :data:`CLINICAL_COLUMNS` metric.

    Args:
        cells: de-duplicated runs (:class:`federation.report.collect.CellRun`: label, method, run_id).

    Returns:
        Rows ``{"label", "name", "n_seeds", <metric>: float}``; labels without any ``clin_*``
        metric (runs made before the clinical evaluation existed) are left out.
    """
    by_label: dict[str, list[dict[str, float]]] = {}
    for c in cells:
        m = client.get_run(c.run_id).data.metrics
        if any(k.startswith("clin_") for k in m):
            by_label.setdefault(c.label, []).append(m)
    return [{"label": label, "name": DISPLAY.get(label, label), "n_seeds": len(ms),
             **{k: _seed_mean([m.get(k, math.nan) for m in ms]) for k, _ in CLINICAL_COLUMNS}}
            for label, ms in by_label.items()]


def fairness_table(client: Any, cells: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per (method label, axis, group) from the runs' ``clinical_subgroups.json``.

    Returns:
        Rows ``{"label", "name", "axis", "group", "n_seeds", "suppressed_seeds", "n", "auroc",
        "auroc_gap", "auroc_gap_ci_low", "auroc_gap_ci_high", "ece_gap"}`` (means over the seeds
        where the group was shown; the interval bounds are seed means of each seed's bootstrap
        percentiles).
    """
    acc: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for c in cells:
            try:
                path = client.download_artifacts(c.run_id, "clinical_subgroups.json", tmp)
            except Exception:  # a run from before the clinical evaluation: nothing to show
                continue
            for r in json.loads(Path(path).read_text()).get("subgroups", []):
                acc.setdefault((c.label, r["axis"], r["group"]), []).append(r)
    rows = []
    for (label, axis, group), rs in acc.items():
        shown = [r for r in rs if not r["suppressed"]]
        rows.append({"label": label, "name": DISPLAY.get(label, label), "axis": axis, "group": group,
                     "n_seeds": len(rs), "suppressed_seeds": len(rs) - len(shown),
                     "n": _seed_mean([float(r["n"]) for r in rs]),
                     **{k: _seed_mean([r.get(k) for r in shown]) for k in ("auroc", "auroc_gap")},
                     **{f"auroc_gap_ci_{end}": _seed_mean([(r.get("auroc_gap_ci") or [None, None])[i] for r in shown])
                        for i, end in enumerate(("low", "high"))},
                     "ece_gap": _seed_mean([r.get("ece_gap") for r in shown])})
    return rows


def clinical_sections(client: Any, cells: Sequence[Any], out: Path) -> tuple[str, dict[str, Any]]:
    """Write clinical.md / .csv and fairness.md / .csv into ``out``; return (Markdown, report.json section).

    The Markdown says when no run carries clinical figures and names every suppressed group.
    """
    rows = clinical_table(client, cells)
    if not rows:
        return ("\n## Clinical figures and fairness\n\nNo run of this experiment carries clinical figures "
                "(runs made before they existed); section skipped.\n", {"rows": 0})
    head = ["Method", "Seeds"] + [h for _, h in CLINICAL_COLUMNS]
    md = md_table(head, [[r["name"], r["n_seeds"], *[fmt(r[k]) for k, _ in CLINICAL_COLUMNS]] for r in rows])
    md += ("\nPer-center figures on the test split at the final (or best validation) round, every center; "
           "across-center statistics per seed, then the mean over seeds (docs/metrics.md).\n")
    (out / "clinical.md").write_text(md)
    (out / "clinical.csv").write_text(csv_text(["label", "n_seeds", *[k for k, _ in CLINICAL_COLUMNS]],
                                                [[r["label"], r["n_seeds"], *[r[k] for k, _ in CLINICAL_COLUMNS]]
                                                 for r in rows]))
    fair = fairness_table(client, cells)
    def shown(r: dict[str, Any], text: str) -> str:
        return "suppressed" if r["suppressed_seeds"] == r["n_seeds"] else text

    fmd = md_table(["Method", "Axis", "Group", "n (mean)", "AUROC", "AUROC gap", "AUROC gap 95 % CI", "ECE gap",
                    "Suppressed seeds"],
                   [[r["name"], r["axis"], r["group"], fmt(r["n"], 0), shown(r, fmt(r["auroc"])),
                     shown(r, fmt(r["auroc_gap"])),
                     shown(r, f"[{fmt(r['auroc_gap_ci_low'])}, {fmt(r['auroc_gap_ci_high'])}]"),
                     shown(r, fmt(r["ece_gap"])), f"{r['suppressed_seeds']} of {r['n_seeds']}"] for r in fair])
    hidden = sorted({f"{r['axis']}={r['group']}" for r in fair if r["suppressed_seeds"]})
    fmd += ("\nSubgroups pooled over centers; gap = group - overall; the interval is the percentile bootstrap "
            "of the gap (patients resampled within center; bounds averaged over seeds). A group with fewer than 30 test rows or "
            "fewer than 5 of either class is suppressed in that seed"
            + (f" (suppressed at least once: {', '.join(hidden)})." if hidden else "; none was.") + "\n")
    (out / "fairness.md").write_text(fmd)
    (out / "fairness.csv").write_text(csv_text(list(fair[0]) if fair else ["label"],
                                                [list(r.values()) for r in fair]))
    doc = {"rows": rows, "fairness": fair, "suppressed": hidden}
    return "\n## Clinical figures\n\n" + md + "\n## Fairness (subgroups)\n\n" + fmd, doc

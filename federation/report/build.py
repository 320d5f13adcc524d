"""The report document: every section into one folder (atomically), logged as a ``report`` run."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from etl.errors import InputError
from etl.io import atomic_output_dir
from federation.report.abps_table1 import BANDWIDTH_NOTE, DISPLAY, figure3, table1, table1_markdown
from federation.report.clinical import FILES as CLINICAL_FILES
from federation.report.clinical import clinical_sections
from federation.report.collect import collect_runs
from federation.report.common import csv_text
from federation.report.cross import FILES as CROSS_FILES
from federation.report.cross import cross_section
from federation.report.isolation import isolation_section
from federation.report.privacy_drift import FILES as PRIVACY_DRIFT_FILES
from federation.report.privacy_drift import privacy_drift_sections
from federation.report.realworld import FILES as REALWORLD_FILES
from federation.report.realworld import realworld_section
from federation.report.sage_tables import sage_figure, sage_markdown, sage_tables
from federation.report.targets import FILES as TARGET_FILES
from federation.report.targets import targets_section
from federation.report.vv_table import vv_table
from federation.run.tracking import KIND_REPORT, KIND_TAG, Tracker, check_no_identifiers, finite

__all__ = ["build_report", "write_report"]


def build_report(tracker: Tracker, experiment: str, out: Path) -> dict[str, Any]:
    """Write every section into the folder ``out`` (already created); returns the report document."""
    client = tracker.client
    col = collect_runs(tracker)
    # one list of notes: report.md's Notes section and report.json's "notes" (sections add theirs)
    doc: dict[str, Any] = {"experiment": experiment, "sections": {}, "notes": col.notes}
    parts = [f"# Report: experiment `{experiment}`\n"]
    if col.cells:
        rows = table1(col.cells)
        md = table1_markdown(rows)
        (out / "table1.md").write_text(md)
        fields = list(asdict(rows[0]))
        (out / "table1.csv").write_text(csv_text(fields, [[getattr(r, f) for f in fields] for r in rows]))
        front = figure3(rows, out / "fig3.png")
        doc["sections"]["table1"] = {"rows": [asdict(r) for r in rows], "bandwidth": BANDWIDTH_NOTE,
                                     "pareto_front": front}
        parts += ["## ABPS Table 1\n", md, "\n## ABPS Figure 3\n",
                  "![Figure 3](fig3.png)\n\nPareto front (bytes vs AUROC): "
                  + (", ".join(DISPLAY.get(x, x) for x in front) or "none") + "\n"]
        clinical_md, doc["sections"]["clinical"] = clinical_sections(client, col.cells, out)
        parts.append(clinical_md)
        iso_md, doc["sections"]["isolation"] = isolation_section(col.cells)  # per-seed isolation
        parts.append(iso_md)
        parts.append(targets_section(client, col.cells, out, doc))  # bytes to target
        parts.append(privacy_drift_sections(client, col.cells, out, doc["sections"]))
    else:
        parts.append("## ABPS Table 1\n\nNo finished clinical runs in this experiment; section skipped.\n")
    parts.append(realworld_section(client, col.cells, out, doc))  # AUROC vs virtual time
    if col.sage:
        t = sage_tables(client, col.sage)
        col.notes.extend(t["notes"])
        parts.append("\n## SAGE Tables I-III\n")
        for fname, title, metrics, pct in (
                ("sage_table1", "SAGE Table I: global accuracy / macro-F1", ("global_acc", "macro_f1"), False),
                ("sage_table2", "SAGE Table II: client / worst-client accuracy", ("client_acc", "worst_client_acc"),
                 False),
                ("sage_table3", "SAGE Table III: budget consumed / stop at last stage / RG fallback / cost-RG",
                 ("budget_consumed", "stop_last", "rg_fallback_rate", "cost_rg_rate"), True)):
            md, csv_body = sage_markdown(t, title, metrics, pct)
            (out / f"{fname}.md").write_text(md)
            (out / f"{fname}.csv").write_text(csv_body)
            parts.append(md + "\n")
        sage_figure(t, out / "sage_fig3.png")
        parts.append("![SAGE Fig. 3](sage_fig3.png)\n")
        doc["sections"]["sage"] = {"configs": t["configs"], "selectors": t["selectors"], "runs": len(col.sage)}
    else:
        parts.append("\n## SAGE Tables I-III\n\nNo finished SAGE runs (tag benchmark=sage); section skipped.\n")
    if col.vv:
        md, csv_body = vv_table(col.vv)
        (out / "vv_table1.md").write_text(md)
        (out / "vv_table1.csv").write_text(csv_body)
        parts += ["\n## Variance-correction Table I\n", md]
        doc["sections"]["vv"] = {"runs": len(col.vv)}
    else:
        parts.append("\n## Variance-correction Table I\n\nNo finished variance-correction runs (tag benchmark=vv); "
                     "section skipped.\n")
    parts.append(cross_section(tracker, out, doc["sections"]))  # the cross table
    if col.notes:
        parts.append("\n## Notes\n\n" + "".join(f"* {n}\n" for n in col.notes))
    check_no_identifiers(doc)
    (out / "report.md").write_text("\n".join(parts))
    (out / "report.json").write_text(json.dumps(finite(doc), indent=2, allow_nan=False, default=str) + "\n")
    return doc


def write_report(experiment: str, out_dir: str | Path, tracking_uri: str | None = None,
                 log_to_mlflow: bool = True, force: bool = False) -> dict[str, Any]:
    """Build the report of ``experiment`` into ``out_dir`` (atomically) and log it to a ``report`` run.

    An earlier report of the same experiment in ``out_dir`` is brought up to date; report files of
    another experiment, or ones no report wrote, are replaced only with ``force``
    (:func:`check_report_folder`).

    Raises:
        InputError: the experiment does not exist in the store, or ``out_dir`` holds report files
            of another experiment (or of no report) and ``force`` is False.
    """
    check_report_folder(Path(out_dir), experiment, force)
    tracker = Tracker(tracking_uri, experiment, create=False)

    def build() -> dict[str, Any]:
        with atomic_output_dir(out_dir) as tmp:
            doc = build_report(tracker, experiment, Path(tmp))
            # files of sections this report does not have (left by an earlier report in the same
            # folder) are removed, so a folder never mixes two experiments' tables
            stale = _ALL_REPORT_FILES - {p.name for p in Path(tmp).iterdir()}
            for name in stale:
                (Path(out_dir) / name).unlink(missing_ok=True)
        return doc

    if not log_to_mlflow:
        return build()
    # the report run starts first: a store that refuses writes fails before any report file is written
    with tracker.run("report", tags={KIND_TAG: KIND_REPORT}) as rid:
        doc = build()
        for p in sorted(Path(out_dir).iterdir()):
            if p.is_file() and p.name in _written(doc, Path(out_dir)):
                tracker.log_file(p)
    doc["report_run_id"] = rid
    return doc


def check_report_folder(out: Path, experiment: str, force: bool) -> None:
    """Refuse, unless ``force``, a report folder ``out`` whose files the new report would replace
    and that are not an earlier report of ``experiment``: its ``report.json`` names another
    experiment, or report-named files (``report.md``, ``table1.csv`` ...) lie there without a
    ``report.json`` that a report wrote.

    Raises:
        InputError: one line naming ``--out``, the folder and what it holds.
    """
    if force or not out.is_dir():
        return
    held = sorted(p.name for p in out.iterdir() if p.name in _ALL_REPORT_FILES)
    if not held:
        return
    try:
        earlier = json.loads((out / "report.json").read_text(encoding="utf-8"))
        owner = earlier["experiment"] if isinstance(earlier, dict) and "sections" in earlier else None
    except (OSError, ValueError, KeyError):
        owner = None
    if owner == experiment:
        return
    what = (f"the report of experiment {owner!r}" if isinstance(owner, str)
            else f"{', '.join(held[:3])}{' ...' if len(held) > 3 else ''}, which no abps report wrote")
    raise InputError(f"--out {out}: holds {what}; give --force to replace it, or another --out")


_ALL_REPORT_FILES = frozenset(
    {"report.md", "report.json", "table1.md", "table1.csv", "fig3.png", "sage_fig3.png", "vv_table1.md",
     "vv_table1.csv", *CLINICAL_FILES, *CROSS_FILES, *REALWORLD_FILES, *TARGET_FILES, *PRIVACY_DRIFT_FILES}
    | {f"sage_table{i}.{e}" for i in (1, 2, 3) for e in ("md", "csv")})


def _written(doc: dict[str, Any], out: Path) -> set[str]:
    names = {"report.md", "report.json"}
    if "table1" in doc["sections"]:
        names |= {"table1.md", "table1.csv", "fig3.png"}
    if doc["sections"].get("clinical", {}).get("rows"):
        names |= set(CLINICAL_FILES)
    if "sage" in doc["sections"]:
        names |= {f"sage_table{i}.{e}" for i in (1, 2, 3) for e in ("md", "csv")} | {"sage_fig3.png"}
    if "cross" in doc["sections"]:
        names |= set(CROSS_FILES)
    if "vv" in doc["sections"]:
        names |= {"vv_table1.md", "vv_table1.csv"}
    if "realworld" in doc["sections"]:
        names |= set(REALWORLD_FILES)
    if "bytes_to_target" in doc["sections"]:
        names |= set(TARGET_FILES)
    names |= set(PRIVACY_DRIFT_FILES)  # those its sections wrote (existing files only, below)
    return {n for n in names if (out / n).is_file()}

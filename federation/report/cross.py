"""The cross table: rows = selectors, columns = data sets, cells = the data set's metric and
the ledger's bandwidth, from the runs of a cross sweep (``abps sweep --config configs/cross.yaml``,
:func:`federation.sweep.cross.run_cross_sweep`).

Each data set is one sweep whose parent run carries the tags ``abps.dataset`` (the column label) and
``abps.metric`` (``auroc`` on a clinical cohort, ``accuracy`` on an image federation); its cells are the
FINISHED cell runs with the parent's cohort id. A cell of the table: the across-seed mean (and std) of the
final test metric (mean over centers), the relative bandwidth (cumulative model bytes / FedAvg's 50-round
bytes on that data set, :class:`federation.core.ledger.Ledger`) and the total bytes (model + probe +
metadata) in MB. Only aggregates: no center or row identifier.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from federation.report.common import csv_text, fmt, md_table, mean_std
from federation.run.tracking import COHORT_TAG, KIND_CELL, KIND_SWEEP, KIND_TAG, LABEL_TAG, SEED_TAG, Tracker

__all__ = ["FILES", "cross_rows", "cross_markdown", "cross_section"]

#: files this section writes
FILES = ("cross_table.md", "cross_table.csv")


def _datasets(tracker: Tracker) -> list[dict[str, Any]]:
    """The data sets of the experiment's cross sweeps, in the order they were first run:
    ``{"label", "metric", "cohort", "labels" (row labels in sweep order)}``; the latest parent wins
    per label."""
    from federation.sweep.cross import DATASET_TAG, METRIC_TAG

    found: dict[str, dict[str, Any]] = {}
    for r in sorted(tracker.search(f"tags.`{KIND_TAG}` = '{KIND_SWEEP}'"), key=lambda r: r.info.start_time):
        label = r.data.tags.get(DATASET_TAG)
        if not label:
            continue
        first = found.get(label, {}).get("order", r.info.start_time)
        found[label] = {"label": label, "metric": r.data.tags.get(METRIC_TAG, "auroc"), "order": first,
                        "cohort": r.data.tags.get(COHORT_TAG), "labels": str(r.data.params.get("labels", "")).split()}
    return sorted(found.values(), key=lambda d: d["order"])


def cross_rows(tracker: Tracker) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(data sets, rows): one row per selector label with, per data set label, ``{"metric": (mean,
    std), "rel_bandwidth": mean, "total_mb": mean, "seeds": n}`` (absent where the selector has no
    FINISHED run on that data set). Per (data set, label, seed) the latest run counts."""
    sets = _datasets(tracker)
    runs = tracker.search(f"tags.`{KIND_TAG}` = '{KIND_CELL}' and attributes.status = 'FINISHED'")
    order: list[str] = []
    for d in sets:
        order += [x for x in d["labels"] if x not in order]
    cells: dict[tuple[str, str], dict[int, Any]] = {}
    by_cohort = {d["cohort"]: d["label"] for d in sets}
    for r in sorted(runs, key=lambda r: r.info.start_time):
        ds = by_cohort.get(r.data.tags.get(COHORT_TAG))
        label, m = r.data.tags.get(LABEL_TAG), r.data.metrics
        if ds is None or label is None or "final_auroc_mean" not in m:
            continue
        cells.setdefault((label, ds), {})[int(r.data.tags.get(SEED_TAG, 0))] = m
        if label not in order:
            order.append(label)
    rows = []
    for label in order:
        row: dict[str, Any] = {"selector": label}
        for d in sets:
            seeds = cells.get((label, d["label"]))
            if not seeds:
                continue
            ms = list(seeds.values())
            row[d["label"]] = {
                "metric": mean_std([x["final_auroc_mean"] for x in ms]),
                "rel_bandwidth": mean_std([x.get("rel_bandwidth", math.nan) for x in ms])[0],
                "total_mb": mean_std([x.get("total_bytes", math.nan) / 1e6 for x in ms])[0],
                "seeds": len(ms),
            }
        rows.append(row)
    return sets, rows


def cross_markdown(sets: list[dict[str, Any]], rows: list[dict[str, Any]]) -> tuple[str, str]:
    """(Markdown table, CSV text) of :func:`cross_rows`: per data set a metric column (mean +/- std
    over seeds) and a bandwidth column (relative bandwidth, total MB)."""
    headers = ["selector"]
    for d in sets:
        headers += [f"{d['label']} {d['metric'].upper() if d['metric'] == 'auroc' else d['metric']}",
                    f"{d['label']} bandwidth (rel. / total MB)"]
    body, flat = [], []
    for row in rows:
        line = [row["selector"]]
        for d in sets:
            c = row.get(d["label"])
            if c is None:
                line += ["n/a", "n/a"]
                continue
            mu, sd = c["metric"]
            line += [f"{fmt(mu)} ± {fmt(sd)} (n={c['seeds']})", f"{fmt(c['rel_bandwidth'])} / {fmt(c['total_mb'], 1)}"]
            flat.append([row["selector"], d["label"], d["metric"], mu, sd, c["seeds"], c["rel_bandwidth"], c["total_mb"]])
        body.append(line)
    csv_body = csv_text(["selector", "dataset", "metric", "mean", "std", "seeds", "rel_bandwidth", "total_mb"], flat)
    return md_table(headers, body), csv_body


def cross_section(tracker: Tracker, out: Path, sections: dict[str, Any]) -> str:
    """Write ``cross_table.md`` / ``.csv`` into ``out`` and set ``sections["cross"]`` (the report.json
    entry) when the experiment holds cross-sweep runs; returns the Markdown section of report.md."""
    sets, rows = cross_rows(tracker)
    if not sets or not rows:
        return ("\n## Cross table\n\nNo cross-sweep runs (`abps sweep --config configs/cross.yaml`); "
                "section skipped.\n")
    md, csv_body = cross_markdown(sets, rows)
    (out / "cross_table.md").write_text(md)
    (out / "cross_table.csv").write_text(csv_body)
    note = ("Metric: final-round test AUROC (clinical cohorts) or client accuracy on each client's local "
            "evaluation split (image federation), mean over centers, mean ± std over seeds; bandwidth: "
            "cumulative model bytes / FedAvg's 50-round bytes on the same data set, and total bytes "
            "(model + probe + metadata) in MB, one ledger for every method.\n")
    sections["cross"] = {"datasets": [{k: d[k] for k in ("label", "metric")} for d in sets], "rows": rows}
    return "\n## Cross table\n\n" + md + "\n" + note

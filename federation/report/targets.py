"""``abps report`` section "bytes to target" (ABPS paper Sec. 7): per method label and target, the
mean first round and bytes at which the seeds' mean validation AUROC reaches it, with the ratio to
FedAvg's. Details: docs/ledger.md, "Module notes".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from federation.core.config import TargetsConfig
from federation.core.targets import reach_all, relative_targets
from federation.report.abps_table1 import DISPLAY, _order_key
from federation.report.collect import CellRun
from federation.report.common import csv_text, fmt, md_table, mean_std

__all__ = ["FILES", "fedavg_level", "run_curve", "target_rows", "targets_section"]

FILES = ("bytes_to_target.md", "bytes_to_target.csv")
_KEYS = ("val_auroc_mean", "cum_bytes", "cum_probe_bytes", "cum_metadata_bytes")
_COLS = ("label", "name", "target", "placement", "n_seeds", "n_reached", "round_mean", "bytes_mean", "x_fedavg")


def run_curve(client: Any, run_id: str) -> dict[str, list[float]]:
    """The run's bytes-to-target curve (:func:`federation.core.targets.curve_of`'s form) from its
    per-round MLflow metrics; rounds that lack the AUROC or the model bytes are left out."""
    h = {k: {int(m.step): float(m.value) for m in client.get_metric_history(run_id, k)} for k in _KEYS}
    steps = sorted(set(h["val_auroc_mean"]) & set(h["cum_bytes"]))
    return {"round": steps, "val_auroc_mean": [h["val_auroc_mean"][s] for s in steps],
            "cum_total_bytes": [h["cum_bytes"][s] + h["cum_probe_bytes"].get(s, 0.0)
                                + h["cum_metadata_bytes"].get(s, 0.0) for s in steps]}


def fedavg_level(cells: Sequence[CellRun]) -> tuple[str | None, float]:
    """``(label, level)``: the FedAvg label (method ``fedavg``) with the highest seed-mean final
    validation AUROC, and that mean; ``(None, nan)`` when the experiment has no such run."""
    by_label: dict[str, list[float]] = {}
    for c in cells:
        if c.method == "fedavg":
            by_label.setdefault(c.label, []).append(c.final_val_auroc)
    levels = {lab: mean_std(v)[0] for lab, v in by_label.items()}
    levels = {lab: v for lab, v in levels.items() if math.isfinite(v)}
    if not levels:
        return None, math.nan
    best = max(sorted(levels), key=lambda lab: levels[lab])
    return best, levels[best]


def _targets(cells: Sequence[CellRun], level: float) -> list[tuple[float, str]]:
    """``[(target, placement)]``: the runs' offsets below ``level`` (when defined) and their
    absolute targets, by increasing target; runs that logged no setting count as the default."""
    default = TargetsConfig()
    below = sorted({d for c in cells for d in c.targets.get("below_fedavg", default.below_fedavg)}, reverse=True)
    absolute = sorted({t for c in cells for t in c.targets.get("auroc", default.auroc)})
    out = [(t, f"FedAvg − {d:.3f}") for t, d in zip(relative_targets(level, below), below)] \
        if math.isfinite(level) else []
    out += [(t, "absolute") for t in absolute]
    return sorted(out)


def target_rows(cells: Sequence[CellRun], curves: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """The section's content.

    Args:
        cells: de-duplicated runs (:class:`federation.report.collect.CellRun`).
        curves: run_id -> :func:`run_curve`.

    Returns:
        ``{"fedavg_label", "fedavg_level", "targets": [[t, placement]], "rows": [...]}``; one row
        per (label, target) with the keys ``_COLS`` (``round_mean`` / ``bytes_mean`` over the seeds
        that reached the target, NaN when none did; ``x_fedavg`` NaN when either side did not).
    """
    ref, level = fedavg_level(cells)
    targets = _targets(cells, level)
    groups: dict[str, list[CellRun]] = {}
    for c in cells:
        if c.run_id in curves:
            groups.setdefault(c.label, []).append(c)
    stats: dict[tuple[str, float], tuple[int, float, float]] = {}
    for label, runs in groups.items():
        reached = [reach_all(curves[c.run_id], [t for t, _ in targets]) for c in runs]
        for j, (t, _) in enumerate(targets):
            hit = [r[j] for r in reached if r[j]["round"] is not None]
            stats[(label, t)] = (len(hit), mean_std([h["round"] for h in hit])[0],
                                 mean_std([h["bytes"] for h in hit])[0])
    rows = []
    for label in sorted(groups, key=lambda lab: _order_key(lab, groups[lab][0].method)):
        for t, placement in targets:
            k, r_mean, b_mean = stats[(label, t)]
            ref_bytes = stats[(ref, t)][2] if ref in groups else math.nan
            ratio = b_mean / ref_bytes if math.isfinite(b_mean) and math.isfinite(ref_bytes) and ref_bytes > 0 \
                else math.nan
            rows.append({"label": label, "name": DISPLAY.get(label, label), "target": t, "placement": placement,
                         "n_seeds": len(groups[label]), "n_reached": k, "round_mean": r_mean, "bytes_mean": b_mean,
                         "x_fedavg": ratio})
    return {"fedavg_label": ref, "fedavg_level": level, "targets": [[t, p] for t, p in targets], "rows": rows}


def _bytes(b: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def _cell(r: dict[str, Any]) -> str:
    """``round 12 · 3.41 MB · 0.21×`` (``, 2/3 seeds`` when not every seed reached it), or
    ``not reached``."""
    if not r["n_reached"]:
        return f"not reached (0/{r['n_seeds']} seeds)"
    text = f"round {fmt(r['round_mean'], 1)} · {_bytes(r['bytes_mean'])}"
    if math.isfinite(r["x_fedavg"]):
        text += f" · {fmt(r['x_fedavg'], 2)}×"
    if r["n_reached"] < r["n_seeds"]:
        text += f" ({r['n_reached']}/{r['n_seeds']} seeds)"
    return text


def targets_markdown(sec: dict[str, Any]) -> str:
    """One row per label, one column per target (:func:`_cell`)."""
    heads = ["Method", "Seeds"] + [f"{fmt(t)} ({p})" for t, p in sec["targets"]]
    by_label: dict[str, list[dict[str, Any]]] = {}
    for r in sec["rows"]:
        by_label.setdefault(r["label"], []).append(r)
    return md_table(heads, [[rs[0]["name"], rs[0]["n_seeds"], *(_cell(r) for r in rs)] for rs in by_label.values()])


def targets_section(client: Any, cells: Sequence[CellRun], out: Path, doc: dict[str, Any]) -> str:
    """Write ``bytes_to_target.md`` / ``.csv`` into ``out`` (when there are targets and curves), record
    ``doc["sections"]["bytes_to_target"]``; returns the report's Markdown."""
    head = "\n## Bytes to target\n\n"
    curves = {c.run_id: run_curve(client, c.run_id) for c in cells}
    curves = {k: v for k, v in curves.items() if v["round"]}
    sec = target_rows(cells, curves)
    if not sec["targets"] or not sec["rows"]:
        why = ("no FedAvg run to place the targets below and no absolute targets.auroc"
               if curves else "no run logged per-round validation AUROC and bytes")
        return head + f"No bytes-to-target table: {why}.\n"
    md = targets_markdown(sec)
    (out / "bytes_to_target.md").write_text(md)
    (out / "bytes_to_target.csv").write_text(csv_text(_COLS, [[r[c] for c in _COLS] for r in sec["rows"]]))
    doc["sections"]["bytes_to_target"] = sec
    level = (f"FedAvg level: {fmt(sec['fedavg_level'])} (seed-mean final validation AUROC of "
             f"{DISPLAY.get(sec['fedavg_label'], sec['fedavg_label'])}). " if sec["fedavg_label"] else "")
    return (head + level + "Each cell: mean first round and mean cumulative bytes (model + probe + metadata) at "
            "which a seed's mean validation AUROC reaches the target, over the seeds that reached it; × = bytes "
            "relative to FedAvg's.\n\n" + md)

"""``abps report`` section for real-world federation conditions: per method label the AUROC against
virtual time, from the runs that logged a virtual clock. Details: docs/realworld.md, "Module notes".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from federation.report.abps_table1 import DISPLAY
from federation.report.common import csv_text, fmt, md_table, mean_std

__all__ = ["FILES", "realworld_rows", "realworld_section"]

FILES = ("realworld.md", "realworld.csv", "realworld_time.png")
_KEYS = ("virtual_hours", "test_auroc_mean", "round_seconds", "available_share", "dropped_updates")
_COLS = ("label", "name", "n_seeds", "auroc_mean", "auroc_std", "virtual_hours", "seconds_per_round",
         "available_share", "dropped_per_round", "hours_to_95pct")


def _history(client: Any, run_id: str) -> dict[str, dict[int, float]]:
    """``{metric: {step: value}}`` of the per-round metrics :data:`_KEYS` of one run."""
    return {k: {int(m.step): float(m.value) for m in client.get_metric_history(run_id, k)} for k in _KEYS}


def _hours_to(hours: Sequence[float], auroc: Sequence[float], frac: float = 0.95) -> float:
    """First virtual hour at which ``auroc`` reaches ``first + frac (last - first)``; NaN if never."""
    ok = [(h, a) for h, a in zip(hours, auroc) if math.isfinite(a)]
    if len(ok) < 2:
        return math.nan
    target = ok[0][1] + frac * (ok[-1][1] - ok[0][1])
    return next((h for h, a in ok if a >= target), math.nan)


def realworld_rows(client: Any, cells: Sequence[Any]) -> tuple[list[dict[str, Any]], dict[str, list[dict]]]:
    """Rows of the table and the per-seed curves, for the cells that logged ``virtual_hours``.

    Args:
        client: an ``mlflow.MlflowClient``.
        cells: de-duplicated runs (:class:`federation.report.collect.CellRun`).

    Returns:
        ``(rows, curves)``: one row per label (keys :data:`_COLS`); ``curves[label]`` one
        ``{"seed", "round", "hours", "auroc"}`` per run (lists by round).
    """
    curves: dict[str, list[dict]] = {}
    extra: dict[str, list[dict[str, float]]] = {}
    for c in cells:
        h = _history(client, c.run_id)
        if not h["virtual_hours"]:
            continue
        steps = sorted(set(h["virtual_hours"]) & set(h["test_auroc_mean"]))
        curves.setdefault(c.label, []).append({
            "seed": c.seed, "round": steps, "hours": [h["virtual_hours"][s] for s in steps],
            "auroc": [h["test_auroc_mean"][s] for s in steps]})
        per_round = lambda k: mean_std(list(h[k].values()))[0]  # noqa: E731
        extra.setdefault(c.label, []).append({
            "auroc": c.final_auroc_mean, "hours": h["virtual_hours"][steps[-1]] if steps else math.nan,
            "spr": per_round("round_seconds"), "avail": per_round("available_share"),
            "drop": per_round("dropped_updates")})
    rows = []
    for label, runs in curves.items():
        ex = extra[label]
        mean_curve = _seed_mean_curve(runs)
        a_mean, a_std = mean_std([e["auroc"] for e in ex])
        rows.append({"label": label, "name": DISPLAY.get(label, label), "n_seeds": len(runs),
                     "auroc_mean": a_mean, "auroc_std": a_std,
                     "virtual_hours": mean_std([e["hours"] for e in ex])[0],
                     "seconds_per_round": mean_std([e["spr"] for e in ex])[0],
                     "available_share": mean_std([e["avail"] for e in ex])[0],
                     "dropped_per_round": mean_std([e["drop"] for e in ex])[0],
                     "hours_to_95pct": _hours_to(*mean_curve)})
    return rows, curves


def _seed_mean_curve(runs: Sequence[dict]) -> tuple[list[float], list[float]]:
    """(hours, AUROC) averaged over seeds per round, over the rounds every seed ran."""
    common = sorted(set.intersection(*(set(r["round"]) for r in runs)))
    pick = [{s: (h, a) for s, h, a in zip(r["round"], r["hours"], r["auroc"])} for r in runs]
    hours = [mean_std([p[s][0] for p in pick])[0] for s in common]
    auroc = [mean_std([p[s][1] for p in pick])[0] for s in common]
    return hours, auroc


def _figure(curves: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(13, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, runs) in enumerate(sorted(curves.items())):
        col = colours[i % len(colours)]
        for j, r in enumerate(runs):
            name = DISPLAY.get(label, label) if j == 0 else None
            ax_t.plot(r["hours"], r["auroc"], color=col, lw=1.2, alpha=0.8, label=name)
            ax_r.plot(r["round"], r["auroc"], color=col, lw=1.2, alpha=0.8, label=name)
    ax_t.set_xlabel("Virtual time (hours)")
    ax_t.set_title("(a) AUROC vs virtual time")
    ax_r.set_xlabel("Round")
    ax_r.set_title("(b) AUROC vs rounds")
    for ax in (ax_t, ax_r):
        ax.set_ylabel("Mean test AUROC across centers")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def realworld_section(client: Any, cells: Sequence[Any], out: Path, doc: dict[str, Any]) -> str:
    """Write ``realworld.md``, ``realworld.csv`` and ``realworld_time.png`` into ``out`` (when some run
    logged a virtual clock), record ``doc["sections"]["realworld"]``; returns the report's Markdown."""
    rows, curves = realworld_rows(client, cells) if cells else ([], {})
    if not rows:
        return ("\n## Real-world conditions\n\nNo run logged a virtual clock (runs with a `realworld:` "
                "block, e.g. configs/realworld-links.yaml); section skipped.\n")
    heads = ("Method", "Seeds", "AUROC", "Virtual hours", "s / round", "Available share", "Dropped / round",
             "Hours to 95 %")
    md = md_table(heads, [[r["name"], r["n_seeds"], f"{fmt(r['auroc_mean'])} ± {fmt(r['auroc_std'])}",
                           fmt(r["virtual_hours"], 4), fmt(r["seconds_per_round"], 2), fmt(r["available_share"], 2),
                           fmt(r["dropped_per_round"], 2), fmt(r["hours_to_95pct"], 4)] for r in rows])
    (out / "realworld.md").write_text(md)
    (out / "realworld.csv").write_text(csv_text(_COLS, [[r[c] for c in _COLS] for r in rows]))
    _figure(curves, out / "realworld_time.png")
    doc["sections"]["realworld"] = {"rows": rows}
    return ("\n## Real-world conditions: AUROC vs virtual time\n\n" + md
            + "\n![AUROC vs virtual time](realworld_time.png)\n")

"""``abps report`` sections: the privacy-utility study of the DP metadata release and the drift study
of the Welch-t drift windows (ABPS paper Sec. 7), from what the runs logged. Tables and figure:
docs/privacy.md, "Module notes".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from federation.report.common import csv_text, fmt, md_table, mean_std

__all__ = ["FILES", "privacy_rows", "drift_rows", "privacy_drift_figure", "privacy_drift_sections"]

FILES = ("privacy.md", "privacy.csv", "drift.md", "drift.csv", "privacy_drift.png")
GOALS = ("homogeneity", "diversity", "alignment")
#: (final metric, column) of the privacy table
PRIVACY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("rest_share_mean", "isolation"), ("partners_mean", "E|P|"), ("final_auroc_mean", "AUROC"),
    ("candidate_kept_share", "exact candidate pairs kept"), ("candidate_jaccard", "Jaccard"),
    ("dp_epsilon_spent", "epsilon spent"))
#: per-round metrics drawn in the drift panels
DRIFT_CURVES = (("flipped_mixed_share", "share of partnerships with one flipped end"),
                ("flipped_accept_share", "share of (healthy, flipped) pairs with UCB >= tau_acc"))


def _epsilon(params: dict[str, str]) -> float:
    v = str(params.get("params.metadata_dp_epsilon", "none")).lower()
    return math.inf if v in ("none", "", "null", "inf") else float(v)


def _runs(client: Any, cells: Sequence[Any]) -> list[tuple[Any, Any]]:
    return [(c, client.get_run(c.run_id)) for c in cells]


def _eps_text(e: float) -> str:
    return "inf (off)" if math.isinf(e) else f"{e:g}"


def privacy_rows(client: Any, cells: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per (goal, epsilon): seed means of :data:`PRIVACY_COLUMNS`.

    Args:
        cells: de-duplicated runs (:class:`federation.report.collect.CellRun`).
    Returns:
        Rows ``{"goal", "epsilon", "n_seeds", <metric>: mean, <metric>_std: std}`` sorted by goal
        order and epsilon; empty when no run of the experiment sets a finite epsilon.
    """
    runs = [(c, r) for c, r in _runs(client, cells)
            if str(r.data.params.get("params.goal", "none")).lower() in GOALS]
    if not any(math.isfinite(_epsilon(r.data.params)) for _, r in runs):
        return []
    groups: dict[tuple[str, float], list[dict[str, float]]] = {}
    for _, r in runs:
        m = dict(r.data.metrics)
        eps = _epsilon(r.data.params)
        if math.isinf(eps) and "dp_epsilon_spent" not in m:
            m["dp_epsilon_spent"] = math.inf  # exact release: not private (logged as no metric)
        groups.setdefault((r.data.params["params.goal"].lower(), eps), []).append(m)
    rows = []
    for (goal, eps), ms in sorted(groups.items(), key=lambda kv: (GOALS.index(kv[0][0]), kv[0][1])):
        row: dict[str, Any] = {"goal": goal, "epsilon": eps, "n_seeds": len(ms)}
        for key, _ in PRIVACY_COLUMNS:
            vals = [m.get(key, math.nan) for m in ms]
            if key == "dp_epsilon_spent" and all(math.isinf(v) for v in vals):
                row[key], row[key + "_std"] = math.inf, math.nan
            else:
                row[key], row[key + "_std"] = mean_std(vals)
        rows.append(row)
    return rows


def drift_rows(client: Any, cells: Sequence[Any]) -> tuple[list[dict[str, Any]], dict[str, dict[str, list[float]]]]:
    """One row per label among the runs with a ``drift:`` block, and the seed-mean curves.

    Returns:
        ``(rows, curves)``: rows ``{"label", "n_seeds", "flip_round", "stopped" (seeds),
        "rounds_to_stop" (mean over the seeds that stopped), "mixed_share_pre", "mixed_share_post",
        "detected" (seeds with a detection), "detection_delay" (mean over those), "false_alarm_rate",
        "final_auroc_mean", "rounds"}``; curves ``{label: {metric: per-round seed mean}}`` for
        :data:`DRIFT_CURVES`.
    """
    by_label: dict[str, list[Any]] = {}
    for c, r in _runs(client, cells):
        if str(r.data.params.get("drift.round", "none")).lower() not in ("none", ""):
            by_label.setdefault(c.label, []).append(r)
    rows, curves = [], {}
    for label, rs in by_label.items():
        ms = [r.data.metrics for r in rs]
        stops = [m["rounds_to_stop_partnering"] for m in ms if "rounds_to_stop_partnering" in m]
        delays = [m["detection_delay"] for m in ms if "detection_delay" in m]
        windows = any(str(r.data.params.get("params.drift_window", "0")) not in ("0", "none") for r in rs)
        rows.append({
            "label": label, "n_seeds": len(rs),
            "flip_round": int(float(rs[0].data.params["drift.round"])),
            "rounds": mean_std([m.get("rounds_run", math.nan) for m in ms])[0],
            "stopped": len(stops), "rounds_to_stop": mean_std(stops)[0],
            "mixed_share_pre": mean_std([m.get("mixed_share_pre", math.nan) for m in ms])[0],
            "mixed_share_post": mean_std([m.get("mixed_share_post", math.nan) for m in ms])[0],
            "windows": windows, "detected": len(delays), "detection_delay": mean_std(delays)[0],
            "false_alarm_rate": mean_std([m.get("false_alarm_rate", math.nan) for m in ms])[0],
            "final_auroc_mean": mean_std([m.get("final_auroc_mean", math.nan) for m in ms])[0],
        })
        curves[label] = {}
        for key, _ in DRIFT_CURVES:
            per_round: dict[int, list[float]] = {}
            for r in rs:
                for h in client.get_metric_history(r.info.run_id, key):
                    per_round.setdefault(int(h.step), []).append(float(h.value))
            curves[label][key] = [mean_std(per_round[s])[0] for s in sorted(per_round)]
    return rows, curves


def privacy_drift_figure(priv: list[dict[str, Any]], curves: dict[str, dict[str, list[float]]], flip_round: int,
                         path: Path) -> None:
    """Privacy panels (AUROC, isolation, exact candidate pairs kept against epsilon, one line per
    goal) and drift panels (:data:`DRIFT_CURVES` per round, one line per row label)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (3 if priv else 0) + (len(DRIFT_CURVES) if curves else 0)
    fig, axes = plt.subplots(1, panels, figsize=(4.6 * panels, 3.8), squeeze=False)
    ax = list(axes[0])
    if priv:
        eps = sorted({r["epsilon"] for r in priv})
        xs = list(range(len(eps)))
        for a, (key, title) in zip(ax[:3], (("final_auroc_mean", "final test AUROC"),
                                            ("rest_share_mean", "isolation"),
                                            ("candidate_kept_share", "exact candidate pairs kept"))):
            for goal in GOALS:
                by_eps = {r["epsilon"]: r[key] for r in priv if r["goal"] == goal}
                if by_eps:
                    a.plot(xs, [by_eps.get(e, math.nan) for e in eps], marker="o", label=goal)
            a.set_xticks(xs, ["inf" if math.isinf(e) else f"{e:g}" for e in eps])
            a.set_xlabel("epsilon per release")
            a.set_title(title, fontsize=10)
            a.legend(fontsize=8)
        ax = ax[3:]
    if curves:
        for a, (key, title) in zip(ax, DRIFT_CURVES):
            for label, c in curves.items():
                ys = c.get(key, [])
                a.plot(range(1, len(ys) + 1), ys, marker=".", label=label)
            a.axvline(flip_round, color="grey", ls="--")
            a.set_xlabel("round")
            a.set_title(title, fontsize=9)
            a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _privacy_md(rows: list[dict[str, Any]]) -> tuple[str, str]:
    head = ["goal", "epsilon / release", "seeds"] + [t for _, t in PRIVACY_COLUMNS]
    md = [[r["goal"], _eps_text(r["epsilon"]), r["n_seeds"]]
          + [("inf" if k == "dp_epsilon_spent" and math.isinf(r[k]) else fmt(r[k], 3)) for k, _ in PRIVACY_COLUMNS]
          for r in rows]
    fields = ["goal", "epsilon", "n_seeds"] + [x for k, _ in PRIVACY_COLUMNS for x in (k, k + "_std")]
    return md_table(head, md), csv_text(fields, [[r[f] for f in fields] for r in rows])


def _drift_md(rows: list[dict[str, Any]]) -> tuple[str, str]:
    head = ["row", "seeds", "stopped partnering (seeds)", "rounds to stop (mean of those)",
            "mixed share pre-flip", "mixed share post-flip (2nd half)", "detected (seeds)", "detection delay",
            "false-alarm rate", "final AUROC"]
    md = [[r["label"], r["n_seeds"], f"{r['stopped']}/{r['n_seeds']}", fmt(r["rounds_to_stop"], 1),
           fmt(r["mixed_share_pre"]), fmt(r["mixed_share_post"]),
           f"{r['detected']}/{r['n_seeds']}" if r["windows"] else "-",
           fmt(r["detection_delay"], 1) if r["windows"] else "-",
           fmt(r["false_alarm_rate"]) if r["windows"] else "-", fmt(r["final_auroc_mean"])] for r in rows]
    fields = list(rows[0]) if rows else []
    return md_table(head, md), csv_text(fields, [[r[f] for f in fields] for r in rows])


def privacy_drift_sections(client: Any, cells: Sequence[Any], out: Path, sections: dict[str, Any]) -> str:
    """Write the privacy and drift tables and the figure into ``out`` when the experiment has such runs.

    Args:
        client: MLflow client of the store.
        cells: the experiment's de-duplicated clinical runs.
        out: the report folder.
        sections: the report document's ``sections`` (``privacy`` and ``drift`` are added).
    Returns:
        The Markdown of the sections ("" when the experiment has neither kind of run).
    """
    priv = privacy_rows(client, cells)
    drift, curves = drift_rows(client, cells)
    parts = []
    for name, rows, table, title, note in (
            ("privacy", priv, _privacy_md, "Privacy-utility of the DP metadata release",
             "Seed means; epsilon and delta per release (`metadata_dp_epsilon`, `metadata_dp_delta`)."),
            ("drift", drift, _drift_md, "Drift: a center turned harmful",
             "Mixed partnerships: one end flipped (harmful); stopped: none for 3 rounds running after the flip.")):
        if rows:
            md, body = table(rows)
            (out / f"{name}.md").write_text(md)
            (out / f"{name}.csv").write_text(body)
            sections[name] = {"rows": rows}
            parts += [f"\n## {title}\n", note + "\n", md]
    if priv or drift:
        privacy_drift_figure(priv, curves, drift[0]["flip_round"] if drift else 0, out / "privacy_drift.png")
        parts.append("\n![privacy and drift](privacy_drift.png)\n")
    return "\n".join(parts)

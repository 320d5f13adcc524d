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
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from etl.errors import InputError
from federation.methods import display_names, families, paper_order

__all__ = ["CellRun", "Table1Row", "pareto_front", "mean_std", "collect_runs", "table1", "table1_markdown",
           "build_report", "write_report", "PAPER_ORDER", "DISPLAY"]

#: ABPS paper Table 1 row order, Table 1 row names and Figure 3 colour families (paper caption: blue
#: star FL, green decentralized, orange ABPS+P/Q, red ABPS-X, purple goal-aware, olive local-only):
#: read from the registered method classes (``@register`` in federation/methods/registry.py).
PAPER_ORDER: tuple[str, ...] = paper_order()
DISPLAY: dict[str, str] = display_names()
FAMILY: dict[str, str] = families()
_COLOURS = {"star": "tab:blue", "decentralized": "tab:green", "abps": "tab:orange", "abps-x": "darkred",
            "goal": "tab:purple", "local": "tab:olive", "centralized": "gray", "other": "tab:gray"}

SAGE_SELECTORS = ("LOCAL", "RG", "PENS", "PFedDST", "AQ-128", "SAGE-NF", "Vanilla SAGE", "SAGE-OS")


# --------------------------------------------------------------------------------------------
# statistics


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


# --------------------------------------------------------------------------------------------
# reading MLflow


@dataclass
class CellRun:
    """One FINISHED clinical run (a sweep cell or an ``abps train`` child run)."""

    run_id: str
    label: str
    method: str
    seed: int
    cohort: str | None
    config_hash: str | None
    start_time: int
    final_auroc_mean: float
    model_bytes: float
    rel_bandwidth: float
    rounds_run: float


@dataclass
class Collected:
    """Runs of an experiment by kind, after de-duplication, and notes on what was dropped."""

    cells: list[CellRun] = field(default_factory=list)
    sage: list[Any] = field(default_factory=list)
    vv: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _all_finished(client: Any, exp_id: str) -> list[Any]:
    out: list[Any] = []
    token = None
    while True:
        page = client.search_runs([exp_id], filter_string="attributes.status = 'FINISHED'", max_results=1000,
                                  page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def _label(method: str, params: dict[str, str]) -> str:
    """Row label of an ``abps train`` run: the method, plus the goal when the run set one that
    its preset does not (``abps --goal diversity`` is not the base ABPS row)."""
    goal = str(params.get("params.goal", "none")).lower()
    if goal in ("none", ""):
        return method
    try:
        from federation.methods import get_method

        preset = str(get_method(method).default_config.get("params", {}).get("goal") or "none").lower()
    except Exception:  # a method this build does not know: keep the goal in the label
        preset = "none"
    return method if goal == preset else f"{method} [goal={goal}]"


def _cell_from_run(r: Any) -> CellRun | None:
    m, t = r.data.metrics, r.data.tags
    if "final_auroc_mean" not in m or "method" not in t or "seed" not in t:
        return None
    method = t["method"]
    return CellRun(
        run_id=r.info.run_id, label=t.get("abps.label") or _label(method, r.data.params), method=method,
        seed=int(t["seed"]), cohort=t.get("abps.cohort_id"),
        config_hash=t.get("abps.config_hash"), start_time=int(r.info.start_time or 0),
        final_auroc_mean=float(m["final_auroc_mean"]),
        model_bytes=float(m.get("model_bytes", m.get("cum_bytes", math.nan))),
        rel_bandwidth=float(m.get("rel_bandwidth", math.nan)), rounds_run=float(m.get("rounds_run", math.nan)))


def dedupe_cells(cells: Iterable[CellRun]) -> tuple[list[CellRun], list[str]]:
    """One run per (label, seed): per label the configuration of its most recent run, then the most
    recent run per seed. Returns (kept runs, notes on dropped older configurations)."""
    by_label: dict[str, list[CellRun]] = {}
    for c in cells:
        by_label.setdefault(c.label, []).append(c)
    kept: list[CellRun] = []
    notes: list[str] = []
    for label, runs in by_label.items():
        runs.sort(key=lambda c: c.start_time)
        latest = runs[-1].config_hash
        same = [c for c in runs if c.config_hash == latest]
        if len(same) < len(runs) and latest is not None:
            notes.append(f"{label}: {len(runs) - len(same)} run(s) of an older configuration ignored")
        per_seed: dict[int, CellRun] = {}
        for c in same:
            per_seed[c.seed] = c  # sorted by start time: the latest wins
        kept.extend(per_seed[s] for s in sorted(per_seed))
    return kept, notes


def collect_runs(client: Any, exp_id: str) -> Collected:
    """FINISHED runs of the experiment split into clinical cells, SAGE and variance-correction runs."""
    out = Collected()
    cells = []
    for r in _all_finished(client, exp_id):
        bench = r.data.tags.get("benchmark")
        if bench == "sage" and "selector" in r.data.tags:
            out.sage.append(r)
        elif bench == "vv" and "arm" in r.data.tags:
            out.vv.append(r)
        elif r.data.tags.get("abps.kind") not in ("sweep", "report"):
            c = _cell_from_run(r)
            if c is not None:
                cells.append(c)
    cohorts = {c.cohort for c in cells if c.cohort}
    if len(cohorts) > 1:  # never pool runs on different cohorts: keep the most recent run's cohort
        latest = max((c for c in cells if c.cohort), key=lambda c: c.start_time).cohort
        dropped = [c for c in cells if c.cohort not in (latest, None)]
        cells = [c for c in cells if c.cohort in (latest, None)]
        out.notes.append(f"{len(dropped)} run(s) on {len(cohorts) - 1} other cohort(s) ignored (cohort {latest} "
                         "kept); give each cohort its own --experiment")
    out.cells, notes = dedupe_cells(cells)
    out.notes.extend(notes)
    return out


# --------------------------------------------------------------------------------------------
# ABPS Table 1 and Figure 3


@dataclass
class Table1Row:
    """One Table 1 row: AUROC mean/std across seeds, mean cumulative model bytes, bandwidth."""

    label: str
    name: str
    method: str
    family: str
    n_seeds: int
    seeds: str
    auroc_mean: float
    auroc_std: float
    bytes_mean: float
    bandwidth: float
    rounds_mean: float


def _order_key(label: str, method: str) -> tuple[int, str]:
    key = label if label in PAPER_ORDER else None
    if key is None:
        return (len(PAPER_ORDER), label)
    return (PAPER_ORDER.index(key), label)


def table1(cells: Sequence[CellRun]) -> tuple[list[Table1Row], str]:
    """Table 1 rows from de-duplicated cell runs, and the bandwidth reference used.

    Returns:
        (rows in paper order, ``"fedavg"`` when bandwidth is relative to the FedAvg runs of the
        experiment, else ``"reference"`` (the runtime's ``rel_bandwidth``)).
    """
    groups: dict[str, list[CellRun]] = {}
    for c in cells:
        groups.setdefault(c.label, []).append(c)
    fed = groups.get("fedavg")
    fed_bytes = mean_std([c.model_bytes for c in fed])[0] if fed else math.nan
    basis = "fedavg" if fed and fed_bytes > 0 else "reference"
    rows = []
    for label, runs in groups.items():
        method = runs[0].method
        a_mean, a_std = mean_std([c.final_auroc_mean for c in runs])
        b_mean = mean_std([c.model_bytes for c in runs])[0]
        bw = b_mean / fed_bytes if basis == "fedavg" else mean_std([c.rel_bandwidth for c in runs])[0]
        rows.append(Table1Row(
            label=label, name=DISPLAY.get(label, label), method=method, family=FAMILY.get(method, "other"),
            n_seeds=len(runs), seeds=" ".join(str(c.seed) for c in sorted(runs, key=lambda c: c.seed)),
            auroc_mean=a_mean, auroc_std=a_std, bytes_mean=b_mean, bandwidth=bw,
            rounds_mean=mean_std([c.rounds_run for c in runs])[0]))
    rows.sort(key=lambda r: _order_key(r.label, r.method))
    return rows, basis


def _fmt(x: float, nd: int = 3) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{nd}f}"


def _md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def table1_markdown(rows: Sequence[Table1Row], basis: str) -> str:
    """Table 1 as Markdown: method, AUROC mean +/- std, bandwidth (x), seeds, rounds."""
    head = ["Method", "AUROC (mean ± std)", "Bandwidth", "Seeds", "Rounds"]
    body = [(r.name, f"{_fmt(r.auroc_mean)} ± {_fmt(r.auroc_std)}", f"{_fmt(r.bandwidth, 2)}×", r.n_seeds,
             _fmt(r.rounds_mean, 1)) for r in rows]
    note = ("Bandwidth: cumulative model bytes relative to FedAvg's in this experiment (= 1.00×)."
            if basis == "fedavg" else
            "Bandwidth: no FedAvg run in this experiment; the runtime's rel_bandwidth "
            "(n × full fp32 model × reference_rounds) is shown.")
    return _md_table(head, body) + "\n" + note + " AUROC: mean test AUROC across centers at the final round (at the best validation round for " \
        "methods with early stopping, e.g. ABPS-X and FedAvg-X); std across seeds (population).\n"


def _csv_text(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(headers)
    for r in rows:
        w.writerow(["" if isinstance(v, float) and not math.isfinite(v) else v for v in r])
    return buf.getvalue()


def figure3(rows: Sequence[Table1Row], path: Path) -> list[str]:
    """ABPS Figure 3 (a) accuracy ranking and (b) AUROC vs cumulative MB (log) with the Pareto front.

    Returns the labels on the Pareto front (increasing bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    central = [r for r in rows if r.method == "centralized" and math.isfinite(r.auroc_mean)]
    fed = [r for r in rows if r.method != "centralized" and math.isfinite(r.auroc_mean)]
    ranked = sorted(fed, key=lambda r: r.auroc_mean, reverse=True)
    fig, (ax_a, ax_b) = plt.subplots(1, 2, figsize=(14, max(4.5, 0.38 * len(ranked) + 1.5)))
    y = list(range(len(ranked)))
    ax_a.barh(y, [r.auroc_mean for r in ranked], xerr=[r.auroc_std for r in ranked],
              color=[_COLOURS.get(r.family, "tab:gray") for r in ranked], capsize=3)
    ax_a.set_yticks(y, [r.name for r in ranked], fontsize=8)
    ax_a.invert_yaxis()
    lo = min((r.auroc_mean - r.auroc_std for r in ranked), default=0.5)
    hi = max((r.auroc_mean + r.auroc_std for r in ranked), default=1.0)
    for r in central:
        hi = max(hi, r.auroc_mean)
        ax_a.axvline(r.auroc_mean, ls="--", color="gray", label=f"Centralized = {r.auroc_mean:.3f}")
    ax_a.set_xlim(max(0.0, lo - 0.02), min(1.0, hi + 0.02))
    for yi, r in zip(y, ranked):
        ax_a.text(r.auroc_mean + (r.auroc_std if math.isfinite(r.auroc_std) else 0.0), yi, f"  {r.auroc_mean:.3f}",
                  va="center", fontsize=7)
    ax_a.set_xlabel("Mean AUROC across centers (higher is better)")
    ax_a.set_title("(a) Accuracy ranking")
    if central:
        ax_a.legend(loc="lower right", fontsize=8)

    pts = [r for r in fed if math.isfinite(r.bytes_mean) and r.bytes_mean > 0]
    xy = [(r.bytes_mean / 1e6, r.auroc_mean) for r in pts]
    front = pareto_front(xy)
    for r, (x, yv) in zip(pts, xy):
        ax_b.errorbar([x], [yv], yerr=[r.auroc_std], fmt="*" if r.method == "abps-x" else "o",
                      ms=12 if r.method == "abps-x" else 6, color=_COLOURS.get(r.family, "tab:gray"), capsize=2)
        ax_b.annotate(r.name, (x, yv), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if front:
        fx, fy = [xy[i][0] for i in front], [xy[i][1] for i in front]
        ax_b.step(fx, fy, where="post", color="black", lw=1, ls=":", label="Pareto front")
        ax_b.scatter(fx, fy, s=140, facecolors="none", edgecolors="black", zorder=5)
        ax_b.legend(loc="lower right", fontsize=8)
    ax_b.set_xscale("log")
    ax_b.set_xlabel("Cumulative bytes transmitted (MB, log scale)")
    ax_b.set_ylabel("Mean AUROC across centers (higher is better)")
    ax_b.set_title("(b) Accuracy-bandwidth Pareto")
    skipped = [r.name for r in fed if r not in pts]
    if skipped:
        ax_b.text(0.01, 0.01, "no model traffic (not on log axis): " + ", ".join(skipped),
                  transform=ax_b.transAxes, fontsize=7, color="gray")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [pts[i].label for i in front]


# --------------------------------------------------------------------------------------------
# SAGE Tables I-III and Fig. 3


def _sage_summary_stops(client: Any, run_id: str) -> float:
    """Share of decisions stopping at the last schedule stage, from the run's summary.json (nan if absent)."""
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as tmp:
            p = client.download_artifacts(run_id, "summary.json", tmp)
            doc = json.loads(Path(p).read_text())
    except Exception:  # noqa: BLE001 - an absent artifact is a missing value
        return math.nan
    stops = {k: v for k, v in (doc.get("stop_distribution") or {}).items() if k.startswith("stop_at_")}
    if not stops:
        return math.nan
    last = max(stops, key=lambda k: int(k.rsplit("_", 1)[1]))
    return float(stops[last])


def sage_tables(client: Any, runs: Sequence[Any]) -> dict[str, Any]:
    """Per (configuration, selector) means over seeds of the SAGE Table I-III quantities.

    Returns ``{"configs": [...], "selectors": [...], "cells": {(config, selector): {metric: (mean, std, n)}},
    "alpha": {config: alpha}}``."""
    keys = {"global_acc": "final_global_acc", "macro_f1": "final_macro_f1", "client_acc": "final_client_acc",
            "worst_client_acc": "final_worst_client_acc", "budget_consumed": "final_budget_consumed",
            "rg_fallback_rate": "final_rg_fallback_rate", "cost_rg_rate": "final_cost_rg_rate",
            "comm_oh": "final_comm_oh"}
    latest: dict[tuple[str, str, str], Any] = {}
    for r in sorted(runs, key=lambda r: r.info.start_time or 0):
        p = r.data.params
        cfg = p.get("config") or f"{p.get('dataset')}-{p.get('graph')}-{p.get('alpha_dir')}"
        latest[(cfg, r.data.tags["selector"], p.get("seed", "?"))] = r
    vals: dict[tuple[str, str], dict[str, list[float]]] = {}
    alpha: dict[str, float] = {}
    meta: dict[str, tuple[str, str, float]] = {}
    for (cfg, selr, _seed), r in latest.items():
        d = vals.setdefault((cfg, selr), {k: [] for k in [*keys, "stop_last"]})
        for k, mk in keys.items():
            if mk in r.data.metrics:
                d[k].append(float(r.data.metrics[mk]))
        d["stop_last"].append(_sage_summary_stops(client, r.info.run_id))
        p = r.data.params
        try:
            alpha[cfg] = float(p.get("alpha_dir", "nan"))
        except ValueError:
            alpha[cfg] = math.nan
        meta[cfg] = (p.get("dataset", ""), p.get("graph", ""), alpha[cfg])
    configs = sorted(meta, key=lambda c: meta[c])
    present = {s for _, s in vals}
    selectors = [s for s in SAGE_SELECTORS if s in present] + sorted(present - set(SAGE_SELECTORS))
    cells = {k: {m: (*mean_std(v), sum(1 for x in v if math.isfinite(x))) for m, v in d.items()}
             for k, d in vals.items()}
    return {"configs": configs, "selectors": selectors, "cells": cells, "alpha": alpha}


def _sage_md(t: dict[str, Any], title: str, metrics: Sequence[str], pct: bool = False) -> tuple[str, str]:
    head = ["Configuration", *t["selectors"]]
    md_rows, csv_rows = [], []
    for cfg in t["configs"]:
        cells = []
        for s in t["selectors"]:
            c = t["cells"].get((cfg, s))
            parts = []
            for m in metrics:
                mu = c[m][0] if c else math.nan
                parts.append(_fmt(mu * 100, 1) if pct and math.isfinite(mu) else _fmt(mu))
                csv_rows.append((cfg, s, m, c[m][0] if c else math.nan, c[m][1] if c else math.nan,
                                 c[m][2] if c else 0))
            cells.append(" / ".join(parts))
        md_rows.append((cfg, *cells))
    md = f"{title} (cells: {' / '.join(metrics)}{', %' if pct else ''}; mean over seeds)\n\n" + _md_table(head, md_rows)
    return md, _csv_text(["configuration", "selector", "metric", "mean", "std", "n_seeds"], csv_rows)


def sage_figure(t: dict[str, Any], path: Path) -> None:
    """SAGE Fig. 3: (a) accuracy relative to RG, (b) by alpha, (c) budget consumed, (d) CommOH."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sels = [s for s in t["selectors"] if s != "RG"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))

    def per_sel(metric: str, rel: bool) -> dict[str, list[tuple[str, float]]]:
        out: dict[str, list[tuple[str, float]]] = {}
        for s in (sels if rel else t["selectors"]):
            for cfg in t["configs"]:
                c = t["cells"].get((cfg, s))
                if not c or not math.isfinite(c[metric][0]):
                    continue
                v = c[metric][0]
                if rel:
                    rg = t["cells"].get((cfg, "RG"))
                    if not rg or not math.isfinite(rg[metric][0]):
                        continue
                    v -= rg[metric][0]
                out.setdefault(s, []).append((cfg, v))
        return out

    def strip(ax: Any, data: dict[str, list[tuple[str, float]]], ylabel: str, title: str) -> None:
        names = list(data)
        for i, s in enumerate(names):
            ys = [v for _, v in data[s]]
            ax.scatter([i] * len(ys), ys, s=18, alpha=0.7)
            if ys:
                ax.hlines(statistics.median(ys), i - 0.3, i + 0.3, color="black")
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(title)

    rel = per_sel("global_acc", True)
    strip(axes[0, 0], rel, "global accuracy - RG", "(a) Accuracy relative to RG (median marked)")
    axes[0, 0].axhline(0, color="gray", ls="--", lw=1)
    ax = axes[0, 1]
    for s, pts in rel.items():
        by_a: dict[float, list[float]] = {}
        for cfg, v in pts:
            by_a.setdefault(t["alpha"].get(cfg, math.nan), []).append(v)
        xs = sorted(a for a in by_a if math.isfinite(a))
        if xs:
            ax.plot(xs, [statistics.fmean(by_a[a]) for a in xs], marker="o", label=s)
    ax.axhline(0, color="gray", ls="--", lw=1)
    ax.set_xlabel("Dirichlet alpha")
    ax.set_ylabel("global accuracy - RG")
    ax.set_title("(b) By heterogeneity regime")
    if rel:
        ax.legend(fontsize=7)
    strip(axes[1, 0], per_sel("budget_consumed", False), "budget consumed", "(c) Probe budget consumed")
    strip(axes[1, 1], per_sel("comm_oh", False), "CommOH (relative to RG)", "(d) Model traffic")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# variance-correction Table I


def vv_table(runs: Sequence[Any]) -> tuple[str, str]:
    """Variance-correction Table I: per grid cell and arm, first / most reaching ticks and plateau delay.

    Reaching times are means over the seeds that reached the target, shown with ``(k/N)``."""
    latest: dict[tuple[str, str, str], Any] = {}
    for r in sorted(runs, key=lambda r: r.info.start_time or 0):
        latest[(r.data.tags.get("cell", ""), r.data.tags["arm"], r.data.params.get("seed", "?"))] = r
    groups: dict[tuple[str, str], list[Any]] = {}
    for (cell, arm, _seed), r in latest.items():
        groups.setdefault((cell, arm), []).append(r)
    cells = sorted({c for c, _ in groups})
    arms = sorted({a for _, a in groups})
    metrics = ("first_reach", "most_reach", "plateau_delay", "final_mean_accuracy")
    md_rows, csv_rows = [], []
    for cell in cells:
        row = [cell]
        for arm in arms:
            rs = groups.get((cell, arm), [])
            stats = {}
            for m in metrics:
                v = [float(r.data.metrics[m]) for r in rs if m in r.data.metrics]
                mu, sd = mean_std(v)
                stats[m] = (mu, len(v))
                csv_rows.append((cell, arm, m, mu, sd, len(v), len(rs)))
            n = len(rs)
            row.append(f"{_fmt(stats['most_reach'][0], 0)} ({stats['most_reach'][1]}/{n})")
            row.append(f"{_fmt(stats['first_reach'][0], 0)} ({stats['first_reach'][1]}/{n})")
        md_rows.append(row)
    head = ["Cell"] + [f"{a}: {k}" for a in arms for k in ("most reaching", "first")]
    md = ("Variance-correction Table I (ticks to reach the target accuracy; mean over seeds that reached it, "
          "(reached/seeds))\n\n" + _md_table(head, md_rows))
    return md, _csv_text(["cell", "arm", "metric", "mean", "std", "n_values", "n_seeds"], csv_rows)


# --------------------------------------------------------------------------------------------
# the report


def build_report(client: Any, exp_id: str, experiment: str, out: Path) -> dict[str, Any]:
    """Write every section into the folder ``out`` (already created); returns the report document."""
    col = collect_runs(client, exp_id)
    doc: dict[str, Any] = {"experiment": experiment, "sections": {}, "notes": list(col.notes)}
    parts = [f"# Report: experiment `{experiment}`\n"]
    if col.cells:
        rows, basis = table1(col.cells)
        md = table1_markdown(rows, basis)
        (out / "table1.md").write_text(md)
        fields = list(asdict(rows[0]))
        (out / "table1.csv").write_text(_csv_text(fields, [[getattr(r, f) for f in fields] for r in rows]))
        front = figure3(rows, out / "fig3.png")
        doc["sections"]["table1"] = {"rows": [asdict(r) for r in rows], "bandwidth_basis": basis,
                                     "pareto_front": front}
        parts += ["## ABPS Table 1\n", md, "\n## ABPS Figure 3\n",
                  "![Figure 3](fig3.png)\n\nPareto front (bytes vs AUROC): "
                  + (", ".join(DISPLAY.get(x, x) for x in front) or "none") + "\n"]
    else:
        parts.append("## ABPS Table 1\n\nNo finished clinical runs in this experiment; section skipped.\n")
    if col.sage:
        t = sage_tables(client, col.sage)
        parts.append("\n## SAGE Tables I-III\n")
        for fname, title, metrics, pct in (
                ("sage_table1", "SAGE Table I: global accuracy / macro-F1", ("global_acc", "macro_f1"), False),
                ("sage_table2", "SAGE Table II: client / worst-client accuracy", ("client_acc", "worst_client_acc"),
                 False),
                ("sage_table3", "SAGE Table III: budget consumed / stop at last stage / RG fallback / cost-RG",
                 ("budget_consumed", "stop_last", "rg_fallback_rate", "cost_rg_rate"), True)):
            md, csv_text = _sage_md(t, title, metrics, pct)
            (out / f"{fname}.md").write_text(md)
            (out / f"{fname}.csv").write_text(csv_text)
            parts.append(md + "\n")
        sage_figure(t, out / "sage_fig3.png")
        parts.append("![SAGE Fig. 3](sage_fig3.png)\n")
        doc["sections"]["sage"] = {"configs": t["configs"], "selectors": t["selectors"], "runs": len(col.sage)}
    else:
        parts.append("\n## SAGE Tables I-III\n\nNo finished SAGE runs (tag benchmark=sage); section skipped.\n")
    if col.vv:
        md, csv_text = vv_table(col.vv)
        (out / "vv_table1.md").write_text(md)
        (out / "vv_table1.csv").write_text(csv_text)
        parts += ["\n## Variance-correction Table I\n", md]
        doc["sections"]["vv"] = {"runs": len(col.vv)}
    else:
        parts.append("\n## Variance-correction Table I\n\nNo finished variance-correction runs (tag benchmark=vv); "
                     "section skipped.\n")
    if col.notes:
        parts.append("\n## Notes\n\n" + "".join(f"* {n}\n" for n in col.notes))
    from federation.tracking import check_no_identifiers

    check_no_identifiers(doc)
    (out / "report.md").write_text("\n".join(parts))
    (out / "report.json").write_text(json.dumps(doc, indent=2, allow_nan=True, default=str) + "\n")
    return doc


def write_report(experiment: str, out_dir: str | Path, tracking_uri: str | None = None,
                 log_to_mlflow: bool = True) -> dict[str, Any]:
    """Build the report of ``experiment`` into ``out_dir`` (atomically) and log it to a ``report`` run.

    Raises:
        InputError: the experiment does not exist in the store.
    """
    from mlflow.tracking import MlflowClient

    from etl.io import atomic_output_dir
    from federation.tracking import default_tracking_uri

    uri = tracking_uri or default_tracking_uri()
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise InputError(f"--experiment {experiment!r}: no such MLflow experiment in {uri}")
    with atomic_output_dir(out_dir) as tmp:
        doc = build_report(client, exp.experiment_id, experiment, Path(tmp))
        # files of sections this report does not have (left by an earlier report in the same
        # folder) are removed, so a folder never mixes two experiments' tables
        stale = _ALL_REPORT_FILES - {p.name for p in Path(tmp).iterdir()}
        for name in stale:
            (Path(out_dir) / name).unlink(missing_ok=True)
    if log_to_mlflow:
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

        run = client.create_run(exp.experiment_id, run_name="report",
                                tags={MLFLOW_RUN_NAME: "report", "abps.kind": "report"})
        try:
            for p in sorted(Path(out_dir).iterdir()):
                if p.is_file() and p.name in _written(doc, Path(out_dir)):
                    client.log_artifact(run.info.run_id, str(p))
        except BaseException:
            client.set_terminated(run.info.run_id, "FAILED")
            raise
        client.set_terminated(run.info.run_id, "FINISHED")
        doc["report_run_id"] = run.info.run_id
    return doc


_ALL_REPORT_FILES = frozenset(
    {"report.md", "report.json", "table1.md", "table1.csv", "fig3.png", "sage_fig3.png", "vv_table1.md",
     "vv_table1.csv"} | {f"sage_table{i}.{e}" for i in (1, 2, 3) for e in ("md", "csv")})


def _written(doc: dict[str, Any], out: Path) -> set[str]:
    names = {"report.md", "report.json"}
    if "table1" in doc["sections"]:
        names |= {"table1.md", "table1.csv", "fig3.png"}
    if "sage" in doc["sections"]:
        names |= {f"sage_table{i}.{e}" for i in (1, 2, 3) for e in ("md", "csv")} | {"sage_fig3.png"}
    if "vv" in doc["sections"]:
        names |= {"vv_table1.md", "vv_table1.csv"}
    return {n for n in names if (out / n).is_file()}

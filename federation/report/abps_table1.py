"""ABPS paper Table 1 and Figure 3 (Sec. 6.4) from the de-duplicated clinical runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from federation import method_catalog as catalog
from federation.core.limits import few_centers
from federation.report.collect import CellRun
from federation.report.common import fmt, md_table, mean_std, pareto_front

__all__ = ["PAPER_ORDER", "DISPLAY", "FAMILY", "PAPER_TABLE1", "BANDWIDTH_NOTE", "ISOLATION_NOTE", "isolation_cell", "Table1Row", "table1", "table1_markdown", "figure3"]

#: ABPS paper Table 1 row order, Table 1 row names and Figure 3 colour families (paper caption: blue
#: star FL, green decentralized, orange ABPS+P/Q, red ABPS-X, purple goal-aware, olive local-only):
#: the registered method classes' (``@register`` in federation/methods/registry.py), read from
#: their copy in :mod:`federation.method_catalog` so that reading runs never imports a method.
PAPER_ORDER: tuple[str, ...] = catalog.PAPER_ORDER
DISPLAY: dict[str, str] = catalog.DISPLAY
FAMILY: dict[str, str] = catalog.FAMILY
#: ABPS paper Table 1 (Sec. 6.4; real MIMIC-IV, n = 230 centers, 50 rounds, 5 seeds): row label ->
#: (AUROC mean, across-seed std, bandwidth relative to FedAvg). The Centralized reference is given in
#: the caption without a bandwidth (NaN). Shown beside the measured rows by :func:`table1_markdown`.
PAPER_TABLE1: dict[str, tuple[float, float, float]] = {
    "local": (0.587, 0.013, 0.00), "fedavg": (0.755, 0.019, 1.00), "fedprox": (0.753, 0.019, 1.00),
    "feddyn": (0.758, 0.017, 1.00), "moon": (0.750, 0.020, 1.00), "decefl": (0.696, 0.011, 1.00),
    "defta": (0.725, 0.013, 1.00), "wpfed": (0.694, 0.012, 1.00), "bnn-fl": (0.749, 0.014, 2.00),
    "abps": (0.753, 0.015, 1.50), "abps+p": (0.757, 0.015, 1.49), "abps+q": (0.753, 0.015, 0.75),
    "abps+p+q+k1": (0.748, 0.012, 0.25), "fedavg-pq": (0.758, 0.017, 0.50),
    "abps-hom": (0.742, 0.013, 0.25), "abps-div": (0.694, 0.015, 0.16), "abps-align": (0.739, 0.010, 0.25),
    "abps-x": (0.758, 0.010, 0.09), "fedavg-x": (0.691, 0.008, 0.31), "centralized": (0.827, 0.007, math.nan),
}


def _paper_cell(label: str) -> str:
    """``"0.755 ± 0.019 (1.00×)"`` for a paper row, ``"–"`` for rows the paper does not have."""
    if label not in PAPER_TABLE1:
        return "–"
    m, s, bw = PAPER_TABLE1[label]
    return f"{fmt(m)} ± {fmt(s)}" + (f" ({fmt(bw, 2)}×)" if math.isfinite(bw) else "")


_COLOURS = {"star": "tab:blue", "decentralized": "tab:green", "abps": "tab:orange", "abps-x": "darkred",
            "goal": "tab:purple", "local": "tab:olive", "centralized": "gray", "other": "tab:gray"}


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
    rest_share: float = math.nan  # mean over seeds of the per-seed mean isolation rate (partner-selection methods)
    n_undefined: int = 0  # seeds whose mean AUROC is undefined (too few evaluable centers): then the row's too
    n_scored_min: float = math.nan  # fewest evaluable centers of a seed
    min_scored: float = math.nan  # evaluable centers a mean needs (the runs' evaluation setting)
    n_centers: float = math.nan  # the cohort's centers (evaluable or not)


def _order_key(label: str, method: str) -> tuple[int, str]:
    key = label if label in PAPER_ORDER else None
    if key is None:
        return (len(PAPER_ORDER), label)
    return (PAPER_ORDER.index(key), label)


#: the one definition of bandwidth (console, results.json, MLflow ``Bandwidth`` / ``rel_bandwidth``,
#: ``abps runs``, report): federation.ledger.Ledger.relative_bandwidth
BANDWIDTH_NOTE = ("Bandwidth: cumulative model bytes relative to FedAvg's reference traffic (every center sends "
                  "the full fp32 model each of reference_rounds rounds, default 50; FedAvg over 50 rounds = 1.00×).")
#: the one definition of isolation (``abps train``, ``abps runs``, report, MLflow ``Isolation`` /
#: ``rest_share_mean``)
ISOLATION_NOTE = ("Isolation: share of centers that rest (no partner, P_i empty), mean over rounds (and seeds); "
                  "partner-selection methods only.")


def isolation_cell(share: float) -> str:
    """An isolation figure as every table shows it: ``35.0 %``, or ``–`` for a method without rest."""
    return "–" if not math.isfinite(share) else f"{100 * share:.1f} %"


def table1(cells: Sequence[CellRun]) -> list[Table1Row]:
    """Table 1 rows from de-duplicated cell runs, in the paper's order; bandwidth as
    :data:`BANDWIDTH_NOTE` defines it (each run's ``rel_bandwidth``, mean over seeds)."""
    groups: dict[str, list[CellRun]] = {}
    for c in cells:
        groups.setdefault(c.label, []).append(c)
    rows = []
    for label, runs in groups.items():
        method = runs[0].method
        a_mean, a_std = mean_std([c.final_auroc_mean for c in runs])
        if any(not math.isfinite(c.final_auroc_mean) for c in runs):  # no mean over the seeds that have one
            a_mean = a_std = math.nan
        b_mean = mean_std([c.model_bytes for c in runs])[0]
        bw = mean_std([c.rel_bandwidth for c in runs])[0]
        rows.append(Table1Row(
            label=label, name=DISPLAY.get(label, label), method=method, family=FAMILY.get(method, "other"),
            n_seeds=len(runs), seeds=" ".join(str(c.seed) for c in sorted(runs, key=lambda c: c.seed)),
            auroc_mean=a_mean, auroc_std=a_std, bytes_mean=b_mean, bandwidth=bw,
            rounds_mean=mean_std([c.rounds_run for c in runs])[0],
            rest_share=mean_std([c.rest_share for c in runs])[0],
            n_undefined=sum(not math.isfinite(c.final_auroc_mean) for c in runs),
            n_scored_min=min((c.n_scored for c in runs if math.isfinite(c.n_scored)), default=math.nan),
            min_scored=max((c.min_scored for c in runs if math.isfinite(c.min_scored)), default=math.nan),
            n_centers=max((c.n_scored + c.n_excluded for c in runs if math.isfinite(c.n_scored + c.n_excluded)),
                          default=math.nan)))
    rows.sort(key=lambda r: _order_key(r.label, r.method))
    return rows


def auroc_cell(r: Table1Row) -> str:
    """``0.780 ± 0.016`` (mean ± std across seeds), ``0.780 (1 seed)`` for one seed (no spread to
    show), or ``undefined (k of n seeds: j centers evaluable, m needed)`` when a seed's mean rests
    on fewer evaluable centers than the run's ``evaluation`` setting allows. A mean over fewer than
    half the cohort's centers (:func:`federation.core.limits.few_centers`) says how many:
    ``0.750 (1 seed; 2 of 6 centers)``."""
    if r.n_undefined:
        need = f", {r.min_scored:.0f} needed" if math.isfinite(r.min_scored) else ""
        got = f": {r.n_scored_min:.0f} centers evaluable{need}" if math.isfinite(r.n_scored_min) else ""
        return f"undefined ({r.n_undefined} of {r.n_seeds} seeds{got})"
    few = math.isfinite(r.n_scored_min) and math.isfinite(r.n_centers) and few_centers(r.n_scored_min, r.n_centers)
    where = f"{r.n_scored_min:.0f} of {r.n_centers:.0f} centers" if few else ""
    if r.n_seeds == 1:
        return f"{fmt(r.auroc_mean)} (1 seed{'; ' + where if where else ''})"
    return f"{fmt(r.auroc_mean)} ± {fmt(r.auroc_std)}" + (f" ({where})" if where else "")


def rounds_cell(rounds: float) -> str:
    """Rounds run, mean over seeds: a whole number as such (50), else one decimal (early stopping)."""
    return f"{rounds:.0f}" if math.isfinite(rounds) and float(rounds).is_integer() else fmt(rounds, 1)


def table1_markdown(rows: Sequence[Table1Row]) -> str:
    """Table 1 as Markdown: method, AUROC mean +/- std, bandwidth (x), seeds, rounds, isolation, and
    the paper's AUROC and bandwidth for the same row (:data:`PAPER_TABLE1`, ``–`` if not a paper row)."""
    head = ["Method", "AUROC (mean ± std)", "Bandwidth", "Seeds", "Rounds", "Isolation",
            "Paper: AUROC (bandwidth)"]
    body = [(r.name, auroc_cell(r), f"{fmt(r.bandwidth, 2)}×", r.n_seeds,
             rounds_cell(r.rounds_mean), isolation_cell(r.rest_share),
             _paper_cell(r.label))
            for r in rows]
    return md_table(head, body) + "\n" + BANDWIDTH_NOTE + " AUROC: mean test AUROC across centers at the final " \
        "round (at the best validation round for methods with early stopping, e.g. ABPS-X and FedAvg-X); std across " \
        "seeds (population). " + ISOLATION_NOTE + " " \
        "Paper: ABPS paper Table 1 (real MIMIC-IV, 230 centers, 50 rounds, 5 seeds; Centralized from its caption).\n"


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
    spread = [r.auroc_std if r.n_seeds > 1 else math.nan for r in ranked]  # one seed: no spread to draw
    ax_a.barh(y, [r.auroc_mean for r in ranked], xerr=spread,
              color=[_COLOURS.get(r.family, "tab:gray") for r in ranked], capsize=3)
    ax_a.set_yticks(y, [r.name for r in ranked], fontsize=8)
    ax_a.invert_yaxis()
    lo = min((r.auroc_mean - r.auroc_std for r in ranked), default=0.5)
    hi = max((r.auroc_mean + r.auroc_std for r in ranked), default=1.0)
    for r in central:
        hi = max(hi, r.auroc_mean)
        ax_a.axvline(r.auroc_mean, ls="--", color="gray", label=f"Centralized = {r.auroc_mean:.3f}")
    # bars start at chance (0.5) where every row lies above it: a bar's length is its distance from
    # chance, and a zoomed axis would make a small gap look large
    ax_a.set_xlim(0.5 if lo >= 0.5 else 0.0, min(1.0, hi + 0.02))
    for yi, r in zip(y, ranked):
        ax_a.text(r.auroc_mean + (r.auroc_std if math.isfinite(r.auroc_std) and r.n_seeds > 1 else 0.0), yi, f"  {r.auroc_mean:.3f}",
                  va="center", fontsize=7)
    ax_a.set_xlabel("Mean AUROC across centers (higher is better; bars from chance, 0.5)" if lo >= 0.5
                    else "Mean AUROC across centers (higher is better)")
    ax_a.set_title("(a) Accuracy ranking")
    if central:
        ax_a.legend(loc="lower right", fontsize=8)

    pts = [r for r in fed if math.isfinite(r.bytes_mean) and r.bytes_mean > 0]
    xy = [(r.bytes_mean / 1e6, r.auroc_mean) for r in pts]
    front = pareto_front(xy)
    for r, (x, yv) in zip(pts, xy):
        ax_b.errorbar([x], [yv], yerr=[r.auroc_std if r.n_seeds > 1 else math.nan], fmt="*" if r.method == "abps-x" else "o",
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
    # "tight": a label of the rightmost point lies past the axes and was cut at the figure's edge
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [pts[i].label for i in front]

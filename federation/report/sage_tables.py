"""SAGE paper Tables I-III and Fig. 3 (Sec. VI) from the runs tagged ``benchmark = sage``."""

from __future__ import annotations

import json
import math
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from federation.report.common import csv_text, fmt, md_table, mean_std
from federation.run.tracking import SELECTOR_TAG

__all__ = ["sage_tables", "sage_markdown", "sage_figure"]


def _sage_summary_stops(client: Any, run_id: str) -> float:
    """Share of decisions stopping at the last schedule stage, from the run's summary.json (nan if absent)."""
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


def _settings(run: Any) -> tuple[tuple[str, str], ...]:
    """A SAGE run's settings: its logged parameters but the seed and the selector."""
    return tuple(sorted((k, v) for k, v in run.data.params.items() if k not in ("seed", "selector")))


def sage_tables(client: Any, runs: Sequence[Any]) -> dict[str, Any]:
    """Per (configuration, selector) means over seeds of the SAGE Table I-III quantities.

    A configuration (its ``config`` label) pools only the runs of its most recent run's settings
    (every logged parameter but the seed and the selector); runs of other settings (e.g. another
    number of clients or rounds under the same label) are left out and named in ``notes``.

    Returns ``{"configs": [...], "selectors": [...], "cells": {(config, selector): {metric: (mean, std, n)}},
    "alpha": {config: alpha}, "notes": [str]}``."""
    keys = {"global_acc": "final_global_acc", "macro_f1": "final_macro_f1", "client_acc": "final_client_acc",
            "worst_client_acc": "final_worst_client_acc", "budget_consumed": "final_budget_consumed",
            "rg_fallback_rate": "final_rg_fallback_rate", "cost_rg_rate": "final_cost_rg_rate",
            "comm_oh": "final_comm_oh"}
    by_cfg: dict[str, list[Any]] = {}
    for r in sorted(runs, key=lambda r: r.info.start_time or 0):
        p = r.data.params
        by_cfg.setdefault(p.get("config") or f"{p.get('dataset')}-{p.get('graph')}-{p.get('alpha_dir')}", []).append(r)
    latest: dict[tuple[str, str, str], Any] = {}
    notes: list[str] = []
    for cfg, cfg_runs in by_cfg.items():  # one configuration's runs are pooled only with the same settings
        newest = _settings(cfg_runs[-1])
        same = [r for r in cfg_runs if _settings(r) == newest]
        if len(same) < len(cfg_runs):
            other = {k for r in cfg_runs if r not in same for k, _ in set(_settings(r)) ^ set(newest)}
            notes.append(f"SAGE {cfg}: {len(cfg_runs) - len(same)} earlier run(s) with other settings "
                         f"({', '.join(sorted(other))}) left out (the tables show the most recent settings' runs)")
        for r in same:
            latest[(cfg, r.data.tags[SELECTOR_TAG], r.data.params.get("seed", "?"))] = r
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
    from federation.methods.registry import selector_displays  # imports the methods: the report only

    order = selector_displays()  # the SAGE paper's table order
    selectors = [s for s in order if s in present] + sorted(present - set(order))
    cells = {k: {m: (*mean_std(v), sum(1 for x in v if math.isfinite(x))) for m, v in d.items()}
             for k, d in vals.items()}
    return {"configs": configs, "selectors": selectors, "cells": cells, "alpha": alpha, "notes": notes}


def sage_markdown(t: dict[str, Any], title: str, metrics: Sequence[str], pct: bool = False) -> tuple[str, str]:
    """One SAGE table (configurations x selectors, cells ``metric / metric``) as (Markdown, CSV)."""
    head = ["Configuration", *t["selectors"]]
    md_rows, csv_rows = [], []
    for cfg in t["configs"]:
        cells = []
        for s in t["selectors"]:
            c = t["cells"].get((cfg, s))
            parts = []
            for m in metrics:
                mu = c[m][0] if c else math.nan
                parts.append(fmt(mu * 100, 1) if pct and math.isfinite(mu) else fmt(mu))
                csv_rows.append((cfg, s, m, c[m][0] if c else math.nan, c[m][1] if c else math.nan,
                                 c[m][2] if c else 0))
            cells.append(" / ".join(parts))
        md_rows.append((cfg, *cells))
    md = f"{title} (cells: {' / '.join(metrics)}{', %' if pct else ''}; mean over seeds)\n\n" + md_table(head, md_rows)
    return md, csv_text(["configuration", "selector", "metric", "mean", "std", "n_seeds"], csv_rows)


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

"""The cohort report: attrition, stays and mortality per unit / window, partition statistics.

Everything here is a cohort-level aggregate; no identifier or patient row is ever written.
The partition statistics are those the ABPS paper quotes for its careunit-by-year federation
(Sec. 6.1): Cramer's V between window and ``anchor_year_group``, mean window purity against
chance, and the mean pairwise Jensen-Shannon divergence of center mortality within and across
care units.
"""

from __future__ import annotations

import math
from dataclasses import asdict, is_dataclass

import numpy as np
import polars as pl


def cramers_v(a: np.ndarray, b: np.ndarray) -> float:
    """Cramer's V of two categorical arrays (no bias correction).

    V = sqrt(chi2 / (N * (min(r, c) - 1))) with chi2 Pearson's statistic of the r x c
    contingency table. Returns nan when either variable has a single level.
    """
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    r, c = ai.max() + 1, bi.max() + 1
    if r < 2 or c < 2:
        return float("nan")
    table = np.zeros((r, c))
    np.add.at(table, (ai, bi), 1)
    n = table.sum()
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / n
    chi2 = float(((table - expected) ** 2 / expected).sum())
    return math.sqrt(chi2 / (n * (min(r, c) - 1)))


def window_purity(window: np.ndarray, era: np.ndarray) -> tuple[float, float]:
    """Mean over windows of the share of the window's most common era, and its chance value.

    Chance is the share of the most common era in the whole partition: the purity a window has
    when its era mix equals the overall mix (windows independent of eras).
    """
    _, wi = np.unique(window, return_inverse=True)
    _, ei = np.unique(era, return_inverse=True)
    table = np.zeros((wi.max() + 1, ei.max() + 1))
    np.add.at(table, (wi, ei), 1)
    purity = (table.max(1) / table.sum(1)).mean()
    chance = table.sum(0).max() / table.sum()
    return float(purity), float(chance)


def bernoulli_jsd(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence (nats) between Bernoulli(p) and Bernoulli(q), elementwise."""

    def h(x: np.ndarray) -> np.ndarray:
        x = np.clip(x, 1e-300, 1.0)
        return -x * np.log(x)

    def entropy(x: np.ndarray) -> np.ndarray:
        return h(x) + h(1 - x)

    m = (p + q) / 2
    return entropy(m) - (entropy(p) + entropy(q)) / 2


def jsd_within_across(rates: np.ndarray, groups: np.ndarray) -> tuple[float, float]:
    """Mean pairwise Bernoulli JSD of center rates, over pairs in the same group and across groups."""
    i, j = np.triu_indices(len(rates), k=1)
    d = bernoulli_jsd(rates[i], rates[j])
    same = groups[i] == groups[j]
    within = float(d[same].mean()) if same.any() else float("nan")
    across = float(d[~same].mean()) if (~same).any() else float("nan")
    return within, across


def _rate_table(cohort: pl.DataFrame, key: str) -> list[dict]:
    t = (
        cohort.group_by(key)
        .agg(pl.len().alias("stays"), pl.col("label").sum().cast(pl.Int64).alias("deaths"))
        .with_columns((pl.col("deaths") / pl.col("stays")).alias("mortality"))
        .sort(key)
    )
    return t.to_dicts()


def cohort_report(cohort: pl.DataFrame, centers: pl.DataFrame, attrition: list[dict], opts, timings: dict) -> dict:
    """Build the report dict (written as cohort_report.json and .md).

    Args:
        cohort: the final cohort frame (columns of docs/data_dictionary.md).
        centers: the centers frame.
        attrition: list of {filter, unit, <unit>_in, <unit>_removed, <unit>_out} with unit
            ``stays`` (a filter) or ``rows`` (identical duplicated source rows collapsed); the
            small-center row also has centers_in, centers_removed, centers_out.
        opts: the EtlOptions (recorded).
        timings: seconds per ETL stage.
    """
    sizes = centers["n_train"] + centers["n_val"] + centers["n_test"]
    rep: dict = {
        "options": asdict(opts) if is_dataclass(opts) else dict(opts),
        "source": "mimic",
        "attrition": attrition,
        "stays": cohort.height,
        "patients": cohort["subject_id"].n_unique(),
        "mortality": float(cohort["label"].mean()),
        "centers": centers.height,
        "stays_per_center": {"min": int(sizes.min()), "median": float(sizes.median()), "max": int(sizes.max())},
        "splits": {s: int((cohort["split"] == s).sum()) for s in ("train", "val", "test")},
        "per_care_unit": _rate_table(cohort, "care_unit"),
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }
    stats: dict = {}
    if cohort["center_id"].n_unique() > 1:
        rates = centers["pos_rate"].to_numpy()
        within, across = jsd_within_across(rates, centers["care_unit"].to_numpy())
        stats["jsd_mortality_within_care_unit_nats"] = within
        stats["jsd_mortality_across_care_units_nats"] = across
    windowed = cohort.filter(pl.col("center_id").is_not_null())
    if "window_start" in centers.columns and centers["window_start"].null_count() < centers.height:
        win = cohort.join(centers.select("center_id", "window_start", "window_end"), on="center_id")
        rep["per_window"] = _rate_table(
            win.with_columns(window=pl.concat_str([pl.col("window_start").cast(pl.Utf8), pl.lit("-"),
                                                   pl.col("window_end").cast(pl.Utf8)])), "window")
        w = win["window_start"].to_numpy()
        e = win["anchor_year_group"].fill_null("unknown").to_numpy()
        stats["cramers_v_window_vs_anchor_year_group"] = cramers_v(w, e)
        purity, chance = window_purity(w, e)
        stats["mean_window_purity"] = purity
        stats["window_purity_chance"] = chance
    del windowed
    rep["partition_statistics"] = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in stats.items()}
    return rep


def _md_table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v) -> str:
        if isinstance(v, float):
            return f"{v:.4f}"
        return str(v)

    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def _attrition_rows(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        u = r.get("unit", "stays")
        row = {"filter": r["filter"], "in": r[f"{u}_in"], "removed": r[f"{u}_removed"], "out": r[f"{u}_out"], "unit": u}
        if "centers_in" in r:
            row["filter"] += f" ({r['centers_removed']} of {r['centers_in']} centers removed)"
        out.append(row)
    return out


def report_markdown(rep: dict) -> str:
    """Render the report dict as Markdown (aggregates only)."""
    lines = [
        "# Cohort report",
        "",
        f"Stays: {rep['stays']} (patients: {rep['patients']}), in-hospital mortality {rep['mortality']:.4f}, "
        f"centers: {rep['centers']} (stays per center min {rep['stays_per_center']['min']}, "
        f"median {rep['stays_per_center']['median']:.0f}, max {rep['stays_per_center']['max']}).",
        f"Partition: `{rep['options'].get('partition')}`; splits: "
        + ", ".join(f"{k} {v}" for k, v in rep["splits"].items()) + ".",
        "",
        "## Attrition",
        "",
        _md_table(_attrition_rows(rep["attrition"]), ["filter", "in", "removed", "out", "unit"]),
        "",
        "## Per care unit",
        "",
        _md_table(rep["per_care_unit"], ["care_unit", "stays", "deaths", "mortality"]),
        "",
    ]
    if "per_window" in rep:
        lines += ["## Per window (shifted years)", "", _md_table(rep["per_window"], ["window", "stays", "deaths", "mortality"]), ""]
    lines += ["## Partition statistics", ""]
    for k, v in rep["partition_statistics"].items():
        lines.append(f"- {k}: {'n/a' if v is None else f'{v:.4f}'}")
    lines += ["", "## Timings (s)", ""] + [f"- {k}: {v}" for k, v in rep["timings_s"].items()]
    return "\n".join(lines) + "\n"

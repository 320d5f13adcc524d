"""How far the care units (or centers) of a cohort differ in base rate and risk model, each figure beside
its shuffled-unit noise floor; cohort-level aggregates only (method: docs/fidelity.md, "FedAvg-X
against ABPS-X across heterogeneity").

    .venv/bin/python scripts/unit_heterogeneity.py COHORT_DIR [COHORT_DIR ...] [--by care_unit|center_id]
        [--min-stays 100] [--min-deaths 10]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import polars as pl
from sklearn.linear_model import LogisticRegression

FEATURES = ("age", "heart_rate_mean", "mbp_mean", "resp_rate_mean", "spo2_mean", "temperature_mean")


def _spreads(x: np.ndarray, y: np.ndarray, unit: np.ndarray, units: list[str]) -> tuple[float, float]:
    """(sd of the groups' mortality logits, mean over features of the sd of the units' coefficients)."""
    logits, coefs = [], []
    for u in units:
        m = unit == u
        p = y[m].mean()
        logits.append(np.log(p / (1 - p)))
        coefs.append(LogisticRegression(C=1.0, max_iter=2000).fit(x[m], y[m]).coef_[0])
    return float(np.std(logits)), float(np.std(np.array(coefs), axis=0).mean())


def measure(cohort_dir: Path, by: str = "care_unit", min_stays: int = 100,
            min_deaths: int = 10) -> dict[str, float | int]:
    """The figures of one cohort (see the module docstring)."""
    df = pl.read_parquet(Path(cohort_dir) / "cohort.parquet", columns=[by, "label", *FEATURES])
    counts = df.group_by(by).agg(pl.len().alias("n"), pl.col("label").sum().alias("d"))
    units = sorted(counts.filter((pl.col("n") >= min_stays) & (pl.col("d") >= min_deaths))[by].to_list())
    if len(units) < 2:
        raise SystemExit(f"{cohort_dir}: fewer than 2 groups ({by}) with {min_stays} stays and {min_deaths} deaths")
    df = df.filter(pl.col(by).is_in(units))
    x = df.select(FEATURES).to_numpy().astype(np.float64)
    x = x[:, np.isnan(x).mean(axis=0) < 0.5]  # features the source mostly lacks are left out
    x = np.where(np.isnan(x), np.nanmedian(x, axis=0), x)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    y, unit = df["label"].to_numpy(), df[by].to_numpy()
    base, coef = _spreads(x, y, unit, units)
    rng = np.random.default_rng(0)
    floor = np.array([_spreads(x, y, rng.permutation(unit), units) for _ in range(20)]).mean(axis=0)
    return {"stays": df.height, "units": len(units), "logit_sd": base, "logit_sd_shuffled": float(floor[0]),
            "coef_sd": coef, "coef_sd_shuffled": float(floor[1])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cohorts", nargs="+", type=Path)
    ap.add_argument("--by", choices=("care_unit", "center_id"), default="care_unit")
    ap.add_argument("--min-stays", type=int, default=100)
    ap.add_argument("--min-deaths", type=int, default=10)
    args = ap.parse_args(argv)
    print(f"| cohort | stays | groups ({args.by}) | mortality logit sd (shuffled) | coefficient sd (shuffled) |")
    print("|---|---|---|---|---|")
    for c in args.cohorts:
        if not (c / "cohort.parquet").is_file():
            print(f"error: {c}/cohort.parquet not found", file=sys.stderr)
            return 2
        r = measure(c, args.by, args.min_stays, args.min_deaths)
        print(f"| {c} | {r['stays']} | {r['units']} | {r['logit_sd']:.3f} ({r['logit_sd_shuffled']:.3f}) | "
              f"{r['coef_sd']:.3f} ({r['coef_sd_shuffled']:.3f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

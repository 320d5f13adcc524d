"""FedProx-Synthetic(alpha, beta) cohorts in the runtime's cohort contract.

Design notes: docs/runtime.md, "Module notes".
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import polars as pl

from etl.errors import InputError, check_number
from etl.io import atomic_output_dir, cohort_digests
from etl.pipeline import center_metadata
from etl.schema import (
    CATEGORICAL_FEATURES,
    CCI_COLUMNS,
    CENTER_COLUMNS,
    COHORT_COLUMNS,
    VITAL_COLUMNS,
)
from federation.core.limits import MAX_SEED

#: the largest --alpha / --beta: variances of the centers' models and feature means (the paper
#: uses 0 to 1); far past it the logistic labels are all 0 or 1 and the features overflow
MAX_VARIANCE = 1e3
#: the most stays a FedProx-Synthetic cohort may hold (about 5 GB while generated; the
#: 10,000-center scale benchmark draws about 3 M)
MAX_STAYS = 10_000_000

CARE_UNITS: tuple[str, ...] = ("MICU", "MICU/SICU", "CVICU", "SICU", "CCU", "TSICU")
CATEGORIES: dict[str, tuple[str, ...]] = {
    "gender": ("F", "M"),
    "race": ("ASIAN", "BLACK", "HISPANIC", "OTHER", "UNKNOWN", "WHITE"),
    "admission_type": ("DIRECT EMER.", "ELECTIVE", "EU OBSERVATION", "EW EMER.", "URGENT"),
    "admission_location": ("EMERGENCY ROOM", "PHYSICIAN REFERRAL", "TRANSFER FROM HOSPITAL", "UNKNOWN"),
    "insurance": ("Medicaid", "Medicare", "Other", "Private", "UNKNOWN"),
}
# location and scale of each vital aggregate around its latent coordinate (units of the contract)
_VITAL_LOC_SCALE: dict[str, tuple[float, float]] = {
    "heart_rate": (85.0, 15.0),
    "sbp": (120.0, 18.0),
    "dbp": (62.0, 11.0),
    "mbp": (80.0, 12.0),
    "resp_rate": (19.0, 4.5),
    "spo2": (96.5, 2.0),
    "temperature": (36.9, 0.5),
}
_AGG_SHIFT = {"mean": 0.0, "min": -1.2, "max": 1.2}
ANCHOR_YEAR_GROUPS = ("2008 - 2010", "2011 - 2013", "2014 - 2016", "2017 - 2019", "2020 - 2022")
N_LATENT = 1 + len(VITAL_COLUMNS) + len(CCI_COLUMNS) + len(CATEGORICAL_FEATURES)  # 39


def _normal_cuts(k: int) -> np.ndarray:
    """Cut points splitting N(0,1) into k equiprobable buckets (inverse normal CDF)."""
    from statistics import NormalDist

    nd = NormalDist()
    return np.array([nd.inv_cdf(i / k) for i in range(1, k)])


def generate_fedprox_cohort(
    n_centers: int,
    alpha: float = 1.0,
    beta: float = 1.0,
    seed: int = 0,
    mean_size: float = 300.0,
    size_sigma: float = 0.8,
    min_size: int = 40,
    intercept: float = -2.0,
    missing_rate: float = 0.04,
    shared: float = 0.0,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Draw a FedProx-Synthetic(alpha, beta) cohort (Li et al. 2020, Sec. 5.1; binary logistic).

    Args:
        n_centers: number of centers n (>= 1).
        alpha: variance of u_k (how much the centers' logistic models differ).
        beta: variance of B_k (how much the centers' feature means differ).
        seed: numpy seed; same arguments -> identical frames.
        mean_size: mean stays per center; sizes ~ lognormal(log(mean) - sigma^2/2, sigma).
        size_sigma: lognormal sigma of the center sizes.
        min_size: smallest center (stays).
        intercept: constant added to every logit (sets the overall positive rate).
        missing_rate: probability that one vital aggregate is null.
        shared: weight rho of a model component common to all centers (0 = original).

    Returns:
        ``(cohort, centers)``: polars frames with exactly the contract's columns
        (``etl.schema.COHORT_COLUMNS`` / ``CENTER_COLUMNS``).

    Raises:
        InputError: on a non-positive center count, negative alpha/beta or size parameters.
    """
    if n_centers < 1:
        raise InputError(f"--centers must be >= 1, got {n_centers}")
    if not 0 <= seed <= MAX_SEED:
        raise InputError(f"--seed must be an integer from 0 to {MAX_SEED}, got {seed}")
    for option, v in (("--alpha", alpha), ("--beta", beta)):  # variances; past the bound the logits overflow
        check_number(option, v, at_least=0.0)
        if v > MAX_VARIANCE:
            raise InputError(f"{option} must be <= {MAX_VARIANCE:g} (a variance of the generator), got {v}")
    check_number("--shared", shared, at_least=0.0)
    if shared > 1.0:
        raise InputError(f"--shared must be in [0, 1], got {shared}")
    check_number("--mean-size", mean_size, above=0.0)
    if mean_size * n_centers > MAX_STAYS:
        raise InputError(f"--mean-size {mean_size:g} x --centers {n_centers} is about {mean_size * n_centers:,.0f} "
                         f"stays, above the {MAX_STAYS:,} a synthetic cohort may hold")
    if size_sigma < 0 or min_size < 10:
        raise InputError("size_sigma must be >= 0 and min_size >= 10")
    rng = np.random.default_rng(seed)
    d = N_LATENT
    sizes = np.maximum(
        min_size,
        np.round(rng.lognormal(math.log(mean_size) - size_sigma**2 / 2, size_sigma, n_centers)),
    ).astype(np.int64)
    u = rng.normal(0.0, math.sqrt(alpha), n_centers)
    w = rng.normal(u[:, None], 1.0, (n_centers, d))
    b = rng.normal(u, 1.0)
    w = math.sqrt(1.0 - shared) * w + math.sqrt(shared) * rng.normal(0.0, 1.0, d)
    big_b = rng.normal(0.0, math.sqrt(beta), n_centers)
    v = rng.normal(big_b[:, None], 1.0, (n_centers, d))
    sigma_sd = np.arange(1, d + 1, dtype=np.float64) ** (-1.2 / 2)

    center = np.repeat(np.arange(n_centers), sizes)
    n_rows = int(sizes.sum())
    z = v[center] + rng.standard_normal((n_rows, d)) * sigma_sd
    logit = (w[center] * (z - v[center])).sum(1) + b[center] + intercept
    label = (rng.random(n_rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int8)

    # stratified 70/15/15 split inside each (center, label) group
    key = rng.random(n_rows)
    order = np.lexsort((key, label, center))
    grp = center[order] * 2 + label[order]
    starts = np.r_[0, np.flatnonzero(np.diff(grp)) + 1]
    counts = np.diff(np.r_[starts, n_rows])
    rank = np.arange(n_rows) - np.repeat(starts, counts)
    frac = (rank + 0.5) / np.repeat(counts, counts)
    split_sorted = np.where(frac < 0.7, "train", np.where(frac < 0.85, "val", "test"))
    split = np.empty(n_rows, dtype=object)
    split[order] = split_sorted

    window = np.arange(n_centers) // len(CARE_UNITS)
    unit = np.array(CARE_UNITS)[np.arange(n_centers) % len(CARE_UNITS)]
    w_start = 2110 + 2 * window
    center_ids = np.array([f"{unit[k]}|{w_start[k]}-{w_start[k] + 1}" for k in range(n_centers)])
    if len(set(center_ids)) != n_centers:  # more centers than unit x window cells: suffix
        center_ids = np.array([f"{c}#{k}" for k, c in enumerate(center_ids)])

    cols: dict[str, object] = {}
    ids = np.arange(n_rows, dtype=np.int64)
    cols["stay_id"] = 30_000_000 + ids
    cols["subject_id"] = 10_000_000 + ids
    cols["hadm_id"] = 20_000_000 + ids
    cols["center_id"] = center_ids[center]
    cols["care_unit"] = unit[center]
    cols["split"] = split.astype(str)
    cols["label"] = label
    cols["admit_year"] = (w_start[center] + rng.integers(0, 2, n_rows)).astype(np.int32)
    cols["anchor_year_group"] = np.array(ANCHOR_YEAR_GROUPS)[rng.integers(0, len(ANCHOR_YEAR_GROUPS), n_rows)]
    cols["age"] = np.clip(65.0 + 15.0 * z[:, 0], 18.0, 95.0)
    j = 1
    vitals: dict[str, np.ndarray] = {}
    for name, (loc, scale) in _VITAL_LOC_SCALE.items():
        for agg in ("mean", "min", "max"):
            val = loc + scale * (z[:, j] + _AGG_SHIFT[agg])
            vitals[f"{name}_{agg}"] = np.where(rng.random(n_rows) < missing_rate, np.nan, val)
            j += 1
    for c in CCI_COLUMNS:
        cols[c] = (z[:, j] > 1.0).astype(np.int8)
        j += 1
    for c in CATEGORICAL_FEATURES:
        cats = CATEGORIES[c]
        cols[c] = np.array(cats)[np.searchsorted(_normal_cuts(len(cats)), z[:, j])]
        j += 1
    cols.update(vitals)
    schema = {
        "stay_id": pl.Int64, "subject_id": pl.Int64, "hadm_id": pl.Int64, "label": pl.Int8,
        "admit_year": pl.Int32, "age": pl.Float64,
        **{c: pl.Int8 for c in CCI_COLUMNS}, **{c: pl.Float64 for c in VITAL_COLUMNS},
    }
    cohort = pl.DataFrame({c: cols[c] for c in COHORT_COLUMNS})
    cohort = cohort.with_columns(
        [pl.col(c).cast(t) for c, t in schema.items()]
    ).with_columns([pl.col(c).fill_nan(None) for c in VITAL_COLUMNS])
    centers = centers_table(cohort, window_start=dict(zip(center_ids.tolist(), w_start.tolist())))
    return cohort, centers


def centers_table(cohort: pl.DataFrame, window_start: dict[str, int] | None = None) -> pl.DataFrame:
    """Per-center aggregates of a cohort frame (centers.parquet contract; cohort-level only), in
    the order the centers first appear: :func:`etl.pipeline.center_metadata`'s split sizes and
    metadata vector. ``window_start`` maps center_id to its first shifted year (window_end =
    start + 1); null when not given.
    """
    framed = cohort.with_columns(
        pl.col("center_id").replace_strict(window_start or {}, default=None, return_dtype=pl.Int32).alias("window_start"),
    ).with_columns((pl.col("window_start") + 1).alias("window_end"))
    order = cohort.select(pl.col("center_id").unique(maintain_order=True))
    return order.join(center_metadata(framed), on="center_id", how="left",
                      maintain_order="left").select(list(CENTER_COLUMNS))


def write_fedprox_cohort(out: str | Path, **kwargs: object) -> Path:
    """Generate with :func:`generate_fedprox_cohort` and write ``cohort.parquet`` + ``centers.parquet``
    into ``out`` atomically. Returns the directory path."""
    marker = "fedprox_manifest.json"
    outp = Path(out)
    if outp.is_dir() and any(outp.iterdir()) and not (outp / marker).is_file():
        raise InputError(f"--out {out}: not empty and not an earlier `abps synth fedprox` output; "
                         "choose an empty or new folder")
    cohort, centers = generate_fedprox_cohort(**kwargs)  # type: ignore[arg-type]
    with atomic_output_dir(out) as tmp:
        cohort.write_parquet(tmp / "cohort.parquet")
        centers.write_parquet(tmp / "centers.parquet")
        (tmp / marker).write_text(json.dumps({"generator": "abps synth fedprox",
                                              "options": {k: str(v) for k, v in kwargs.items()},
                                              "files": cohort_digests(tmp)}, indent=2))
    return outp

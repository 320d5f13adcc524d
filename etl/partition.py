"""Partitions of a cohort into federated centers (``careunit-year``, ``careunit-era``, ``dirichlet``,
``iid``; ABPS paper Sec. 6.1) and the split stratified by label and grouped by subject_id. The random
partitions are also the image benchmarks' client splits. Details: docs/etl.md, "Module notes".
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import polars as pl

from etl.errors import InputError, check_fractions, check_number

Partition = Literal["careunit-year", "careunit-era", "dirichlet", "iid"]
PARTITIONS: tuple[str, ...] = ("careunit-year", "careunit-era", "dirichlet", "iid")


def assign_centers(
    stays: pl.DataFrame,
    partition: str,
    *,
    window_years: int = 2,
    window_origin: int = 2100,
    n_centers: int = 20,
    alpha: float = 0.5,
    seed: int = 0,
) -> pl.DataFrame:
    """Add ``center_id``, ``window_start`` and ``window_end`` columns to ``stays``.

    Args:
        stays: one row per stay with columns care_unit, admit_year (Int), anchor_year_group, label.
        partition: one of :data:`PARTITIONS`.
        window_years: window width in shifted years (careunit-year), >= 1.
        window_origin: a year on a window boundary (careunit-year).
        n_centers, alpha: dirichlet / iid parameters.
        seed: random seed (dirichlet / iid).

    Returns:
        ``stays`` with the three columns added (windows null for era / dirichlet / iid).

    Raises:
        InputError: unknown partition or bad parameter.
    """
    if partition == "careunit-year":
        if window_years < 1:
            raise InputError(f"--window-years must be >= 1, got {window_years}")
        start = ((pl.col("admit_year") - window_origin) // window_years) * window_years + window_origin
        return stays.with_columns(
            window_start=start.cast(pl.Int32),
            window_end=(start + window_years - 1).cast(pl.Int32),
        ).with_columns(
            center_id=pl.concat_str(
                [pl.col("care_unit"), pl.lit("|"), pl.col("window_start").cast(pl.Utf8),
                 pl.lit("-"), pl.col("window_end").cast(pl.Utf8)]
            )
        )
    if partition == "careunit-era":
        return stays.with_columns(
            window_start=pl.lit(None, dtype=pl.Int32),
            window_end=pl.lit(None, dtype=pl.Int32),
            center_id=pl.concat_str([pl.col("care_unit"), pl.lit("|"), pl.col("anchor_year_group")]),
        )
    if partition in ("dirichlet", "iid"):
        if n_centers < 1:
            raise InputError(f"--n-centers must be >= 1, got {n_centers}")
        if partition == "dirichlet":
            check_number("--alpha", alpha, above=0)
        rng = np.random.default_rng(seed)
        if partition == "iid":
            center = iid_assignment(stays.height, n_centers, rng)
        else:
            center = dirichlet_assignment(stays["label"].to_numpy(), n_centers, alpha, rng)
        width = len(str(n_centers - 1))
        prefix = "dir" if partition == "dirichlet" else "iid"
        return stays.with_columns(
            window_start=pl.lit(None, dtype=pl.Int32),
            window_end=pl.lit(None, dtype=pl.Int32),
            center_id=pl.Series([f"{prefix}-{c:0{width}d}" for c in center], dtype=pl.Utf8),
        )
    raise InputError(f"unknown --partition '{partition}' (choose from {', '.join(PARTITIONS)})")


def grouped_stratified_split(
    stays: pl.DataFrame,
    fractions: tuple[float, float, float] = (0.7, 0.15, 0.15),
    seed: int = 0,
) -> pl.Series:
    """Assign every stay to train / val / test, grouped by subject and stratified by label.

    Each subject is one unit. Subjects are stratified by (center of their first stay, whether any
    of their stays has label 1); within a stratum of m subjects in random order, the subject at
    rank r gets the position ``u = (r + o) / m`` for one uniform random start o in [0, 1) per
    stratum (systematic sampling), and goes to train if u < f_train, val if u < f_train + f_val,
    else test. Every subject's u is uniform on [0, 1), so each split receives exactly its fraction
    in expectation even in strata of one or two subjects (a center's only death lands in test with
    probability f_test), and large strata get the requested counts up to one subject; no patient
    crosses splits.

    Args:
        stays: columns subject_id, center_id, label, intime (for "first stay").
        fractions: (train, val, test), positive, summing to 1.
        seed: random seed.

    Returns:
        Utf8 series aligned with ``stays`` holding "train" / "val" / "test".

    Raises:
        InputError: fractions not positive or not summing to 1.
    """
    if len(fractions) != 3:
        raise InputError(f"--split: expected three fractions (train, val, test), got {len(fractions)}")
    f = np.asarray(check_fractions("--split", fractions), dtype=float)
    subj = (
        stays.sort(["subject_id", "intime"])
        .group_by("subject_id", maintain_order=True)
        .agg(pl.col("center_id").first().alias("stratum_center"), pl.col("label").max().alias("any_pos"))
        .sort("subject_id")
    )
    rng = np.random.default_rng(seed)
    subj = subj.with_columns(_r=pl.Series(rng.random(subj.height)))
    subj = subj.sort(["stratum_center", "any_pos", "_r"])
    key = subj.select(pl.struct("stratum_center", "any_pos").rank("dense")).to_series().to_numpy() - 1
    n_strata = int(key.max()) + 1 if len(key) else 0
    size = np.bincount(key, minlength=n_strata)
    first = np.concatenate([[0], np.cumsum(size)[:-1]])
    rank = np.arange(len(key)) - first[key]
    offset = rng.random(n_strata)  # systematic sampling with a continuous random start
    u = (rank + offset[key]) / size[key]
    split = np.where(u < f[0], "train", np.where(u < f[0] + f[1], "val", "test"))
    mapping = pl.DataFrame({"subject_id": subj["subject_id"], "split": split})
    return stays.select("subject_id").join(mapping, on="subject_id", how="left", maintain_order="left")["split"]


def iid_assignment(n: int, n_centers: int, rng: np.random.Generator) -> np.ndarray:
    """Spread n items uniformly at random over ``n_centers``: int64 ``[n]`` center of each item.

    A uniform permutation dealt round-robin, so the sizes differ by at most one.
    """
    center = np.empty(n, dtype=np.int64)
    center[rng.permutation(n)] = np.arange(n) % n_centers
    return center


def dirichlet_assignment(labels: np.ndarray, n_centers: int, alpha: float,
                         rng: np.random.Generator) -> np.ndarray:
    """Dirichlet(alpha) label skew (Hsu et al. 2019): int64 ``[n]`` center of each item.

    For each label value c (ascending), the items of class c in a uniform random order are cut
    over the K centers by one proportion vector p_c ~ Dir(alpha 1_K).
    """
    labels = np.asarray(labels)
    center = np.empty(len(labels), dtype=np.int64)
    for lab in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == lab))
        p = rng.dirichlet(np.full(n_centers, alpha))
        cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
        for k, part in enumerate(np.split(idx, cuts)):
            center[part] = k
    return center


def _groups(center: np.ndarray, n_centers: int) -> list[np.ndarray]:
    order = np.argsort(center, kind="stable")
    return [np.asarray(g, dtype=np.int64) for g in np.split(order, np.cumsum(np.bincount(center, minlength=n_centers))[:-1])]


def dirichlet_partition(labels: np.ndarray, n_clients: int, alpha: float, seed: int,
                        min_size: int = 10, max_tries: int = 100) -> list[np.ndarray]:
    """Split sample indices over clients with Dirichlet(alpha) label skew (:func:`dirichlet_assignment`).

    Draws are repeated from one random stream (up to ``max_tries``) until every client holds at
    least ``min_size`` samples.

    Args:
        labels: int [N] class labels.
        n_clients: K > 0.
        alpha: concentration > 0 (small = strong skew).
        seed: random seed; same seed, same partition.
    Returns:
        K sorted int64 index arrays that partition range(N).
    Raises:
        InputError: bad K or alpha, or no draw meets ``min_size``.
    """
    if n_clients < 1:
        raise InputError(f"dirichlet partition: n_clients must be >= 1, got {n_clients}")
    if not alpha > 0:
        raise InputError(f"dirichlet partition: alpha must be > 0, got {alpha}")
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        parts = _groups(dirichlet_assignment(labels, n_clients, alpha, rng), n_clients)
        if min(len(p) for p in parts) >= min_size:
            return parts
    raise InputError(f"dirichlet partition: no draw gave every client >= {min_size} samples "
                     f"(K={n_clients}, alpha={alpha}); lower min_size or raise alpha")


def iid_partition(n_samples: int, n_clients: int, seed: int) -> list[np.ndarray]:
    """Split range(n_samples) uniformly at random into ``n_clients`` sorted parts (sizes differ by <= 1)."""
    if n_clients < 1:
        raise InputError(f"iid partition: n_clients must be >= 1, got {n_clients}")
    return _groups(iid_assignment(n_samples, n_clients, np.random.default_rng(seed)), n_clients)

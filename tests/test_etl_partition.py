"""Partitions, the grouped stratified split, and the report's partition statistics."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from scipy.stats.contingency import association

from etl.errors import InputError
from etl.partition import assign_centers, grouped_stratified_split
from etl.report import bernoulli_jsd, cramers_v, jsd_within_across, window_purity


def _stays(n=2000, seed=0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    return pl.DataFrame({
        "stay_id": np.arange(n),
        "subject_id": rng.integers(0, n // 2, n),
        "care_unit": rng.choice(["MICU", "CVICU", "SICU"], n),
        "admit_year": rng.integers(2108, 2200, n).astype(np.int32),
        "anchor_year_group": rng.choice(["2008 - 2010", "2011 - 2013", "2014 - 2016"], n),
        "label": (rng.random(n) < 0.12).astype(np.int8),
        "intime": np.arange(n),
    })


def test_careunit_year_windows_are_aligned_two_year_buckets():
    s = pl.DataFrame({"care_unit": ["MICU"] * 5, "admit_year": [2110, 2111, 2112, 2109, 2191],
                      "anchor_year_group": ["x"] * 5, "label": [0] * 5})
    out = assign_centers(s, "careunit-year")
    assert out["center_id"].to_list() == ["MICU|2110-2111", "MICU|2110-2111", "MICU|2112-2113",
                                          "MICU|2108-2109", "MICU|2190-2191"]
    out3 = assign_centers(s, "careunit-year", window_years=3, window_origin=2110)
    assert out3["window_start"].to_list() == [2110, 2110, 2110, 2107, 2191 - (2191 - 2110) % 3]


def test_careunit_era_and_random_partitions():
    s = _stays()
    era = assign_centers(s, "careunit-era")
    assert era["center_id"].n_unique() == 9
    assert era["center_id"][0] == f"{s['care_unit'][0]}|{s['anchor_year_group'][0]}"
    iid = assign_centers(s, "iid", n_centers=8, seed=1)
    counts = iid.group_by("center_id").len()["len"]
    assert counts.max() - counts.min() <= 1 and iid["center_id"].n_unique() == 8
    d1 = assign_centers(s, "dirichlet", n_centers=5, alpha=0.1, seed=4)
    d2 = assign_centers(s, "dirichlet", n_centers=5, alpha=0.1, seed=4)
    assert d1["center_id"].equals(d2["center_id"])
    rates = d1.group_by("center_id").agg(pl.col("label").mean())["label"].to_numpy()
    assert rates.std() > 0.03  # strong label skew at alpha 0.1
    with pytest.raises(InputError, match="partition"):
        assign_centers(s, "bogus")
    with pytest.raises(InputError, match="alpha"):
        assign_centers(s, "dirichlet", alpha=0)


def test_split_is_grouped_stratified_and_proportional():
    s = assign_centers(_stays(6000, seed=2), "careunit-era")
    split = grouped_stratified_split(s, (0.7, 0.15, 0.15), seed=5)
    s = s.with_columns(split=split)
    assert (s.group_by("subject_id").agg(pl.col("split").n_unique())["split"] == 1).all()
    share = s["split"].value_counts(normalize=True)
    got = dict(zip(share["split"], share["proportion"]))
    assert got["train"] == pytest.approx(0.7, abs=0.03)
    assert got["val"] == pytest.approx(0.15, abs=0.03)
    pos = s.filter(pl.col("label") == 1)["split"].value_counts(normalize=True)
    assert dict(zip(pos["split"], pos["proportion"]))["train"] == pytest.approx(0.7, abs=0.06)
    assert grouped_stratified_split(s, (0.7, 0.15, 0.15), seed=5).equals(split)
    with pytest.raises(InputError, match="split"):
        grouped_stratified_split(s, (0.5, 0.5, 0.5))


def test_cramers_v_matches_scipy():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 4, 500)
    b = (a + rng.integers(0, 3, 500)) % 5
    table = np.zeros((4, 5), dtype=np.int64)
    np.add.at(table, (a, b), 1)
    assert cramers_v(a, b) == pytest.approx(association(table, method="cramer"), rel=1e-12)
    assert math.isnan(cramers_v(np.zeros(5), np.arange(5)))


def test_window_purity_hand_example():
    # window A: eras x,x,y -> 2/3; window B: y,y -> 1; mean 5/6; overall y is 3/5
    purity, chance = window_purity(np.array(["A", "A", "A", "B", "B"]), np.array(["x", "x", "y", "y", "y"]))
    assert purity == pytest.approx(5 / 6) and chance == pytest.approx(3 / 5)


def test_bernoulli_jsd_hand_value_and_groups():
    # JSD(Bern(0), Bern(1)) = log 2; JSD(p, p) = 0
    assert bernoulli_jsd(np.array([0.0]), np.array([1.0]))[0] == pytest.approx(math.log(2))
    assert bernoulli_jsd(np.array([0.3]), np.array([0.3]))[0] == pytest.approx(0.0, abs=1e-15)
    p, q = 0.1, 0.3
    m = 0.2
    h = lambda x: -(x * math.log(x) + (1 - x) * math.log(1 - x))  # noqa: E731
    assert bernoulli_jsd(np.array([p]), np.array([q]))[0] == pytest.approx(h(m) - (h(p) + h(q)) / 2)
    within, across = jsd_within_across(np.array([0.1, 0.1, 0.3]), np.array(["a", "a", "b"]))
    assert within == pytest.approx(0.0, abs=1e-15)
    assert across == pytest.approx(h(m) - (h(p) + h(q)) / 2)


def test_split_puts_small_strata_in_every_split_with_the_right_probability():
    """Strata of one subject (a center's only death) reach test with probability f_test."""
    n = 4000
    s = pl.DataFrame({"subject_id": np.arange(n), "center_id": [f"c{i}" for i in range(n)],
                      "label": np.ones(n, dtype=np.int8), "intime": np.zeros(n)})
    share = grouped_stratified_split(s, (0.7, 0.15, 0.15), seed=1).value_counts(normalize=True)
    got = dict(zip(share["split"], share["proportion"]))
    assert got["test"] == pytest.approx(0.15, abs=0.02) and got["val"] == pytest.approx(0.15, abs=0.02)

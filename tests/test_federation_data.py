"""federation.data.synthetic and federation.data.tensors: contract columns, per-center encoding, errors."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch

from etl.errors import InputError
from etl.schema import CATEGORICAL_FEATURES, CENTER_COLUMNS, COHORT_COLUMNS, NUMERIC_FEATURES
from federation.data.synthetic import generate_fedprox_cohort, write_fedprox_cohort
from federation.data.tensors import FederatedData


@pytest.fixture(scope="module")
def frames():
    return generate_fedprox_cohort(6, alpha=0.5, beta=0.5, seed=4, mean_size=120)


def test_synthetic_contract_columns_and_sizes(frames):
    cohort, centers = frames
    assert tuple(cohort.columns) == COHORT_COLUMNS
    assert tuple(centers.columns) == CENTER_COLUMNS
    assert centers.height == 6 and cohort["stay_id"].n_unique() == cohort.height
    per = cohort.group_by("center_id").agg(
        (pl.col("split") == "train").sum().alias("tr"), pl.len().alias("n")
    ).join(centers.select("center_id", "n_train"), on="center_id")
    assert (per["tr"] == per["n_train"]).all()
    # stratified 70/15/15: train share of each center within 5 points of 0.70
    assert ((per["tr"] / per["n"] - 0.70).abs() < 0.05).all()
    # meta_log_n_train is ln(n_train)
    np.testing.assert_allclose(centers["meta_log_n_train"].to_numpy(), np.log(centers["n_train"].to_numpy()))


def test_synthetic_is_deterministic(frames):
    again = generate_fedprox_cohort(6, alpha=0.5, beta=0.5, seed=4, mean_size=120)
    assert again[0].equals(frames[0]) and again[1].equals(frames[1])


def test_encoding_is_fitted_per_center_on_train(frames, tmp_path):
    cohort, centers = frames
    write_fedprox_cohort(tmp_path / "c", n_centers=6, alpha=0.5, beta=0.5, seed=4, mean_size=120)
    fd = FederatedData.from_cohort(tmp_path / "c")
    assert fd.center_ids == centers["center_id"].to_list()
    tr = fd.splits["train"]
    k = len(NUMERIC_FEATURES)
    for i in range(fd.n_centers):
        x = tr.x[i][tr.mask[i]][:, :k].double()
        np.testing.assert_allclose(x.mean(0).numpy(), 0.0, atol=1e-5)
        sd = x.std(0, unbiased=False).numpy()
        assert np.all(np.isclose(sd, 1.0, atol=1e-4) | np.isclose(sd, 0.0))
    # imputation: a null heart_rate_mean in center 0's val split equals that center's train median, standardized
    c0 = centers["center_id"][0]
    raw_tr = cohort.filter((pl.col("center_id") == c0) & (pl.col("split") == "train"))["heart_rate_mean"]
    filled = raw_tr.fill_null(raw_tr.median()).to_numpy()
    expect = (raw_tr.median() - filled.mean()) / filled.std()
    val = cohort.filter((pl.col("center_id") == c0) & (pl.col("split") == "val"))
    j = fd.feature_names.index("heart_rate_mean")
    col = fd.splits["val"].x[0, : val.height, j].numpy()
    nulls = val["heart_rate_mean"].is_null().to_numpy()
    assert nulls.any()
    np.testing.assert_allclose(col[nulls], expect, rtol=1e-5)
    # one-hot vocabulary is the category set of the whole file
    for c in CATEGORICAL_FEATURES:
        names = [f for f in fd.feature_names if f.startswith(c + "=")]
        assert names == [f"{c}={v}" for v in sorted(cohort[c].unique().to_list())]
    # padding: masks count the rows, padding rows are zero
    for s in ("train", "val", "test"):
        st = fd.splits[s]
        assert torch.equal(st.mask.sum(1), st.n)
        assert float(st.x[~st.mask].abs().sum()) == 0.0
    assert fd.meta.shape == (6, 15) and fd.meta_base.shape == (6, 3)


def test_missing_file_and_column_raise_input_error(frames, tmp_path):
    cohort, centers = frames
    with pytest.raises(InputError, match="cohort.parquet"):
        FederatedData.from_cohort(tmp_path)
    cohort.drop("spo2_max").write_parquet(tmp_path / "cohort.parquet")
    centers.write_parquet(tmp_path / "centers.parquet")
    with pytest.raises(InputError, match="spo2_max"):
        FederatedData.from_cohort(tmp_path)


@pytest.mark.parametrize(("value", "words"), [(math.inf, "holds infinite values"),
                                             (1e308, "holds values beyond float32's range (|x| > 3.4e38)")])
def test_a_feature_past_float32_is_refused_naming_file_and_column(frames, tmp_path, value, words):
    """1e308 is finite in the file's float64 but infinite as the engine's float32: refused like inf."""
    cohort, centers = frames
    cohort.with_columns(pl.when(pl.arange(0, pl.len()) == 0).then(value).otherwise(pl.col("heart_rate_mean"))
                        .alias("heart_rate_mean")).write_parquet(tmp_path / "cohort.parquet")
    centers.write_parquet(tmp_path / "centers.parquet")
    with pytest.raises(InputError) as err:
        FederatedData.from_cohort(tmp_path)
    assert str(err.value) == f"{tmp_path}/cohort.parquet: column 'heart_rate_mean' {words}"


def test_a_stay_listed_twice_is_refused_without_its_id(frames, tmp_path):
    cohort, centers = frames
    pl.concat([cohort, cohort.head(3)]).write_parquet(tmp_path / "cohort.parquet")
    centers.write_parquet(tmp_path / "centers.parquet")
    with pytest.raises(InputError) as err:
        FederatedData.from_cohort(tmp_path)
    assert "column 'stay_id' repeats a stay on 3 row(s)" in str(err.value)
    assert not any(str(s) in str(err.value) for s in cohort["stay_id"].head(3).to_list())


@pytest.mark.parametrize("damage", ["twice", "lacks", "extra", "n_train", "n_test"])
def test_centers_that_contradict_the_cohort_are_refused(frames, tmp_path, damage):
    """centers.parquet describes cohort.parquet's centers: one row per center of the cohort, none
    without rows, and its split counts are the cohort's."""
    cohort, centers = frames
    first = centers["center_id"][0]
    bad = {
        "twice": lambda c: pl.concat([c, c.head(1)]),
        "lacks": lambda c: c.tail(c.height - 1),
        "extra": lambda c: pl.concat([c, c.head(1).with_columns(pl.lit("ghost").alias("center_id"))]),
        "n_train": lambda c: c.with_columns(pl.when(pl.col("center_id") == first).then(pl.col("n_train") + 1)
                                            .otherwise(pl.col("n_train")).alias("n_train")),
        "n_test": lambda c: c.with_columns(pl.when(pl.col("center_id") == first).then(0)
                                           .otherwise(pl.col("n_test")).alias("n_test")),
    }[damage](centers)
    cohort.write_parquet(tmp_path / "cohort.parquet")
    bad.write_parquet(tmp_path / "centers.parquet")
    n_train = int(centers["n_train"][0])
    n_test = int(cohort.filter((pl.col("center_id") == first) & (pl.col("split") == "test")).height)
    words = {
        "twice": f"{tmp_path}/centers.parquet: column 'center_id' is not unique",
        "lacks": f"{tmp_path}/centers.parquet: 1 center(s) of cohort.parquet have no row here",
        "extra": f"{tmp_path}/centers.parquet: center 'ghost' has no row in cohort.parquet",
        "n_train": f"{tmp_path}/centers.parquet: column 'n_train' of center {first!r} is {n_train + 1}, but "
                   f"cohort.parquet holds {n_train} train row(s) of it",
        "n_test": f"{tmp_path}/centers.parquet: column 'n_test' of center {first!r} is 0, but cohort.parquet "
                  f"holds {n_test} test row(s) of it",
    }[damage]
    with pytest.raises(InputError) as err:
        FederatedData.from_cohort(tmp_path)
    assert str(err.value) == words


# ---- numeric encoding modes ------------------------------------------------------

from federation.core.config import DataConfig  # noqa: E402
from federation.data.tensors import HISTOGRAM_RANGES, encode_numeric, histogram_median, numeric_statistics  # noqa: E402


def _train_raw(fd):
    tr = fd.splits["train"]
    flat = tr.raw[tr.mask].numpy()  # [N, k] pooled train rows
    return tr, flat


def test_federated_statistics_come_from_mergeable_aggregates(frames, recwarn):
    cohort, centers = frames
    fd = FederatedData.from_frames(cohort, centers, preprocessing=DataConfig(preprocessing="federated"))
    assert fd.preprocessing == "federated"
    tr, flat = _train_raw(fd)
    k = len(NUMERIC_FEATURES)
    bins = DataConfig().histogram_bins
    med, mu, sd, nbytes = numeric_statistics(tr.raw, tr.mask, DataConfig(), "federated")
    exact = np.nanmedian(flat, 0)
    width = np.array([(HISTOGRAM_RANGES[c.rsplit("_", 1)[0] if c != "age" else c][1]
                       - HISTOGRAM_RANGES[c.rsplit("_", 1)[0] if c != "age" else c][0]) / bins
                      for c in NUMERIC_FEATURES])
    # histogram median: within one bin width of the exact pooled median, same for every center
    assert np.all(np.abs(med[0] - exact) <= width) and np.all(med == med[0])
    # mean / std from (rows, counts, sums, sums of squares) equal numpy on the imputed pooled rows
    filled = np.where(np.isnan(flat), med[0], flat)
    np.testing.assert_allclose(mu[0], filled.mean(0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(sd[0], filled.std(0), rtol=1e-7)
    # one affine map for everyone: pooled train numeric columns have mean 0, std 1
    x = tr.x[tr.mask][:, :k].double().numpy()
    np.testing.assert_allclose(x.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(x.std(0), 1.0, atol=1e-4)
    # ledger bytes: per center an upload of 8 * (1 + 3k) + 4 * k * bins, a download of 8 * 3k
    n = fd.n_centers
    assert fd.encoding_bytes == nbytes == n * (8 * (1 + 3 * k) + 4 * k * bins) + n * 24 * k


def test_histogram_median_by_hand():
    bins = 10
    hist = np.zeros((len(NUMERIC_FEATURES), bins))
    hist[0, 3] = 2.0  # age (0, 120], bin width 12: two values in [36, 48)
    hist[0, 5] = 2.0  # two values in [60, 72): half the mass (2) is reached at the end of bin 3
    med = histogram_median(hist, bins)
    assert med[0] == pytest.approx(48.0)
    assert np.isnan(med[1])  # a feature without values


def test_pooled_and_shrinkage_statistics(frames):
    cohort, centers = frames
    fd = FederatedData.from_frames(cohort, centers)
    tr, flat = _train_raw(fd)
    med, mu, sd, nbytes = numeric_statistics(tr.raw, tr.mask, DataConfig(), "pooled")
    g = np.nanmedian(flat, 0)
    filled = np.where(np.isnan(flat), g, flat)
    np.testing.assert_allclose(med[2], g)
    np.testing.assert_allclose(mu[4], filled.mean(0), rtol=1e-12)
    np.testing.assert_allclose(sd[1], filled.std(0), rtol=1e-12)
    assert nbytes == 0
    # shrinkage: lambda = count / (count + s) on the median, rows / (rows + s) on mean / var
    cfg = DataConfig(preprocessing="shrinkage", shrinkage_rows=40.0)
    smed, smu, ssd, _ = numeric_statistics(tr.raw, tr.mask, cfg, "shrinkage")
    fmed, fmu, fsd, _ = numeric_statistics(tr.raw, tr.mask, cfg, "federated")
    j = NUMERIC_FEATURES.index("heart_rate_mean")
    own = tr.raw[0][tr.mask[0]][:, j].numpy()
    cnt = (~np.isnan(own)).sum()
    lam_v = cnt / (cnt + 40.0)
    m0 = lam_v * np.nanmedian(own) + (1 - lam_v) * fmed[0, j]
    assert smed[0, j] == pytest.approx(m0)
    f0 = np.where(np.isnan(own), m0, own)
    lam = len(own) / (len(own) + 40.0)
    assert smu[0, j] == pytest.approx(lam * f0.mean() + (1 - lam) * fmu[0, j])
    assert ssd[0, j] == pytest.approx(np.sqrt(lam * f0.var() + (1 - lam) * fsd[0, j] ** 2))


def test_auto_mode_and_small_center_warning(frames):
    cohort, centers = frames
    big = FederatedData.from_frames(cohort, centers, preprocessing=DataConfig(min_center_rows=10))
    assert big.preprocessing == "per-center" and big.encoding_bytes == 0
    small = FederatedData.from_frames(cohort, centers, preprocessing=DataConfig(min_center_rows=10_000))
    assert small.preprocessing == "federated"
    with pytest.warns(UserWarning, match="6 of 6 centers have fewer than 10000 train rows"):
        FederatedData.from_frames(cohort, centers, preprocessing=DataConfig(preprocessing="per-center",
                                                                            min_center_rows=10_000))
    with pytest.raises(InputError, match="fewer than 10000 train rows"):
        FederatedData.from_frames(cohort, centers, preprocessing=DataConfig(
            preprocessing="per-center", min_center_rows=10_000, small_center="refuse"))
    # re-encoding is the same as building with that mode; the same config is a no-op
    again = big.with_preprocessing(DataConfig(preprocessing="federated"))
    direct = FederatedData.from_frames(cohort, centers, preprocessing=DataConfig(preprocessing="federated"))
    for s in ("train", "val", "test"):
        assert torch.equal(again.splits[s].x, direct.splits[s].x)
    assert again.with_preprocessing(DataConfig(preprocessing="federated")) is again
    assert big.with_preprocessing(DataConfig(min_center_rows=10)) is big
    # the pooled rows of the Centralized reference carry one encoding: identical raw rows, identical x
    pooled = big.with_preprocessing(DataConfig(preprocessing="pooled")).pooled()
    assert pooled.preprocessing == "pooled" and pooled.n_centers == 1


def test_pooled_and_per_center_statistics_by_hand():
    """The Centralized reference's encoding on a hand-sized federation: center 0 holds
    values 1, 3 and a missing one, center 1 holds 5 and a missing one (third slot is padding).
    Pooled: median of {1, 3, 5} = 3 fills both gaps, so the rows are 1, 3, 3, 5, 3 with mean 3 and
    population variance 8 / 5. Per center: center 0 fills with 2 (rows 1, 3, 2: mean 2, variance
    2 / 3); center 1 fills with 5 (rows 5, 5: std 0, replaced by 1)."""
    nan = float("nan")
    raw = torch.tensor([[[1.0], [3.0], [nan]], [[5.0], [nan], [nan]]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    med, mu, sd, nbytes = numeric_statistics(raw, mask, DataConfig(), "pooled")
    np.testing.assert_allclose(med, [[3.0], [3.0]])
    np.testing.assert_allclose(mu, [[3.0], [3.0]])
    np.testing.assert_allclose(sd, [[np.sqrt(1.6)], [np.sqrt(1.6)]])
    assert nbytes == 0
    x = encode_numeric(raw, mask, med, mu, sd)
    np.testing.assert_allclose(x[..., 0].numpy(), np.array([[-2, 0, 0], [2, 0, 0]]) / np.sqrt(1.6), rtol=1e-6)
    med, mu, sd, _ = numeric_statistics(raw, mask, DataConfig(), "per-center")
    np.testing.assert_allclose(med, [[2.0], [5.0]])
    np.testing.assert_allclose(mu, [[2.0], [5.0]])
    np.testing.assert_allclose(sd, [[np.sqrt(2.0 / 3.0)], [1.0]])

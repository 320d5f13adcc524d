"""federation.synthetic and federation.data: contract columns, per-center encoding, errors."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from etl.errors import InputError
from federation.data import FederatedData
from etl.schema import CATEGORICAL_FEATURES, CENTER_COLUMNS, COHORT_COLUMNS, NUMERIC_FEATURES
from federation.synthetic import generate_fedprox_cohort, write_fedprox_cohort


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

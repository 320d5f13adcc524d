"""federation.data.holdout: the tuning cohort (held-out train rows as the scored split, no real test row)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from etl.errors import InputError
from federation.data.holdout import holdout_splits, tuning_cohort


def _cohort() -> pl.DataFrame:
    # center a: 10 train, 2 val, 3 test; center b: 5 train, 1 val, 1 test
    rows = [("a", "train")] * 10 + [("a", "val")] * 2 + [("a", "test")] * 3 + [("b", "train")] * 5 \
        + [("b", "val")] + [("b", "test")]
    return pl.DataFrame({"stay_id": list(range(100, 100 + len(rows))), "center_id": [c for c, _ in rows],
                         "split": [s for _, s in rows]})


def test_held_out_share_per_center_and_no_real_test_row():
    src = _cohort()
    new = holdout_splits(src, 0.2, seed=0)
    count = new.group_by("center_id", "split").len().sort("center_id", "split")
    got = {(c, s): n for c, s, n in count.iter_rows()}
    # floor(0.2 * 10) = 2 of a's train rows, floor(0.2 * 5) = 1 of b's; val untouched
    assert got == {("a", "test"): 2, ("a", "train"): 8, ("a", "val"): 2,
                   ("b", "test"): 1, ("b", "train"): 4, ("b", "val"): 1}
    real_test = set(src.filter(pl.col("split") == "test")["stay_id"])
    old_train = set(src.filter(pl.col("split") == "train")["stay_id"])
    assert not real_test & set(new["stay_id"])  # no real test row survives
    assert set(new.filter(pl.col("split") == "test")["stay_id"]) <= old_train  # held-out rows come from train
    assert set(new.filter(pl.col("split") == "val")["stay_id"]) == set(src.filter(pl.col("split") == "val")["stay_id"])
    # same seed, same split; another seed draws other rows
    assert new.equals(holdout_splits(src, 0.2, seed=0))
    picks = {tuple(sorted(holdout_splits(src, 0.5, seed=s).filter(pl.col("split") == "test")["stay_id"]))
             for s in range(5)}
    assert len(picks) > 1


def test_bad_fraction_and_folders_refused(tmp_path):
    with pytest.raises(InputError, match="--fraction 1.0"):
        holdout_splits(_cohort(), 1.0, 0)
    with pytest.raises(InputError, match="missing column 'stay_id'"):
        holdout_splits(_cohort().drop("stay_id"), 0.2, 0)
    with pytest.raises(InputError, match="cohort.parquet: file not found"):
        tuning_cohort(tmp_path / "none", tmp_path / "out")


def test_written_cohort_loads(tmp_path):
    from federation.data.synthetic import write_fedprox_cohort

    synth_cohort_dir = write_fedprox_cohort(tmp_path / "src", n_centers=6, seed=3, mean_size=90.0)
    counts = tuning_cohort(synth_cohort_dir, tmp_path / "tune", fraction=0.25, seed=3)
    src = pl.read_parquet(synth_cohort_dir / "cohort.parquet")
    n_train = src.filter(pl.col("split") == "train").group_by("center_id").len()["len"]
    assert counts["test"] == int((n_train * 0.25).floor().sum())
    assert counts["train"] + counts["test"] == int(n_train.sum())
    assert counts["val"] == src.filter(pl.col("split") == "val").height
    from federation.data.tensors import FederatedData

    data = FederatedData.from_cohort(tmp_path / "tune")
    assert int(data.splits["test"].n.sum()) == counts["test"]
    # centers.parquet describes the tuning cohort: its train split sizes and v_i over that split
    centers = pl.read_parquet(tmp_path / "tune" / "centers.parquet")
    source = pl.read_parquet(synth_cohort_dir / "centers.parquet")
    assert centers["center_id"].to_list() == source["center_id"].to_list() and centers.columns == source.columns
    tune = pl.read_parquet(tmp_path / "tune" / "cohort.parquet").filter(pl.col("split") == "train")
    per = tune.group_by("center_id").agg(pl.len().alias("n"), pl.col("label").cast(pl.Float64).mean().alias("p"))
    got = centers.join(per, on="center_id")
    assert got["n_train"].to_list() == got["n"].to_list() and int(got["n"].sum()) == counts["train"]
    np.testing.assert_allclose(got["meta_log_n_train"].to_numpy(), np.log(got["n"].to_numpy()), rtol=1e-15)
    np.testing.assert_allclose(got["meta_pos_rate"].to_numpy(), got["p"].to_numpy(), rtol=1e-15)
    assert (centers["n_train"] < source["n_train"]).all()

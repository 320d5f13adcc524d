"""A tuning cohort: part of each center's train split held out as the split a grid is scored on.

A method whose training reads the validation split (DeFTA's trust, docs/baselines.md) cannot be
tuned on validation. :func:`tuning_cohort` writes a cohort whose ``test`` split is a held-out
share of each center's *train* rows, whose ``train`` split is the rest, whose ``val`` split is
unchanged (the method may read it) and which holds no row of the real test split. A grid run on it
and scored on its ``test`` column reads neither the real test split nor anything the method's
training read.

    python -m federation.data.holdout COHORT_DIR OUT_DIR [--fraction 0.2] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from etl.errors import InputError
from etl.io import atomic_output_dir, cohort_digests
from etl.pipeline import center_metadata

#: centers.parquet columns that describe the center itself, not its rows: copied as they are
KEEP_COLUMNS = ("center_id", "care_unit", "window_start", "window_end")

MANIFEST = "holdout_manifest.json"


def holdout_splits(cohort: pl.DataFrame, fraction: float, seed: int) -> pl.DataFrame:
    """Re-split ``cohort`` (columns ``center_id``, ``split``, ``stay_id``): drop the test rows, and move
    ``floor(fraction * n_train)`` of each center's train rows, drawn uniformly without replacement
    (those of lowest ``default_rng(seed).random`` key, rows in ``stay_id`` order), to ``test``. Val
    rows are kept as they are.

    Raises:
        InputError: ``fraction`` outside (0, 1), or a column missing.
    """
    if not 0.0 < fraction < 1.0:
        raise InputError(f"--fraction {fraction}: must lie strictly between 0 and 1")
    for col in ("center_id", "split", "stay_id"):
        if col not in cohort.columns:
            raise InputError(f"cohort.parquet: missing column {col!r}")
    kept = cohort.filter(pl.col("split") != "test").sort(["center_id", "stay_id"])
    u = np.random.default_rng(seed).random(kept.height)  # one key per row; a center's lowest keys are held out
    train = pl.col("split") == "train"
    ranked = kept.with_columns(pl.Series("_u", u)).with_columns(
        pl.when(train).then(pl.col("_u")).otherwise(None).rank("ordinal").over("center_id").alias("_r"),
        train.sum().over("center_id").alias("_n"))
    held = train & (pl.col("_r") <= (pl.col("_n") * fraction).floor())
    return ranked.with_columns(pl.when(held).then(pl.lit("test")).otherwise(pl.col("split")).alias("split")) \
        .drop("_u", "_r", "_n")


def tuning_centers(centers: pl.DataFrame, cohort: pl.DataFrame) -> pl.DataFrame:
    """``centers`` (the source's centers.parquet) with the split sizes, ``pos_rate`` and the
    metadata vector v_i recomputed over the tuning ``cohort`` (:func:`etl.pipeline.center_metadata`:
    v_i describes the train split the methods see); rows, their order and any other column kept."""
    fresh = center_metadata(cohort.join(centers.select("center_id", "window_start", "window_end"),
                                        on="center_id", how="left"))
    redo = [c for c in fresh.columns if c in centers.columns and c not in KEEP_COLUMNS]
    return centers.drop(redo).join(fresh.select("center_id", *redo), on="center_id", how="left",
                                   maintain_order="left").select(centers.columns)


def tuning_cohort(cohort_dir: str | Path, out: str | Path, fraction: float = 0.2, seed: int = 0) -> dict[str, int]:
    """Write the tuning cohort of ``cohort_dir`` into ``out`` (atomically; centers.parquet with the
    tuning cohort's split sizes and metadata, :func:`tuning_centers`).

    Returns the row counts per split of the new cohort. Raises InputError for a missing file.
    """
    src = Path(cohort_dir)
    for name in ("cohort.parquet", "centers.parquet"):
        if not (src / name).is_file():
            raise InputError(f"{src / name}: file not found (expected an `abps etl` cohort folder)")
    if Path(out).resolve() == src.resolve():
        raise InputError(f"OUT_DIR {out}: is the source cohort folder; choose another folder")
    new = holdout_splits(pl.read_parquet(src / "cohort.parquet"), fraction, seed)
    counts = {s: int((new["split"] == s).sum()) for s in ("train", "val", "test")}
    centers = tuning_centers(pl.read_parquet(src / "centers.parquet"), new)
    with atomic_output_dir(out) as tmp:
        new.write_parquet(tmp / "cohort.parquet")
        centers.write_parquet(tmp / "centers.parquet")
        (tmp / MANIFEST).write_text(json.dumps({"source": str(src), "fraction": fraction, "seed": seed,
                                                "rows": counts, "files": cohort_digests(tmp)}, indent=2))
    return counts


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cohort_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--fraction", type=float, default=0.2, help="share of each center's train rows held out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        counts = tuning_cohort(a.cohort_dir, a.out_dir, a.fraction, a.seed)
    except InputError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"tuning cohort -> {a.out_dir}: train {counts['train']}, val {counts['val']}, "
          f"held-out train (as test) {counts['test']}")


if __name__ == "__main__":
    main()

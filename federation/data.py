"""Federated data: per-center, per-split tensors stacked along a leading center axis.

Reads ``cohort.parquet`` and ``centers.parquet`` (docs/data_dictionary.md) and encodes the
model features of the contract:

* numeric (age + 21 vitals): missing values imputed with the center's own train-split median,
  then standardized with the center's own train-split mean and standard deviation
  (ABPS paper Sec. 6.1: "standardized per center on the local training split to respect
  federated isolation"); no statistic crosses centers;
* binary (12 Charlson flags): 0/1, null -> 0;
* categorical (gender, race, admission_type, admission_location, insurance): one-hot over the
  sorted category set of the whole cohort file (a schema fact, not a statistic; null ->
  ``UNKNOWN``).

Rows are padded to the largest center of each split; ``mask`` marks real rows. Padding rows
are zero and never enter a loss, a batch or a metric.
"""

from __future__ import annotations

import hashlib

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import torch

from etl.errors import InputError
from etl.schema import (
    BINARY_FEATURES,
    CATEGORICAL_FEATURES,
    META_BASE_COLUMNS,
    META_COLUMNS,
    NUMERIC_FEATURES,
    SPLITS,
)

_REQUIRED_COHORT = ("center_id", "split", "label", *NUMERIC_FEATURES, *BINARY_FEATURES, *CATEGORICAL_FEATURES)


def cohort_id(cohort_dir: str | Path) -> str:
    """SHA-256 (first 16 hex digits) of ``cohort.parquet`` then ``centers.parquet`` bytes.

    Identifies the cohort's content, not its path (a copied cohort resumes the same sweep cells;
    runs on different cohorts are never pooled by ``abps report``).

    Raises:
        InputError: a file is missing.
    """
    h = hashlib.sha256()
    for name in ("cohort.parquet", "centers.parquet"):
        p = Path(cohort_dir) / name
        if not p.is_file():
            raise InputError(f"{p}: file not found (expected {name} from `abps etl`)")
        h.update(name.encode())
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


def _check_types(cohort: pl.DataFrame, centers: pl.DataFrame, cohort_path: Path, centers_path: Path) -> None:
    """Validate the contract's value domains; raise InputError naming the file and column.

    The label must be 0/1 without nulls; numeric and binary features must be numbers (nulls are
    allowed and imputed, infinities are not); ``center_id`` must be text in both files and
    every cohort center must have a row in centers.parquet; metadata must be finite numbers.
    """
    for frame, path in ((cohort, cohort_path), (centers, centers_path)):
        if frame.schema["center_id"] != pl.Utf8:
            raise InputError(f"{path}: column 'center_id' must be text, got {frame.schema['center_id']}")
    lab = cohort["label"]
    if not lab.dtype.is_numeric():
        raise InputError(f"{cohort_path}: column 'label' must be 0/1 integers, got {lab.dtype}")
    if lab.null_count() or not lab.is_in([0, 1]).all():
        raise InputError(f"{cohort_path}: column 'label' must be 0 or 1 with no missing values")
    for col in (*NUMERIC_FEATURES, *BINARY_FEATURES):
        dt = cohort.schema[col]
        if not (dt.is_numeric() or dt == pl.Null):
            raise InputError(f"{cohort_path}: column {col!r} must be numeric, got {dt}")
        if dt.is_float() and cohort[col].is_infinite().any():
            raise InputError(f"{cohort_path}: column {col!r} holds infinite values")
    trained = cohort.filter(pl.col("split") == "train")["center_id"].unique().implode()
    used = centers.filter(pl.col("center_id").is_in(trained))  # centers without train rows are dropped later
    for col in META_COLUMNS:
        dt = centers.schema[col]
        if not dt.is_numeric():
            raise InputError(f"{centers_path}: column {col!r} must be numeric, got {dt}")
        if used[col].null_count() or (dt.is_float() and not used[col].is_finite().all()):
            raise InputError(f"{centers_path}: column {col!r} must hold finite numbers")
    missing = set(cohort["center_id"].unique().to_list()) - set(centers["center_id"].to_list())
    if missing:
        raise InputError(f"{centers_path}: {len(missing)} center(s) of cohort.parquet have no row here")
    if centers["center_id"].n_unique() != centers.height:
        raise InputError(f"{centers_path}: column 'center_id' is not unique")


@dataclass
class SplitTensors:
    """One split of every center, padded.

    Attributes:
        x: ``[n_centers, max_rows, d]`` float32 features.
        y: ``[n_centers, max_rows]`` float32 labels (0/1; 0 on padding).
        mask: ``[n_centers, max_rows]`` bool, True on real rows (real rows come first).
        n: ``[n_centers]`` int64 real rows per center.
    """

    x: torch.Tensor
    y: torch.Tensor
    mask: torch.Tensor
    n: torch.Tensor


@dataclass
class FederatedData:
    """All centers' data as stacked tensors.

    Attributes:
        center_ids: center_id per row of the center axis (order of centers.parquet).
        feature_names: the d encoded feature names (numeric, binary, then ``col=category``).
        splits: ``{"train"|"val"|"test": SplitTensors}``.
        meta: ``[n, 15]`` float32 metadata vectors v_i (ABPS Sec. 4.1; META_COLUMNS order).
        meta_base: ``[n, 3]`` float32 base vector (pos rate, ln n_train, year/2030).
        care_units: care unit per center.
        dropped: what :meth:`from_frames` left out, as counts only (no ids): ``{"centers",
            "stays", "deaths", "min_train"}`` for the centers with fewer than ``min_train`` train
            rows (all their stays, every split); all zero when none.
    """

    center_ids: list[str]
    feature_names: list[str]
    splits: dict[str, SplitTensors]
    meta: torch.Tensor
    meta_base: torch.Tensor
    care_units: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def n_centers(self) -> int:
        """Number of centers n."""
        return len(self.center_ids)

    @property
    def d(self) -> int:
        """Encoded feature width d."""
        return len(self.feature_names)

    @property
    def n_train(self) -> torch.Tensor:
        """``[n]`` int64 train rows per center (FedAvg's sample weights)."""
        return self.splits["train"].n

    def pooled(self) -> "FederatedData":
        """The union of all centers' rows as one center (for the Centralized reference).

        Each center's rows keep the encoding fitted on its own train split, so the
        pooled model sees exactly the features the federated models see.
        """
        out: dict[str, SplitTensors] = {}
        for name, s in self.splits.items():
            x = s.x[s.mask].unsqueeze(0)
            y = s.y[s.mask].unsqueeze(0)
            m = torch.ones(y.shape, dtype=torch.bool)
            out[name] = SplitTensors(x, y, m, torch.tensor([y.shape[1]], dtype=torch.int64))
        w = self.n_train.double() / self.n_train.sum()
        return FederatedData(
            center_ids=["pooled"],
            feature_names=self.feature_names,
            splits=out,
            meta=(w.unsqueeze(1) * self.meta.double()).sum(0, keepdim=True).float(),
            meta_base=(w.unsqueeze(1) * self.meta_base.double()).sum(0, keepdim=True).float(),
            care_units=["pooled"],
        )

    @classmethod
    def from_cohort(cls, cohort_dir: str | Path, min_train: int = 1) -> "FederatedData":
        """Read a cohort directory and build the stacked tensors.

        Args:
            cohort_dir: directory holding ``cohort.parquet`` and ``centers.parquet``.
            min_train: centers with fewer train rows are dropped (>= 1 always).

        Raises:
            InputError: a file or a required column is missing, a split value is unknown,
                or no center is left.
        """
        cohort_dir = Path(cohort_dir)
        paths = {name: cohort_dir / f"{name}.parquet" for name in ("cohort", "centers")}
        for name, p in paths.items():
            if not p.is_file():
                raise InputError(f"{p}: file not found (expected {name}.parquet from `abps etl`)")
        frames = {}
        for name, p in paths.items():
            try:
                frames[name] = pl.read_parquet(p)
            except Exception as exc:  # polars / arrow errors on a corrupt or non-Parquet file
                raise InputError(f"{p}: not a readable Parquet file ({exc.__class__.__name__})") from None
        cohort, centers = frames["cohort"], frames["centers"]
        for col in _REQUIRED_COHORT:
            if col not in cohort.columns:
                raise InputError(f"{paths['cohort']}: missing column {col!r}")
        for col in ("center_id", *META_COLUMNS):
            if col not in centers.columns:
                raise InputError(f"{paths['centers']}: missing column {col!r}")
        _check_types(cohort, centers, paths["cohort"], paths["centers"])
        return cls.from_frames(cohort.select(_REQUIRED_COHORT), centers, min_train, source=str(paths["cohort"]))

    @classmethod
    def from_frames(
        cls, cohort: pl.DataFrame, centers: pl.DataFrame, min_train: int = 1, source: str = "cohort"
    ) -> "FederatedData":
        """Build from in-memory frames with the contract's columns (see :meth:`from_cohort`)."""
        bad = set(cohort["split"].unique().to_list()) - set(SPLITS)
        if bad:
            raise InputError(f"{source}: column 'split' holds values other than train/val/test")
        n_tr = cohort.filter(pl.col("split") == "train").group_by("center_id").len()
        keep = n_tr.filter(pl.col("len") >= max(1, min_train))["center_id"]
        gone = cohort.filter(~pl.col("center_id").is_in(keep.implode()))
        n_gone = centers.filter(~pl.col("center_id").is_in(keep.implode())).height
        dropped = {"centers": int(max(n_gone, gone["center_id"].n_unique())), "stays": int(gone.height),
                   "deaths": int(gone["label"].sum() or 0), "min_train": int(max(1, min_train))}
        centers = centers.filter(pl.col("center_id").is_in(keep.implode()))
        if centers.height == 0:
            raise InputError(f"{source}: no center has >= {max(1, min_train)} train rows")
        center_ids = centers["center_id"].to_list()
        index = {c: i for i, c in enumerate(center_ids)}
        cohort = cohort.filter(pl.col("center_id").is_in(keep.implode())).with_columns(
            pl.col("center_id").replace_strict(index, return_dtype=pl.Int64).alias("_c")
        )

        # one-hot vocabulary: categories of the whole file (schema fact)
        cat_exprs, cat_names = [], []
        for col in CATEGORICAL_FEATURES:
            filled = pl.col(col).cast(pl.Utf8).fill_null("UNKNOWN")
            for v in sorted(cohort.select(filled.unique())[col].to_list()):
                cat_exprs.append((filled == v).cast(pl.Float32).alias(f"{col}={v}"))
                cat_names.append(f"{col}={v}")

        # per-center train statistics (median for imputation, then mean / std)
        num = list(NUMERIC_FEATURES)
        train = cohort.filter(pl.col("split") == "train")
        med = train.group_by("_c").agg([pl.col(c).cast(pl.Float64).median().alias(c) for c in num])
        imputed_train = train.select(
            "_c", *[pl.col(c).cast(pl.Float64) for c in num]
        ).join(med, on="_c", suffix="_med").select(
            "_c", *[pl.col(c).fill_null(pl.col(f"{c}_med")).alias(c) for c in num]
        )
        mu = imputed_train.group_by("_c").agg([pl.col(c).mean() for c in num])
        sd = imputed_train.group_by("_c").agg([pl.col(c).std(ddof=0) for c in num])
        n = len(center_ids)
        stat = {}
        for name, frame in (("med", med), ("mu", mu), ("sd", sd)):
            arr = np.full((n, len(num)), np.nan)
            arr[frame["_c"].to_numpy()] = frame.select(num).to_numpy()
            stat[name] = arr
        stat["med"] = np.nan_to_num(stat["med"], nan=0.0)  # column never charted in this center's train
        stat["mu"] = np.nan_to_num(stat["mu"], nan=0.0)
        sd_arr = np.nan_to_num(stat["sd"], nan=1.0)
        stat["sd"] = np.where(sd_arr > 0, sd_arr, 1.0)

        c_all = cohort["_c"].to_numpy()
        xn = cohort.select([pl.col(c).cast(pl.Float64) for c in num]).to_numpy()
        xn = np.where(np.isnan(xn), stat["med"][c_all], xn)
        xn = (xn - stat["mu"][c_all]) / stat["sd"][c_all]
        xb = cohort.select([pl.col(c).cast(pl.Float64).fill_null(0.0) for c in BINARY_FEATURES]).to_numpy()
        xc = cohort.select(cat_exprs).to_numpy() if cat_exprs else np.zeros((cohort.height, 0))
        x_all = torch.from_numpy(np.concatenate([xn, xb, xc], axis=1).astype(np.float32))
        y_all = torch.from_numpy(cohort["label"].cast(pl.Float32).to_numpy().copy())
        split_all = cohort["split"].to_numpy()
        c_t = torch.from_numpy(np.array(c_all, dtype=np.int64))

        splits: dict[str, SplitTensors] = {}
        for s in SPLITS:
            rows = torch.from_numpy(np.flatnonzero(split_all == s))
            cs = c_t[rows]
            counts = torch.bincount(cs, minlength=n)
            order = torch.argsort(cs, stable=True)  # file order inside a center
            cs_sorted = cs[order]
            starts = torch.cumsum(counts, 0) - counts
            pos = torch.arange(len(rows)) - starts[cs_sorted]
            m = int(counts.max()) if len(rows) else 0
            x = torch.zeros(n, m, x_all.shape[1])
            y = torch.zeros(n, m)
            mask = torch.zeros(n, m, dtype=torch.bool)
            src = rows[order]
            x[cs_sorted, pos] = x_all[src]
            y[cs_sorted, pos] = y_all[src]
            mask[cs_sorted, pos] = True
            splits[s] = SplitTensors(x, y, mask, counts)

        meta = torch.tensor(centers.select(list(META_COLUMNS)).fill_null(0.0).to_numpy(), dtype=torch.float32)
        care = centers["care_unit"].to_list() if "care_unit" in centers.columns else ["" for _ in center_ids]
        return cls(
            center_ids=center_ids,
            feature_names=[*NUMERIC_FEATURES, *BINARY_FEATURES, *cat_names],
            splits=splits,
            meta=meta,
            meta_base=meta[:, : len(META_BASE_COLUMNS)].clone(),
            care_units=care,
            dropped=dropped,
        )


__all__ = ["FederatedData", "SplitTensors"]

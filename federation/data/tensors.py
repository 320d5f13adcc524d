"""Federated data: per-center, per-split tensors stacked along a leading center axis.

Design notes: docs/runtime.md, "Module notes".
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from etl.errors import InputError
from etl.io import check_cohort_files, cohort_file_digests
from etl.schema import (
    BINARY_FEATURES,
    CATEGORICAL_FEATURES,
    META_BASE_COLUMNS,
    META_COLUMNS,
    NUMERIC_FEATURES,
    SPLITS,
)
from federation.core.config import DataConfig
from federation.core.evaluation import group_codes
from federation.core.metrics import batched_auroc

#: The cohort.parquet columns training reads (etl.schema): what a center loads from its own rows.
COHORT_COLUMNS_READ = ("center_id", "split", "label", *NUMERIC_FEATURES, *BINARY_FEATURES, *CATEGORICAL_FEATURES)


#: the largest finite float32: the engine reads features and center metadata as float32
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def cohort_id(cohort_dir: str | Path) -> str:
    """SHA-256 (first 16 hex digits) of ``cohort.parquet`` then ``centers.parquet`` bytes.

    Identifies the cohort's content, not its path (a copied cohort resumes the same sweep cells;
    runs on different cohorts are never pooled by ``abps report``).

    Raises:
        InputError: a file is missing.
    """
    return cohort_file_digests(cohort_dir)[0][:16]


def _check_split(cohort: pl.DataFrame, source: str | Path) -> None:
    """Refuse a ``split`` column that is not text or holds a value other than train / val / test
    (or a null); the message counts the rows and quotes no value (a value could be a patient's).

    Raises:
        InputError: naming ``source`` and the column.
    """
    col = cohort["split"]
    if col.dtype not in (pl.Utf8, pl.Categorical, pl.Enum):
        raise InputError(f"{source}: column 'split' must be text (train / val / test), got {col.dtype}")
    n_bad = int((~col.cast(pl.Utf8).is_in(list(SPLITS))).fill_null(True).sum())
    if n_bad:
        raise InputError(f"{source}: column 'split' holds {n_bad} row(s) with a value other than train / val / test")


def check_unique_centers(center_ids: list[str], centers_path: Path) -> None:
    """Refuse a centers.parquet that lists a center_id twice (``abps train`` and ``abps launch`` /
    ``abps peer`` alike, before any work).

    Raises:
        InputError: naming the file and the column.
    """
    if len(set(center_ids)) != len(center_ids):
        raise InputError(f"{centers_path}: column 'center_id' is not unique")


def _check_types(cohort: pl.DataFrame, centers: pl.DataFrame, cohort_path: Path, centers_path: Path) -> None:
    """Validate the contract's value domains; raise InputError naming the file and column.

    The label must be 0/1 without nulls; numeric and binary features must be numbers (nulls are
    allowed and imputed, infinities are not); ``center_id`` must be text in both files and
    every cohort center must have a row in centers.parquet, which lists each center once, none
    without rows, with the cohort's ``n_train`` / ``n_val`` / ``n_test``; metadata must be finite
    numbers.
    """
    for frame, path in ((cohort, cohort_path), (centers, centers_path)):
        if frame.schema["center_id"] != pl.Utf8:
            raise InputError(f"{path}: column 'center_id' must be text, got {frame.schema['center_id']}")
    _check_split(cohort, cohort_path)
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
        if dt.is_float() and (cohort[col].abs() > _FLOAT32_MAX).any():  # training reads float32
            raise InputError(f"{cohort_path}: column {col!r} holds values beyond float32's range (|x| > 3.4e38)")
    trained = cohort.filter(pl.col("split") == "train")["center_id"].unique().implode()
    used = centers.filter(pl.col("center_id").is_in(trained))  # centers without train rows are dropped later
    for col in META_COLUMNS:
        dt = centers.schema[col]
        if not dt.is_numeric():
            raise InputError(f"{centers_path}: column {col!r} must be numeric, got {dt}")
        if used[col].null_count() or (dt.is_float() and not (used[col].is_finite() & (used[col].abs() <= _FLOAT32_MAX)).all()):
            raise InputError(f"{centers_path}: column {col!r} must hold finite numbers (within float32's range)")
    missing = set(cohort["center_id"].unique().to_list()) - set(centers["center_id"].to_list())
    if missing:
        raise InputError(f"{centers_path}: {len(missing)} center(s) of cohort.parquet have no row here")
    check_unique_centers(centers["center_id"].to_list(), centers_path)
    if empty := sorted(set(centers["center_id"].to_list()) - set(cohort["center_id"].unique().to_list())):
        raise InputError(f"{centers_path}: center {empty[0]!r} has no row in {cohort_path.name}"
                         f"{f' (and {len(empty) - 1} more)' if len(empty) > 1 else ''}")
    # its split counts are the cohort's (center ids are named; no patient value is)
    counts = cohort.group_by("center_id").agg([(pl.col("split") == s).sum().alias(f"_n_{s}") for s in SPLITS])
    joined = centers.join(counts, on="center_id", how="left")
    for s in SPLITS:
        col = f"n_{s}"
        if col in centers.columns:
            bad = joined.filter(pl.col(col).cast(pl.Int64, strict=False).ne_missing(pl.col(f"_n_{s}")))
            if bad.height:
                row = bad.row(0, named=True)
                raise InputError(f"{centers_path}: column {col!r} of center {row['center_id']!r} is {row[col]}, but "
                                 f"{cohort_path.name} holds {row[f'_n_{s}']} {s} row(s) of it")


_REQUIRED = object()


class _PaddedView:
    """A padded ``[n_centers, max_rows, k]`` tensor kept beside its packed form (attribute
    ``packed``: the real rows center by center, then one padding row). Assigning it drops the packed
    form (rebuilt from it on demand); reading it builds it once from the packed rows, padding with
    ``fill``. A dataclass field: ``default`` is its default (none: required)."""

    def __init__(self, packed: str, fill: float, default: Any = _REQUIRED) -> None:
        self.packed, self.fill, self.default = packed, fill, default

    def __set_name__(self, owner: type, name: str) -> None:
        self.cache = f"_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:  # class access: the field's default; AttributeError tells dataclass there is none
            if self.default is _REQUIRED:
                raise AttributeError(self.cache[1:])
            return self.default
        value, packed = getattr(obj, self.cache), getattr(obj, self.packed)
        if value is None and packed is not None:
            value = packed.new_full((*obj.mask.shape, packed.shape[1]), self.fill)
            value[obj.mask] = packed[:-1]
            setattr(obj, self.cache, value)
        return value

    def __set__(self, obj: Any, value: torch.Tensor | None) -> None:
        setattr(obj, self.cache, value)
        setattr(obj, self.packed, None)


@dataclass
class SplitTensors:
    """One split of every center: features stored packed, labels and masks padded.

    Attributes:
        x: ``[n_centers, max_rows, d]`` float32 features, padded (zeros on padding). A view
            built on first access from the packed rows (:attr:`packed_x`) and then kept: the
            engine's training, prediction and coalition scoring read the packed rows and never
            build it, so a federation of very unequal centers (10,000 FedProx-Synthetic centers:
            largest train split 2,473 rows, mean 210) holds its features once, unpadded.
        y: ``[n_centers, max_rows]`` float32 labels (0/1; 0 on padding).
        mask: ``[n_centers, max_rows]`` bool, True on real rows (real rows come first).
        n: ``[n_centers]`` int64 real rows per center.
        raw: ``[n_centers, max_rows, k]`` float64 numeric features before encoding (NaN =
            missing; NaN on padding), k = len(NUMERIC_FEATURES); the first k columns of ``x``
            are their encoding.

    Built either padded (``SplitTensors(x, y, mask, n, raw)``, e.g. by hand) or packed
    (:meth:`from_packed`); both give the same values everywhere.
    """

    x: torch.Tensor = _PaddedView("_packed", 0.0)  # type: ignore[assignment]
    y: torch.Tensor
    mask: torch.Tensor
    n: torch.Tensor
    raw: torch.Tensor | None = _PaddedView("_raw_packed", float("nan"), default=None)  # type: ignore[assignment]

    @classmethod
    def from_packed(cls, packed: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, n: torch.Tensor,
                    raw_packed: torch.Tensor | None = None) -> SplitTensors:
        """A split whose features are ``packed`` ``[sum(n) + 1, d]``: the real rows of center 0,
        then center 1, ... (the order of ``x[mask]``), then one zero row (what padding reads);
        ``raw_packed`` ``[sum(n) + 1, k]`` float64 the raw numeric values in the same order, then
        one NaN row.

        Raises:
            ValueError: ``packed`` or ``raw_packed`` does not hold ``sum(n) + 1`` rows.
        """
        for name, t in (("features", packed), ("raw values", raw_packed)):
            if t is not None and t.shape[0] != int(n.sum()) + 1:
                raise ValueError(f"packed {name}: expected {int(n.sum()) + 1} rows (sum(n) + 1), got {t.shape[0]}")
        out = cls(None, y, mask, n, None)  # type: ignore[arg-type]
        out._packed, out._raw_packed = packed, raw_packed
        return out

    @property
    def raw_packed(self) -> torch.Tensor | None:
        """``[sum(n) + 1, k]`` float64 raw numeric values in :attr:`packed_x` order, then one NaN
        row; None when the split keeps no raw values."""
        if self._raw_packed is None and self._raw is not None:
            r = self._raw
            self._raw_packed = torch.cat([r[self.mask], r.new_full((1, r.shape[-1]), float("nan"))])
        return self._raw_packed

    def padded_blocks(self, max_cells: int = 1 << 19) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
        """Consecutive blocks of centers ``(lo, hi, raw [hi - lo, w, k], mask [hi - lo, w])``,
        each padded only to its own largest center (w) and holding at most about ``max_cells``
        (center, row) cells: the raw values in the padded form that :func:`numeric_statistics`
        and :func:`encode_numeric` take, without padding every center to the largest one."""
        raw = self.raw_packed
        if raw is None:
            raise ValueError("this split keeps no raw values")
        sizes = self.n.tolist()
        lo = 0
        while lo < len(sizes):
            hi, w = lo + 1, max(1, sizes[lo])
            while hi < len(sizes) and (hi + 1 - lo) * max(w, sizes[hi]) <= max_cells:
                w = max(w, sizes[hi])
                hi += 1
            centers, pos = torch.arange(lo, hi), torch.arange(w).unsqueeze(0)
            idx = self.packed_index(centers, pos)
            yield lo, hi, raw[idx], pos < self.n[lo:hi].unsqueeze(1)
            lo = hi

    @property
    def packed_x(self) -> torch.Tensor:
        """``[sum(n) + 1, d]`` float32 real rows, center by center (``x[mask]``), then one zero row."""
        if getattr(self, "_packed", None) is None:
            x = self._x
            self._packed = torch.cat([x[self.mask], x.new_zeros(1, x.shape[-1])])
        return self._packed

    @property
    def packed_y(self) -> torch.Tensor:
        """``[sum(n) + 1]`` float32 labels in :attr:`packed_x` order, then one 0 (built on each
        access from ``y``, so a label change in ``y`` is always seen)."""
        return torch.cat([self.y[self.mask], self.y.new_zeros(1)])

    @property
    def offsets(self) -> torch.Tensor:
        """``[n_centers]`` int64 row of :attr:`packed_x` where each center's rows start."""
        return torch.cumsum(self.n, 0) - self.n

    def packed_index(self, centers: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Rows of :attr:`packed_x` / :attr:`packed_y` for positions ``pos`` ``[c, w]`` (int64,
        >= 0) of ``centers`` ``[c]``; a position past a center's real rows reads the zero row."""
        flat = self.offsets[centers].unsqueeze(1) + pos
        return torch.where(pos < self.n[centers].unsqueeze(1), flat, int(self.n.sum()))

    def rows(self, centers: torch.Tensor, width: int) -> torch.Tensor:
        """``[c, width, d]`` features of ``centers`` ``[c]``: ``x[centers, :width]`` (zeros past
        a center's real rows), gathered from the packed rows unless the padded ``x`` is held."""
        if self._x is not None:
            return self._x[centers, :width]
        idx = self.packed_index(centers, torch.arange(width).unsqueeze(0))
        return self.packed_x.index_select(0, idx.view(-1)).view(centers.numel(), width, -1)


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
        data_config: the DataConfig the encoding was built with.
        preprocessing: the numeric encoding in use (a resolved DataConfig mode, never ``auto``).
        encoding_bytes: bytes a real federation exchanges to fit that encoding (0 for
            ``per-center`` and ``pooled``); the runner charges them to round 1's metadata.
        groups: ``{split: [n, max_rows, 3]}`` int64 subgroup codes per row (sex, age band, race
            group; :func:`federation.core.evaluation.group_codes`), -1 on unknown values and padding;
            empty when the frames lack gender / age / race. Never a model feature: only the
            end-of-run subgroup table reads it.
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
    preprocessing: str = "per-center"
    encoding_bytes: int = 0
    data_config: DataConfig | None = field(default=None, repr=False)
    dropped: dict[str, int] = field(default_factory=dict)
    groups: dict[str, torch.Tensor] = field(default_factory=dict)

    #: the per-center figure of :meth:`split_metric`; an image federation (federation.data.images) says "accuracy"
    metric_name = "auroc"
    #: the clinical end-of-run figures (federation.core.evaluation) apply; False for an image federation
    clinical = True

    def split_metric(self, scores: torch.Tensor, split: str) -> torch.Tensor:
        """``[n]`` float64 per-center AUROC of ``scores [n, rows]`` on ``split`` (NaN for a one-class
        center; ABPS paper Sec. 6.3). The runner and ``Context.evaluate`` score every split through
        this hook, so an image federation can answer with accuracy (federation.data.images)."""
        s = self.splits[split]
        return batched_auroc(scores, s.y, s.mask)

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

    def pooled(self) -> FederatedData:
        """The union of all centers' rows as one center (for the Centralized reference).

        Rows keep this object's encoding; the runner first re-encodes with ``pooled``
        statistics for the Centralized reference (:meth:`with_preprocessing`), so the pooled
        model sees one encoding fitted on the pooled train split.
        """
        out: dict[str, SplitTensors] = {}
        for name, s in self.splits.items():
            x = s.packed_x[:-1].unsqueeze(0)
            y = s.y[s.mask].unsqueeze(0)
            raw = s.raw_packed[:-1].unsqueeze(0) if s.raw_packed is not None else None
            m = torch.ones(y.shape, dtype=torch.bool)
            out[name] = SplitTensors(x, y, m, torch.tensor([y.shape[1]], dtype=torch.int64), raw)
        w = self.n_train.double() / self.n_train.sum()
        return FederatedData(
            center_ids=["pooled"],
            feature_names=self.feature_names,
            splits=out,
            meta=(w.unsqueeze(1) * self.meta.double()).sum(0, keepdim=True).float(),
            meta_base=(w.unsqueeze(1) * self.meta_base.double()).sum(0, keepdim=True).float(),
            care_units=["pooled"],
            preprocessing=self.preprocessing,
        )

    def with_preprocessing(self, cfg: DataConfig) -> FederatedData:
        """This federation with its numeric columns re-encoded by ``cfg`` (self when the
        resolved mode and its knobs give the same encoding as the current one).

        Raises:
            InputError: raw values were not kept (built by hand), or a ``per-center`` encoding
                meets a small center with ``small_center: refuse``.
        """
        if self.data_config == cfg:
            return self
        tr = self.splits["train"]
        mode = resolve_preprocessing(cfg, tr.n)
        if any(s.raw_packed is None for s in self.splits.values()):
            if cfg == DataConfig():  # built by hand, already encoded by its builder: nothing asked of it
                return self
            raise InputError("re-encoding needs the raw numeric values (build with FederatedData.from_cohort)")
        med, mu, sd, nbytes = _fit_numeric(tr, cfg, mode)
        splits = {}
        for name, s in self.splits.items():
            xp = s.packed_x.clone()
            _set_numeric(xp, s, med, mu, sd)
            splits[name] = SplitTensors.from_packed(xp, s.y, s.mask, s.n, s.raw_packed)
        return replace(self, splits=splits, preprocessing=mode, encoding_bytes=nbytes, data_config=cfg)

    @classmethod
    def from_cohort(cls, cohort_dir: str | Path, min_train: int = 1,
                    preprocessing: DataConfig | None = None) -> FederatedData:
        """Read a cohort directory and build the stacked tensors.

        Args:
            cohort_dir: directory holding ``cohort.parquet`` and ``centers.parquet``.
            min_train: centers with fewer train rows are dropped (>= 1 always).
            preprocessing: the numeric encoding (default ``DataConfig()``: ``auto``).

        Raises:
            InputError: a file or a required column is missing, a split value is unknown,
                the two files are not the ones the folder's manifest records
                (:func:`etl.io.check_cohort_files`), no center is left, or a ``per-center`` encoding meets a center smaller than
                ``min_center_rows`` with ``small_center: refuse``.
        """
        cohort_dir = Path(cohort_dir)
        paths = {name: cohort_dir / f"{name}.parquet" for name in ("cohort", "centers")}
        for name, p in paths.items():
            if not p.is_file():
                raise InputError(f"{p}: file not found (expected {name}.parquet from `abps etl`)")
        check_cohort_files(cohort_dir)
        frames = {}
        for name, p in paths.items():
            try:
                frames[name] = pl.read_parquet(p)
            except Exception as exc:  # polars / arrow errors on a corrupt or non-Parquet file
                raise InputError(f"{p}: not a readable Parquet file ({exc.__class__.__name__})") from None
        cohort, centers = frames["cohort"], frames["centers"]
        for col in COHORT_COLUMNS_READ:
            if col not in cohort.columns:
                raise InputError(f"{paths['cohort']}: missing column {col!r}")
        for col in ("center_id", *META_COLUMNS):
            if col not in centers.columns:
                raise InputError(f"{paths['centers']}: missing column {col!r}")
        if "stay_id" in cohort.columns and (extra := cohort.height - cohort["stay_id"].n_unique()) > 0:
            # a stay twice would count twice (and could sit in two splits); its id is not printed
            raise InputError(f"{paths['cohort']}: column 'stay_id' repeats a stay on {extra} row(s); "
                             "the cohort holds one row per ICU stay")
        _check_types(cohort, centers, paths["cohort"], paths["centers"])
        return cls.from_frames(cohort.select(COHORT_COLUMNS_READ), centers, min_train, source=str(paths["cohort"]),
                               preprocessing=preprocessing)

    @classmethod
    def from_frames(
        cls, cohort: pl.DataFrame, centers: pl.DataFrame, min_train: int = 1, source: str = "cohort",
        preprocessing: DataConfig | None = None, categories: dict[str, list[str]] | None = None,
        fit: NumericFit | None = None,
    ) -> FederatedData:
        """Build from in-memory frames with the contract's columns (see :meth:`from_cohort`).

        ``categories`` (``{column: sorted values}``) replaces the one-hot vocabulary read from the
        frame, and ``fit(train, cfg) -> (mode, median, mean, std, bytes)`` the numeric encoding's fit:
        a peer holding one center's rows builds its tensors with the federation's vocabulary and
        statistics (federation/p2p/local.py)."""
        _check_split(cohort, source)
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
            vocab = categories[col] if categories is not None else cohort.select(filled.unique())[col].to_list()
            for v in sorted(vocab):
                cat_exprs.append((filled == v).cast(pl.Float32).alias(f"{col}={v}"))
                cat_names.append(f"{col}={v}")

        num = list(NUMERIC_FEATURES)
        n = len(center_ids)
        c_all = cohort["_c"].to_numpy()
        xn = cohort.select([pl.col(c).cast(pl.Float64) for c in num]).to_numpy()
        xb = cohort.select([pl.col(c).cast(pl.Float64).fill_null(0.0) for c in BINARY_FEATURES]).to_numpy()
        xc = cohort.select(cat_exprs).to_numpy() if cat_exprs else np.zeros((cohort.height, 0))
        # numeric columns stay raw (NaN) here and are encoded below, once the train split is stacked
        x_all = torch.from_numpy(np.concatenate([np.zeros_like(xn), xb, xc], axis=1).astype(np.float32))
        raw_all = torch.from_numpy(xn)
        y_all = torch.from_numpy(cohort["label"].cast(pl.Float32).to_numpy().copy())
        split_all = cohort["split"].to_numpy()
        c_t = torch.from_numpy(np.array(c_all, dtype=np.int64))
        has_groups = all(c in cohort.columns for c in ("gender", "age", "race"))
        g_all = torch.from_numpy(group_codes(cohort)) if has_groups else None
        groups: dict[str, torch.Tensor] = {}

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
            y = torch.zeros(n, m)
            mask = torch.zeros(n, m, dtype=torch.bool)
            src = rows[order]
            # features and raw values packed (center by center, file order inside a center)
            xp = torch.cat([x_all[src], x_all.new_zeros(1, x_all.shape[1])])
            rp = torch.cat([raw_all[src], raw_all.new_full((1, raw_all.shape[1]), float("nan"))])
            y[cs_sorted, pos] = y_all[src]
            mask[cs_sorted, pos] = True
            splits[s] = SplitTensors.from_packed(xp, y, mask, counts, rp)
            if g_all is not None:
                groups[s] = torch.full((n, m, g_all.shape[1]), -1, dtype=torch.int64)
                groups[s][cs_sorted, pos] = g_all[src]

        meta = torch.tensor(centers.select(list(META_COLUMNS)).fill_null(0.0).to_numpy(), dtype=torch.float32)
        care = centers["care_unit"].to_list() if "care_unit" in centers.columns else ["" for _ in center_ids]
        cfg = preprocessing if preprocessing is not None else DataConfig()
        tr = splits["train"]
        if fit is not None:
            mode, med, mu, sd, nbytes = fit(tr, cfg)
        else:
            mode = resolve_preprocessing(cfg, tr.n)
            med, mu, sd, nbytes = _fit_numeric(tr, cfg, mode)
        for st in splits.values():
            _set_numeric(st.packed_x, st, med, mu, sd)
        return cls(
            center_ids=center_ids,
            feature_names=[*NUMERIC_FEATURES, *BINARY_FEATURES, *cat_names],
            splits=splits,
            meta=meta,
            meta_base=meta[:, : len(META_BASE_COLUMNS)].clone(),
            care_units=care,
            preprocessing=mode,
            encoding_bytes=nbytes,
            data_config=cfg,
            dropped=dropped,
            groups=groups,
        )




#: ``fit(train split, cfg) -> (mode, median [n, k], mean [n, k], std [n, k], bytes exchanged)``
NumericFit = Callable[["SplitTensors", DataConfig], tuple[str, np.ndarray, np.ndarray, np.ndarray, int]]


def _fit_numeric(train: SplitTensors, cfg: DataConfig, mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`numeric_statistics` of the ``train`` split. A ``per-center`` fit uses only each
    center's own rows, so it runs on blocks of centers each padded to its own largest center
    (:meth:`SplitTensors.padded_blocks`; same values, memory bounded by the block); the other
    modes pool centers and take the whole padded split."""
    if mode != "per-center":
        assert train.raw is not None
        return numeric_statistics(train.raw, train.mask, cfg, mode)
    parts = [numeric_statistics(raw, mask, cfg, mode)[:3] for _, _, raw, mask in train.padded_blocks()]
    med, mu, sd = (np.concatenate([p[i] for p in parts]) for i in range(3))
    return med, mu, sd, 0


def _set_numeric(packed: torch.Tensor, split: SplitTensors, med: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> None:
    """Write the encoded numeric columns (:func:`encode_numeric` of ``split``'s raw values, per
    center statistics ``[n, k]``) into the first k columns of ``packed`` ``[sum(n) + 1, d]``
    (the split's packed layout), in place, block of centers by block of centers."""
    k = len(NUMERIC_FEATURES)
    for lo, hi, raw, mask in split.padded_blocks():
        rows = slice(int(split.n[:lo].sum()), int(split.n[:hi].sum()))
        packed[rows, :k] = encode_numeric(raw, mask, med[lo:hi], mu[lo:hi], sd[lo:hi])[mask]


#: Public value range per numeric feature for the federated histogram (the mergeable quantile
#: sketch): the ETL's valid ranges (etl/mimic.py VITAL_ITEMS, mimic-code's vitalsign concept;
#: temperature in Celsius) and the contract's age bounds. Schema facts, not statistics: every
#: center bins on the same edges, so histograms add. Values outside are counted in the edge bins.
HISTOGRAM_RANGES: dict[str, tuple[float, float]] = {
    "age": (0.0, 120.0), "heart_rate": (0.0, 300.0), "sbp": (0.0, 400.0), "dbp": (0.0, 300.0),
    "mbp": (0.0, 300.0), "resp_rate": (0.0, 70.0), "spo2": (0.0, 100.0), "temperature": (10.0, 50.0),
}


def _ranges() -> np.ndarray:
    """``[k, 2]`` histogram (low, high) per NUMERIC_FEATURES column."""
    return np.array([HISTOGRAM_RANGES[c if c in HISTOGRAM_RANGES else c.rsplit("_", 1)[0]]
                     for c in NUMERIC_FEATURES], dtype=np.float64)


def resolve_preprocessing(cfg: DataConfig, n_train: torch.Tensor) -> str:
    """The concrete mode of ``cfg.preprocessing`` for centers with ``n_train`` ``[n]`` train rows.

    ``auto`` -> ``per-center`` when the median center has >= ``cfg.min_center_rows`` train rows,
    else ``federated``. For ``per-center`` (asked for or resolved), centers below
    ``min_center_rows`` give a UserWarning (``small_center: warn``) or an InputError
    (``refuse``): their own median / mean / std rest on too few rows.
    """
    mode = cfg.preprocessing
    if mode == "auto":
        mode = "per-center" if float(n_train.double().median()) >= cfg.min_center_rows else "federated"
    if mode == "per-center":
        small = int((n_train < cfg.min_center_rows).sum())
        if small:
            msg = (f"per-center preprocessing: {small} of {n_train.numel()} centers have fewer than "
                   f"{cfg.min_center_rows} train rows for their own median / mean / std "
                   f"(consider data.preprocessing: federated or shrinkage)")
            if cfg.small_center == "refuse":
                raise InputError(msg)
            warnings.warn(msg, UserWarning, stacklevel=3)
    return mode


def federation_aggregates(raw: torch.Tensor, mask: torch.Tensor, bins: int) -> dict[str, np.ndarray]:
    """What each center can share about its train split's numeric features: no row, only sums.

    Args:
        raw: ``[n, m, k]`` float64 raw values (NaN = missing or padding).
        mask: ``[n, m]`` bool real rows.
        bins: histogram bins per feature on the fixed :data:`HISTOGRAM_RANGES` edges.

    Returns:
        ``rows [n]``, ``count [n, k]`` observed values, ``sum [n, k]``, ``sumsq [n, k]``,
        ``hist [n, k, bins]`` counts.
    """
    x = raw.numpy()
    obs = ~np.isnan(x) & mask.numpy()[:, :, None]
    xz = np.where(obs, x, 0.0)
    rng = _ranges()
    width = (rng[:, 1] - rng[:, 0]) / bins
    b = np.clip(np.floor((xz - rng[:, 0]) / width), 0, bins - 1).astype(np.int64)  # [n, m, k]
    n, m, k = x.shape
    hist = np.zeros((n, k, bins))
    ci = np.broadcast_to(np.arange(n)[:, None, None], b.shape)
    fi = np.broadcast_to(np.arange(k)[None, None, :], b.shape)
    np.add.at(hist, (ci[obs], fi[obs], b[obs]), 1.0)
    return {"rows": mask.sum(1).numpy().astype(np.float64), "count": obs.sum(1).astype(np.float64),
            "sum": xz.sum(1), "sumsq": (xz * xz).sum(1), "hist": hist}


def histogram_median(hist: np.ndarray, bins: int) -> np.ndarray:
    """Median per feature of merged histograms ``[k, bins]`` on :data:`HISTOGRAM_RANGES` edges,
    linear inside the bin that holds half the mass (error below one bin width); NaN for a
    feature with no value. Returns ``[k]``."""
    rng = _ranges()
    width = (rng[:, 1] - rng[:, 0]) / bins
    total = hist.sum(1)
    cum = np.cumsum(hist, 1)
    half = total / 2
    j = np.minimum((cum < half[:, None]).sum(1), bins - 1)  # first bin with cum >= half
    before = np.take_along_axis(cum, j[:, None], 1)[:, 0] - np.take_along_axis(hist, j[:, None], 1)[:, 0]
    inbin = np.take_along_axis(hist, j[:, None], 1)[:, 0]
    frac = np.where(inbin > 0, (half - before) / np.where(inbin > 0, inbin, 1.0), 0.5)
    med = rng[:, 0] + (j + frac) * width
    return np.where(total > 0, med, np.nan)


def imputed_moments(rows, count, s1, s2, fill):
    """Mean and population std of values imputed with ``fill`` from the aggregates (rows
    broadcastable to count / sum / sumsq): ``mean = (sum + (rows - count) fill) / rows``; a
    center computes its own from the federation's aggregates (federation/p2p/local.py)."""
    miss = rows - count
    r = np.maximum(rows, 1.0)
    mean = (s1 + miss * fill) / r
    var = (s2 + miss * fill * fill) / r - mean * mean
    return mean, np.sqrt(np.maximum(var, 0.0))


def numeric_statistics(raw: torch.Tensor, mask: torch.Tensor, cfg: DataConfig, mode: str
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Imputation value, mean and std per center and numeric feature, fitted on the train split.

    Args:
        raw: ``[n, m, k]`` float64 train-split raw values (NaN = missing or padding).
        mask: ``[n, m]`` bool real train rows.
        cfg: bins and shrinkage strength.
        mode: ``per-center`` | ``federated`` | ``shrinkage`` | ``pooled`` (resolved).

    Returns:
        ``(median, mean, std)`` each ``[n, k]`` float64 (a feature never observed gets median
        and mean 0, a constant one std 1), and the bytes a federation exchanges to fit them:
        for ``federated`` / ``shrinkage``, per center an upload of 8-byte row count, value
        counts, sums and sums of squares and 4-byte histogram counts, and a download of the
        federation's three 8-byte statistics per feature; 0 for ``per-center`` and ``pooled``.
    """
    n, m, k = raw.shape
    x = raw.numpy().copy()
    x[~mask.numpy()] = np.nan
    with warnings.catch_warnings():  # a center or feature without any value: NaN, fixed below
        warnings.simplefilter("ignore", RuntimeWarning)
        own_med = np.nanmedian(x, axis=1) if m else np.full((n, k), np.nan)  # [n, k]
    rows = mask.sum(1).numpy().astype(np.float64)
    nbytes = 0
    if mode == "pooled":
        flat = x.reshape(n * m, k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            g_med = np.nan_to_num(np.nanmedian(flat, axis=0) if flat.size else np.full(k, np.nan))
        filled = np.where(np.isnan(flat), g_med, flat)[mask.numpy().reshape(-1)]
        med = np.broadcast_to(g_med, (n, k))
        mu = np.broadcast_to(filled.mean(0) if len(filled) else np.zeros(k), (n, k))
        sd = np.broadcast_to(filled.std(0) if len(filled) else np.ones(k), (n, k))
    elif mode == "per-center":
        med = np.nan_to_num(own_med)
        filled = np.where(np.isnan(x), med[:, None, :], x)
        r = np.maximum(rows, 1.0)[:, None]
        mu = np.where(mask.numpy()[:, :, None], filled, 0.0).sum(1) / r
        sd = np.sqrt(np.where(mask.numpy()[:, :, None], (filled - mu[:, None, :]) ** 2, 0.0).sum(1) / r)
    elif mode in ("federated", "shrinkage"):
        agg = federation_aggregates(raw, mask, cfg.histogram_bins)
        g_med = np.nan_to_num(histogram_median(agg["hist"].sum(0), cfg.histogram_bins))  # [k]
        g_mu, g_sd = imputed_moments(agg["rows"].sum(), agg["count"].sum(0), agg["sum"].sum(0),
                                      agg["sumsq"].sum(0), g_med)
        nbytes = n * (8 * (1 + 3 * k) + 4 * k * cfg.histogram_bins) + n * 8 * 3 * k
        if mode == "federated":
            med = np.broadcast_to(g_med, (n, k))
            mu, sd = np.broadcast_to(g_mu, (n, k)), np.broadcast_to(g_sd, (n, k))
        else:
            lam_v = agg["count"] / (agg["count"] + cfg.shrinkage_rows)  # [n, k] per observed value
            med = lam_v * np.nan_to_num(own_med) + (1 - lam_v) * g_med
            c_mu, c_sd = imputed_moments(agg["rows"][:, None], agg["count"], agg["sum"], agg["sumsq"], med)
            lam = (rows / (rows + cfg.shrinkage_rows))[:, None]  # [n, 1] per row
            mu = lam * c_mu + (1 - lam) * g_mu
            sd = np.sqrt(lam * c_sd ** 2 + (1 - lam) * g_sd ** 2)
    else:
        raise ValueError(f"unknown preprocessing mode {mode!r}")
    sd = np.where(np.nan_to_num(sd, nan=0.0) > 0, sd, 1.0)
    return np.asarray(med, dtype=np.float64), np.nan_to_num(np.asarray(mu, dtype=np.float64)), \
        np.asarray(sd, dtype=np.float64), int(nbytes)


def encode_numeric(raw: torch.Tensor, mask: torch.Tensor, med: np.ndarray, mu: np.ndarray, sd: np.ndarray
                   ) -> torch.Tensor:
    """``[n, m, k]`` float32 encoded numeric features ``(fill(raw, med) - mu) / sd`` per center
    (statistics ``[n, k]``); 0 on padding rows."""
    x = raw.numpy()
    x = np.where(np.isnan(x), med[:, None, :], x)
    x = (x - mu[:, None, :]) / sd[:, None, :]
    x = np.where(mask.numpy()[:, :, None], x, 0.0)
    return torch.from_numpy(x.astype(np.float32))


__all__ = ["FederatedData", "SplitTensors", "check_unique_centers", "encode_numeric", "federation_aggregates",
           "histogram_median", "numeric_statistics", "resolve_preprocessing"]

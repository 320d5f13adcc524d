"""A peer's own data: the rows of its one center, read with a filter applied at read time (no other
center's row is ever loaded), the public facts it announces to its peers, and its tensors built
with the federation's vocabulary, encoding and padding (docs/p2p.md, "What a peer loads").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from etl.errors import InputError
from etl.io import check_cohort_files
from etl.schema import CATEGORICAL_FEATURES, META_COLUMNS, NUMERIC_FEATURES
from federation.core.config import DataConfig
from federation.data.tensors import (
    COHORT_COLUMNS_READ,
    FederatedData,
    SplitTensors,
    check_unique_centers,
    federation_aggregates,
    histogram_median,
    imputed_moments,
    numeric_statistics,
    resolve_preprocessing,
)

__all__ = ["OwnRows", "read_own_rows", "center_list", "announce", "build_local", "pad_splits", "SPLITS"]

SPLITS = ("train", "val", "test")


@dataclass
class OwnRows:
    """One center's cohort rows and its row of centers.parquet (never another center's)."""

    center_id: str
    cohort: pl.DataFrame
    center: pl.DataFrame


def center_list(cohort_dir: str | Path) -> list[str]:
    """center_id column of ``centers.parquet`` in file order (the federation's center order).

    Raises:
        InputError: the file is missing, has no center_id column, or lists a center twice.
    """
    p = Path(cohort_dir) / "centers.parquet"
    if not p.is_file():
        raise InputError(f"{p}: file not found (expected centers.parquet from `abps etl`)")
    try:
        ids = pl.read_parquet(p, columns=["center_id"])["center_id"].cast(pl.Utf8).to_list()
    except Exception as exc:  # noqa: BLE001 - polars / arrow errors on a bad file
        raise InputError(f"{p}: no readable center_id column ({exc.__class__.__name__})") from None
    check_unique_centers(ids, p)  # one peer per center: refused before any peer starts
    return ids


def read_own_rows(cohort_dir: str | Path, center_id: str) -> OwnRows:
    """The cohort rows of ``center_id`` alone: ``cohort.parquet`` is scanned with the filter
    ``center_id == own`` pushed into the Parquet reader, so other centers' rows are skipped at read
    time; likewise its own row of ``centers.parquet``.

    Raises:
        InputError: a file or column is missing, or the center has no rows (naming the center).
    """
    d = Path(cohort_dir)
    for name in ("cohort", "centers"):
        if not (d / f"{name}.parquet").is_file():
            raise InputError(f"{d / f'{name}.parquet'}: file not found (expected {name}.parquet from `abps etl`)")
    check_cohort_files(d)
    own = pl.col("center_id").cast(pl.Utf8) == center_id
    try:
        scan = pl.scan_parquet(d / "cohort.parquet")
        names = scan.collect_schema().names()
        missing = [c for c in COHORT_COLUMNS_READ if c not in names]
        if missing:
            raise InputError(f"{d / 'cohort.parquet'}: missing column {missing[0]!r}")
        rows = scan.filter(own).select(COHORT_COLUMNS_READ).collect()
        cscan = pl.scan_parquet(d / "centers.parquet")
        cnames = cscan.collect_schema().names()
        for col in ("center_id", *META_COLUMNS):
            if col not in cnames:
                raise InputError(f"{d / 'centers.parquet'}: missing column {col!r}")
        center = cscan.filter(own).collect()
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - polars / arrow errors on a corrupt file
        raise InputError(f"{d / 'cohort.parquet'}: not a readable Parquet file ({exc.__class__.__name__})") from None
    if center.height != 1:
        raise InputError(f"{d / 'centers.parquet'}: center_id {center_id!r} is not listed once")
    if rows.height == 0:
        raise InputError(f"{d / 'cohort.parquet'}: center_id {center_id!r} has no rows")
    return OwnRows(center_id, rows, center)


def _raw_train(rows: OwnRows) -> tuple[torch.Tensor, torch.Tensor]:
    """``([1, m, k] float64 raw numeric train values, [1, m] mask)`` of the center (no encoding)."""
    k = len(NUMERIC_FEATURES)
    zero, one = np.zeros((1, k)), np.ones((1, k))  # the raw values are kept beside any encoding
    data = FederatedData.from_frames(rows.cohort, rows.center, source="own rows",
                                     fit=lambda tr, c: ("per-center", zero, zero, one, 0))
    tr = data.splits["train"]
    assert tr.raw is not None
    return tr.raw, tr.mask


def announce(rows: OwnRows, cfg: DataConfig) -> dict[str, Any]:
    """What a center tells its peers before round 1 (aggregates only, never a row or an id of a
    stay): rows per split, the categorical values it holds, its metadata vector and, for an encoding
    fitted across centers, its train split's sums and histograms
    (:func:`federation.data.tensors.federation_aggregates`)."""
    df = rows.cohort
    counts = {s: int((df["split"] == s).sum()) for s in SPLITS}
    cats = {c: sorted(df.select(pl.col(c).cast(pl.Utf8).fill_null("UNKNOWN").unique())[c].to_list())
            for c in CATEGORICAL_FEATURES}
    meta = rows.center.select(list(META_COLUMNS)).fill_null(0.0).to_numpy().astype(np.float32)[0]
    out: dict[str, Any] = {"center_id": rows.center_id, "counts": counts, "categories": cats,
                           "meta": [float(v) for v in meta]}
    if counts["train"]:
        raw, mask = _raw_train(rows)
        agg = federation_aggregates(raw, mask, cfg.histogram_bins)
        out["aggregates"] = {k: v[0].tolist() for k, v in agg.items()}
    return out


def pad_splits(data: FederatedData, widths: dict[str, int]) -> FederatedData:
    """``data`` with every split's labels and mask padded to ``widths[split]`` columns (the
    federation's widest center), features left packed: the peer engine then pads batches as the
    K-center engine does."""
    splits = {}
    for name, s in data.splits.items():
        w = max(int(widths[name]), s.mask.shape[1])
        y = torch.zeros(s.y.shape[0], w, dtype=s.y.dtype)
        m = torch.zeros(s.mask.shape[0], w, dtype=torch.bool)
        y[:, : s.y.shape[1]], m[:, : s.mask.shape[1]] = s.y, s.mask
        splits[name] = SplitTensors.from_packed(s.packed_x, y, m, s.n, s.raw_packed)
    groups = {k: torch.cat([g, g.new_full((g.shape[0], max(0, widths[k] - g.shape[1]), g.shape[2]), -1)], 1)
              for k, g in data.groups.items()}
    from dataclasses import replace

    return replace(data, splits=splits, groups=groups)


def build_local(rows: OwnRows, hellos: list[dict[str, Any]], index: int, cfg: DataConfig) -> tuple[FederatedData, int]:
    """The center's :class:`FederatedData` (one center) as the K-center loader would build its row.

    Args:
        rows: the center's own rows.
        hellos: every center's :func:`announce` output, in federation order.
        index: the center's position in ``hellos``.
        cfg: the run's ``data:`` section.

    Returns:
        (data, encoding bytes the federation exchanges for the fit: 0 unless ``federated``).

    Raises:
        InputError: an encoding a peer cannot fit from announced aggregates (``pooled``, ``shrinkage``).
    """
    n_train = torch.tensor([h["counts"]["train"] for h in hellos], dtype=torch.int64)
    mode = resolve_preprocessing(cfg, n_train)
    if mode not in ("per-center", "federated"):
        raise InputError(f"data.preprocessing {mode!r}: a peer-to-peer run fits 'per-center' or 'federated' "
                         "encodings (from announced aggregates)")
    vocab = {c: sorted(set().union(*(h["categories"][c] for h in hellos))) for c in CATEGORICAL_FEATURES}
    n, k = len(hellos), None

    def fit(train: SplitTensors, c: DataConfig) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, int]:
        nonlocal k
        if mode == "per-center":
            med, mu, sd, nbytes = numeric_statistics(train.raw, train.mask, c, mode)
            return mode, med, mu, sd, nbytes
        agg = {key: np.stack([np.asarray(h["aggregates"][key], dtype=np.float64) for h in hellos])
               for key in ("rows", "count", "sum", "sumsq", "hist")}
        k = agg["count"].shape[1]
        g_med = np.nan_to_num(histogram_median(agg["hist"].sum(0), c.histogram_bins))
        g_mu, g_sd = imputed_moments(agg["rows"].sum(), agg["count"].sum(0), agg["sum"].sum(0),
                                     agg["sumsq"].sum(0), g_med)
        g_sd = np.where(np.nan_to_num(g_sd, nan=0.0) > 0, g_sd, 1.0)
        nbytes = n * (8 * (1 + 3 * k) + 4 * k * c.histogram_bins) + n * 8 * 3 * k
        return (mode, g_med[None, :].astype(np.float64), np.nan_to_num(g_mu)[None, :].astype(np.float64),
                g_sd[None, :].astype(np.float64), nbytes)

    data = FederatedData.from_frames(rows.cohort, rows.center, source="own rows", preprocessing=cfg,
                                     categories=vocab, fit=fit)
    widths = {s: max(h["counts"][s] for h in hellos) for s in SPLITS}
    data = pad_splits(data, widths)
    return data, data.encoding_bytes

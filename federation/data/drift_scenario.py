"""A concept-drift scenario for any method (run config ``drift:``): chosen centers flip their labels
from a given round on, on a per-run copy of the labels and metadata. Details: docs/drift.md.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from etl.errors import InputError
from federation.core.config import LabelFlipDrift
from federation.data.tensors import FederatedData

__all__ = ["LabelFlipDrift", "drifting_copy", "apply_drift", "drift_centers"]


def drift_centers(data: FederatedData, drift: LabelFlipDrift) -> torch.Tensor:
    """``[n]`` bool: the centers that flip.

    Raises:
        InputError: an unknown center_id, or ``count`` above the number of centers.
    """
    ids = list(data.center_ids)
    if drift.centers:
        unknown = sorted(set(drift.centers) - set(ids))
        if unknown:
            raise InputError(f"drift.centers: unknown center_id {unknown[0]!r} (the cohort's centers.parquet "
                             f"lists {len(ids)} centers)")
        return torch.tensor([c in set(drift.centers) for c in ids], dtype=torch.bool)
    if drift.count > len(ids):
        raise InputError(f"drift.count {drift.count} exceeds the cohort's {len(ids)} centers")
    order = sorted(range(len(ids)), key=lambda i: (-int(data.n_train[i]), ids[i]))
    out = torch.zeros(len(ids), dtype=torch.bool)
    out[order[: drift.count]] = True
    return out


def drifting_copy(data: FederatedData, drift: LabelFlipDrift | None) -> FederatedData:
    """A copy of ``data`` whose flipping labels and metadata are its own tensors (``data`` when no drift).

    Raises:
        InputError: see :func:`drift_centers`.
    """
    if drift is None:
        return data
    drift_centers(data, drift)  # fail before round 0 on a bad choice
    splits = {k: (replace(s, y=s.y.clone()) if k in drift.splits else s) for k, s in data.splits.items()}
    return replace(data, splits=splits, meta=data.meta.clone(), meta_base=data.meta_base.clone())


def apply_drift(data: FederatedData, drift: LabelFlipDrift | None, round_idx: int) -> bool:
    """At the start of round ``round_idx`` (0-based): flip the chosen centers' labels when it is
    ``drift.round - 1``, in place on a :func:`drifting_copy`. Returns True when it flipped."""
    if drift is None or round_idx != drift.round - 1:
        return False
    c = drift_centers(data, drift)
    for k in drift.splits:
        s = data.splits[k]
        flip = c[:, None] & s.mask
        s.y.copy_(torch.where(flip, 1 - s.y, s.y))
    for meta in (data.meta, data.meta_base):
        meta[:, 0] = torch.where(c, 1 - meta[:, 0], meta[:, 0])
    return True

"""The one place that picks a loader: a cohort directory (``abps etl`` / ``abps synth`` output) or an
image federation (a directory holding ``images.yaml``) becomes a :class:`FederatedData`."""

from __future__ import annotations

from pathlib import Path

from federation.core.config import DataConfig
from federation.data.images import image_federation_id, is_image_federation, load_image_federation
from federation.data.tensors import FederatedData, cohort_id

__all__ = ["load_federation", "federation_id"]


def load_federation(path: str | Path, min_train: int = 1, preprocessing: DataConfig | None = None) -> FederatedData:
    """The federation stored at ``path``: :func:`federation.data.images.load_image_federation` for an
    image federation (``min_train`` and ``preprocessing`` do not apply to images), else
    :meth:`FederatedData.from_cohort`.

    Raises:
        InputError: as the chosen loader (a missing file, a bad column or option, names the file).
    """
    if is_image_federation(path):
        return load_image_federation(path)
    return FederatedData.from_cohort(path, min_train=min_train, preprocessing=preprocessing)


def federation_id(path: str | Path) -> str:
    """16 hex digits identifying the federation's content, not its path: the hash of ``images.yaml``
    for an image federation, else :func:`federation.data.tensors.cohort_id` (the cohort's Parquet bytes).

    Raises:
        InputError: a file is missing.
    """
    return image_federation_id(path) if is_image_federation(path) else cohort_id(path)

"""The engine of a federation: the stacked MLP for a cohort, the stacked SAGE model for an image
federation (the one place that picks an engine)."""

from __future__ import annotations

from federation.core.config import RunConfig
from federation.data.images import ImageFederation
from federation.data.tensors import FederatedData
from federation.engine.images import ImageEngine
from federation.engine.mlp import StackedEngine

__all__ = ["build_engine"]


def build_engine(data: FederatedData, cfg: RunConfig, seed: int) -> StackedEngine | ImageEngine:
    """The stacked trainer of ``data``: :class:`ImageEngine` for an image federation (its
    ``images.yaml`` sets the model), else :class:`StackedEngine` with ``cfg.engine``.

    Raises:
        InputError: an image federation with a run config that changes the MLP's ``engine:`` section.
    """
    if isinstance(data, ImageFederation):
        return ImageEngine(data, cfg, seed)
    return StackedEngine(data, cfg.engine, seed)

"""The engine interface every stacked trainer implements (the runner and the methods see only this)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["Engine"]

StackedParams = dict[str, torch.Tensor]


@runtime_checkable
class Engine(Protocol):
    """A stacked trainer of all n centers at once: :class:`federation.engine.mlp.StackedEngine` (the
    clinical MLP, and BNN+FL's Bayesian MLP) and :class:`federation.engine.images.ImageEngine`."""

    @property
    def n(self) -> int:
        """Number of centers."""
        ...

    def init_params(self) -> StackedParams:
        """``{name: [n, ...]}`` initial stacked parameters (same seed, same draw)."""
        ...

    def train_round(self, params: StackedParams, state: Any, round_idx: int, local_loss: Any = None) -> StackedParams:
        """Local training of round ``round_idx`` for every center, in place on ``params``."""
        ...

    def predict(self, params: StackedParams, split: str) -> torch.Tensor:
        """Per-row scores ``[n, rows, ...]`` of every center's model on its own ``split``."""
        ...

    def layout(self, head_layers: int) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, int]]:
        """(exchanged names, personalized head names, parameters per tensor of one center)."""
        ...

    def evaluate_mixtures(self, theta: StackedParams, wc: torch.Tensor, tc: torch.Tensor, split: str,
                          exchanged: tuple[str, ...], bf16: bool, chunk: int | None = None) -> torch.Tensor:
        """``[m]`` float64 metric of candidate mixtures: row r mixes ``wc[r]`` of the exchanged block of
        ``theta``, keeps ``tc[r]``'s own head, and is scored on ``tc[r]``'s ``split``."""
        ...

    def probe_view(self, params: StackedParams) -> tuple[Any, Any]:
        """(probe model with ``pair_logits``, shards with the anchor pools) for the SAGE probe."""
        ...

    def probe_heads(self, params: StackedParams) -> StackedParams:
        """The parameters a selector reads the classifier head from, under ``head.*`` names."""
        ...

    def probe_bytes_per_anchor(self) -> int:
        """Bytes one (receiver, candidate, anchor) probe moves."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The engine's own state that carries from one round to the next (a round checkpoint,
        federation/run/checkpoint.py); ``{}`` when the runner's optimizer state holds it all."""
        ...

    def load_state_dict(self, state: dict[str, Any], optimizer: Any) -> None:
        """Restore :meth:`state_dict`'s output; ``optimizer`` is the runner's restored optimizer
        state that the next :meth:`train_round` receives."""
        ...

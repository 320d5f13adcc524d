"""Tolerances that follow from the computation, shared by the tests that compare two float paths.

A test that compares two computations of the same result (another summation order, another SIMD
width, another code path) takes its tolerance from here, so each bound is derived once.
"""

from __future__ import annotations

import math

import torch

#: float32 unit roundoff, 2^-24.
F32_U = 2.0 ** -24


def assert_adam_tracks(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], steps: int, lr: float,
                       betas: tuple[float, float], share: float = 0.999, atol: float = 1e-6) -> None:
    """Two Adam trainings whose gradients differ by float rounding agree as Adam lets them.

    Adam divides each step by sqrt(v) + eps: where a gradient's running moments are near zero, a
    rounding-level gradient difference becomes a visible part of lr; elsewhere the parameters stay
    within rounding. So at least ``share`` of each tensor's elements agree within ``atol`` (1e-6 is
    1e-4 of the distance ``steps`` steps of size ``lr = 1e-3`` travel), and no element differs by
    more than Adam's bound on its steps, ``steps * lr * (1 - beta1) / sqrt(1 - beta2)`` (Kingma and
    Ba 2015, Sec. 2.1).

    Args:
        a, b: parameters ``{name: tensor}`` after the same training on two paths.
        steps: the most Adam steps any element took (e.g. ``AdamState.t.max()``).
    Raises:
        AssertionError: naming the tensor, the largest difference and the bound.
    """
    bound = steps * lr * (1 - betas[0]) / math.sqrt(1 - betas[1])
    for k in a:
        diff = (a[k] - b[k]).abs()
        close = float((diff <= atol).double().mean())
        assert close >= share, (k, close, float(diff.max()))
        assert float(diff.max()) <= bound, (k, float(diff.max()), bound)

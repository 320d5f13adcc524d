"""Run-time guards: a non-finite value stops a run instead of becoming a result.

A NaN or infinity in a mixing row, in the parameters after local training or after the exchange,
in the scores, or in any float a method reports (its per-round extras, Shapley values, Beta
beliefs) would otherwise flow into an AUROC that looks normal (a 0/0 WPFed row
and a diverging FedAvg both printed ``AUROC 1.3597``). :func:`check_finite` raises
:class:`NonFiniteError`, whose one-line message names the value, the method, the seed and the
round; the CLI prints it without a traceback and exits non-zero (:mod:`cli.app`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from etl.errors import InputError

__all__ = ["NonFiniteError", "check_finite", "check_finite_params", "count_non_finite", "run_context"]


class NonFiniteError(InputError, ValueError):
    """A value that must be finite is NaN or infinite (the run cannot give a meaningful result).

    Subclasses :class:`~etl.errors.InputError` so that the CLI reports it as one line (exit 2):
    the cause is the configuration (a learning rate that diverges, a 0/0 weighting), not a bug.
    """


def run_context(method: str | None, seed: int | None, round_: int | None) -> str:
    """``"<method> seed <seed> round <round>: "`` (parts that are None are left out)."""
    parts = [p for p in (method, None if seed is None else f"seed {seed}",
                         None if round_ is None else f"round {round_}") if p]
    return (" ".join(parts) + ": ") if parts else ""


def check_finite(name: str, value: Any, method: str | None = None, seed: int | None = None,
                 round_: int | None = None) -> None:
    """Raise :class:`NonFiniteError` unless every element of ``value`` is finite.

    Args:
        name: what the value is (``"mixing matrix W"``, ``"parameters after local training (w1)"``,
            ``"Shapley values"``); goes into the message.
        value: a tensor of any shape, a Python / NumPy number, or a (nested) mapping or sequence of
            those (every leaf is checked; non-numeric leaves are ignored).
        method, seed, round_: where it happened (round 1-based, as logged); named in the message.

    Raises:
        NonFiniteError: one line, e.g. ``wpfed seed 11 round 1: mixing matrix W holds 3 non-finite
            value(s) (NaN or infinity); the run is stopped``. No data value is quoted.
    """
    bad = count_non_finite(value)
    if bad:
        raise NonFiniteError(f"{run_context(method, seed, round_)}{name} holds {bad} non-finite value(s) "
                             f"(NaN or infinity); the run is stopped")


def check_finite_params(name: str, params: Mapping[str, torch.Tensor], method: str | None = None,
                        seed: int | None = None, round_: int | None = None) -> None:
    """:func:`check_finite` on each tensor of a stacked parameter dict (``{key: [n, ...]}``);
    the message names the first key at fault, e.g. ``parameters after the exchange (w1)``."""
    for k, v in params.items():
        check_finite(f"{name} ({k})", v, method, seed, round_)


def count_non_finite(value: Any) -> int:
    """Number of NaN / infinite leaves in a tensor, NumPy value, number, or nested mapping /
    sequence of those (non-numeric leaves count 0)."""
    if isinstance(value, torch.Tensor):
        if not (value.is_floating_point() or value.is_complex()):
            return 0
        v = value.detach()
        # fast path (one reduction, no boolean temporary): a NaN or infinity makes the sum
        # non-finite, so a finite sum proves every element finite; a non-finite sum (a bad
        # element, or finite values whose sum overflows) is settled by the exact count
        if v.numel() and bool(torch.isfinite(v.sum())):
            return 0
        return int((~torch.isfinite(v)).sum())
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return 0
    if isinstance(value, Mapping):
        return sum(count_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(count_non_finite(v) for v in value)
    if hasattr(value, "dtype") and hasattr(value, "shape"):  # a NumPy array or scalar
        import numpy as np

        arr = np.asarray(value)
        return int((~np.isfinite(arr)).sum()) if np.issubdtype(arr.dtype, np.inexact) else 0
    if isinstance(value, (int, float)):
        return 0 if math.isfinite(float(value)) else 1
    return 0

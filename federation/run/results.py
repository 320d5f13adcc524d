"""The one results writer: strict JSON (NaN and infinities as null), written atomically."""

from __future__ import annotations

import json
import numbers
import os
from pathlib import Path
from typing import Any

import torch

from etl.io import atomic_write_text
from federation.run.tracking import finite

__all__ = ["results_file", "strict_json", "write_results"]


def _plain(obj: Any) -> Any:
    """``obj`` with tensors and NumPy scalars as Python numbers or lists (JSON-able)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, (bool, int, float)):
        return obj
    if isinstance(obj, numbers.Integral):  # NumPy integers
        return int(obj)
    if isinstance(obj, numbers.Real):  # NumPy floats
        return float(obj)
    return obj


def results_file(output: str | os.PathLike[str]) -> Path:
    """The results JSON an ``output`` names: ``output`` itself when it ends in ``.json``, else
    ``results.json`` inside the folder ``output`` (the image benchmarks' ``output:`` key)."""
    out = Path(output)
    return out if out.suffix == ".json" else out / "results.json"


def strict_json(doc: Any, indent: int = 2) -> str:
    """``doc`` as strict JSON text (JavaScript's ``JSON.parse`` and MLflow's UI accept it): every
    NaN / infinity becomes null, tensors and NumPy scalars become numbers; ends with a newline."""
    return json.dumps(finite(_plain(doc)), indent=indent, allow_nan=False) + "\n"


def write_results(path: str | os.PathLike[str], doc: Any, indent: int = 2, exclusive: bool = False) -> None:
    """Write ``doc`` to ``path`` as :func:`strict_json`, atomically (a temporary file, then a rename;
    ``exclusive``: created only if absent, :func:`etl.io.atomic_write_bytes`)."""
    atomic_write_text(path, strict_json(doc, indent), exclusive)

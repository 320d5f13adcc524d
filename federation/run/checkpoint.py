"""Round checkpoints: what ``abps train --resume`` goes on from, written atomically beside results.json,
stamped with the config, cohort, seeds and code version so that a foreign checkpoint is refused.

Design notes: docs/runtime.md, "Module notes", round checkpoints.
"""

from __future__ import annotations

import hashlib
import io
import random
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from etl.errors import InputError
from etl.io import atomic_write_bytes
from federation.core.config import CheckpointConfig, RunConfig

#: layout of the checkpoint dict; a file of another layout is refused
FORMAT = 1
SUFFIX = ".ckpt"
#: the packages whose source computes a run (their .py files make the code version)
_PACKAGES = ("etl", "federation", "abps")


def checkpoint_path(output: str | Path) -> Path:
    """``<output>.ckpt``: the checkpoint of the run that writes ``output`` (results.json)."""
    p = Path(output)
    return p.with_name(p.name + SUFFIX)


@lru_cache(maxsize=1)
def code_version() -> str:
    """16 hex digits: SHA-256 over the relative path and bytes of every ``.py`` file of the packages
    that compute a run (etl, federation, abps), in path order. Any change to that code changes it."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for pkg in _PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(b"\0")
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def stamp(cfg: RunConfig, cohort_id: str, seeds: list[int]) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: config (JSON, without ``checkpoint``), cohort
    id, seeds, code version."""
    return {"config": cfg.model_dump(mode="json", exclude={"checkpoint"}), "cohort": cohort_id,
            "seeds": [int(s) for s in seeds], "code": code_version()}


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out or {prefix.rstrip("."): {}}
    return {prefix.rstrip("."): obj}


def mismatch(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    """The first difference between a checkpoint's :func:`stamp` and this run's, in words; None
    when they match. E.g. ``config engine.lr: 0.05 in the checkpoint, 0.1 now``."""
    if saved.get("code") != now["code"]:
        return (f"code version {saved.get('code')} in the checkpoint, {now['code']} now (another version of "
                "etl / federation / abps wrote it)")
    if saved.get("cohort") != now["cohort"]:
        return f"cohort {saved.get('cohort')} in the checkpoint, {now['cohort']} now (--cohort)"
    if saved.get("seeds") != now["seeds"]:
        return f"seeds {saved.get('seeds')} in the checkpoint, {now['seeds']} now (--seeds)"
    a, b = _flat(saved.get("config", {})), _flat(now["config"])
    for k in sorted(set(a) | set(b)):
        if a.get(k, "(unset)") != b.get(k, "(unset)"):
            return f"config {k}: {a.get(k, '(unset)')} in the checkpoint, {b.get(k, '(unset)')} now"
    return None


def save(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` (with :data:`FORMAT`) to ``path`` atomically (:func:`etl.io.atomic_write_bytes`:
    a temporary file in the same folder, created if missing, then renamed over ``path``). A killed
    process leaves the old file or the new one; no ``fsync`` (docs/decisions.md, "Round checkpoints").

    Raises:
        InputError: the write fails (a full disk, a read-only folder): one line naming ``path``.
    """
    buf = io.BytesIO()
    torch.save({"format": FORMAT, **payload}, buf)
    atomic_write_bytes(path, buf.getbuffer())


def load(path: Path, now: dict[str, Any]) -> dict[str, Any]:
    """Read a checkpoint and check it against this run's :func:`stamp`.

    Raises:
        InputError: unreadable file, another layout, or a stamp that differs (one line naming
            the difference).
    """
    try:
        with open(path, "rb") as fh:
            doc = torch.load(fh, weights_only=False)  # our own pickle (module docstring)
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one-line error
        raise InputError(f"--resume: {path} is not a readable checkpoint ({exc.__class__.__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"--resume: {path} is not a checkpoint of layout {FORMAT}")
    why = mismatch(doc.get("stamp", {}), now)
    if why is not None:
        raise InputError(f"--resume: {path} belongs to another run: {why}")
    return doc


def global_streams() -> dict[str, Any]:
    """The process-wide random streams: python ``random``, NumPy's legacy global, torch's CPU default."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def restore_global_streams(state: dict[str, Any]) -> None:
    """Set the streams :func:`global_streams` captured."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


class Cadence:
    """When the round loop writes a checkpoint (:class:`federation.core.config.CheckpointConfig`):
    after round ``tau`` when ``every_rounds`` divides it, or when ``every_minutes`` passed since the
    last write (or the start)."""

    def __init__(self, cfg: CheckpointConfig, clock: Any = time.monotonic) -> None:
        self.every, self.seconds, self.clock = cfg.every_rounds, cfg.every_minutes * 60.0, clock
        self.last = clock()

    @property
    def enabled(self) -> bool:
        """Whether any trigger is on."""
        return self.every > 0 or self.seconds > 0

    def due(self, tau: int) -> bool:
        """Whether to write after time point ``tau`` (> 0); a True answer restarts the timer."""
        by_round = self.every > 0 and tau % self.every == 0
        by_time = self.seconds > 0 and self.clock() - self.last >= self.seconds
        if tau > 0 and (by_round or by_time):
            self.last = self.clock()
            return True
        return False

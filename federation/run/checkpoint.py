"""Round checkpoints: what ``abps train --resume`` goes on from, written atomically beside results.json,
stamped with the config, cohort, seeds and code version so that a foreign checkpoint is refused.

Design notes: docs/runtime.md, "Module notes", round checkpoints.
"""

from __future__ import annotations

import hashlib
import io
import json
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
FORMAT = 2
#: a checkpoint file is MAGIC, the SHA-256 of the rest (32 bytes), then torch.save's bytes
MAGIC = b"abps-checkpoint\n"
#: the library objects a checkpoint may name besides this project's own state classes: NumPy
#: arrays (legacy random states), torch generators, networkx graphs (DeceFL's topology); each is
#: data that is built without running code of the file's choosing
_LIBRARY_GLOBALS = frozenset({"numpy.ndarray", "numpy.dtype", "numpy._core.multiarray._reconstruct",
                              "numpy.core.multiarray._reconstruct", "torch._C.Generator", "torch.Generator",
                              "networkx.classes.graph.Graph", "networkx.classes.digraph.DiGraph"})
#: library modules whose classes are data a checkpoint may hold (a graph's cached views)
_LIBRARY_MODULES = ("networkx.classes.",)
_OWN_PACKAGES = ("federation", "abps", "etl")
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


def benchmark_stamp(config: dict[str, Any], data_id: str, seeds: list[int]) -> dict[str, Any]:
    """:func:`stamp` of a benchmark run (``benchmark: sage | vv``): its resolved config as JSON
    (without ``checkpoint``), the data set's :func:`data_id`, the seeds and the code version."""
    cfg = {k: v for k, v in config.items() if k != "checkpoint"}
    return {"config": json.loads(json.dumps(cfg, default=str)), "data": data_id,
            "seeds": [int(s) for s in seeds], "code": code_version()}


def data_id(*arrays: Any) -> str:
    """16 hex digits: SHA-256 over the shapes, dtypes and bytes of ``arrays`` (NumPy arrays or
    CPU tensors): which data set a benchmark checkpoint was computed on."""
    h = hashlib.sha256()
    for a in arrays:
        x = np.ascontiguousarray(a.numpy() if isinstance(a, torch.Tensor) else a)
        h.update(f"{x.dtype}{x.shape}".encode())
        h.update(memoryview(x).cast("B"))
    return h.hexdigest()[:16]


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
    if saved.get("cohort") != now.get("cohort"):
        return f"cohort {saved.get('cohort')} in the checkpoint, {now.get('cohort')} now (--cohort)"
    if saved.get("data") != now.get("data"):
        return f"data set {saved.get('data')} in the checkpoint, {now.get('data')} now (the config's data files)"
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
    atomic_write_bytes(path, encode({"format": FORMAT, **payload}))


def encode(obj: Any) -> bytes:
    """``obj`` as checkpoint bytes: :data:`MAGIC`, the SHA-256 of the rest, ``torch.save``'s bytes."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    body = buf.getbuffer()
    return b"".join((MAGIC, hashlib.sha256(body).digest(), body))


def _allowed_globals(names: list[str]) -> list[Any]:
    """The objects the unpickler may build for a checkpoint naming ``names``: :data:`_LIBRARY_GLOBALS`,
    the classes of :data:`_LIBRARY_MODULES`, and this project's state and config records: its
    dataclasses, pydantic models and classes marked ``__checkpoint_state__ = True`` (built from
    their fields, running no code of the file's choosing). Raises ValueError naming the first
    other name (a function, another class, another package)."""
    import dataclasses
    import importlib

    import pydantic

    allowed: list[Any] = [getattr(np.dtypes, n) for n in np.dtypes.__all__]  # what NumPy arrays are built with
    for name in sorted(names):  # the same name refused first, whatever order torch lists them in
        module, _, attr = name.rpartition(".")
        own = module.split(".")[0] in _OWN_PACKAGES
        library_class = name.startswith(_LIBRARY_MODULES)
        if name not in _LIBRARY_GLOBALS and not own and not library_class:
            raise ValueError(name)
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            raise ValueError(name) from None
        record = isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, pydantic.BaseModel)
                                            or getattr(obj, "__checkpoint_state__", False) is True)
        if (own or library_class) and not (record or (library_class and isinstance(obj, type))):
            raise ValueError(name)
        allowed.append(obj)
    return allowed


def read(path: Path, who: str = "--resume") -> Any:
    """The object a checkpoint file written by :func:`save` holds, read without running code from it.

    The file's SHA-256 must match its content (a damaged file is refused before it is unpickled),
    and torch's weights-only unpickler builds only tensors, plain containers, the objects of
    :func:`_allowed_globals` and nothing else: a file naming any other function or class (as a
    crafted pickle would, to run it) is refused.

    Raises:
        InputError: one line beginning with ``who`` and naming ``path``: unreadable, not a
            checkpoint, damaged, or naming foreign code.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"{who}: {path} is not readable ({exc.strerror or exc.__class__.__name__})") from None
    return decode(raw, path, who)


def decode(raw: bytes, path: Path | str = "checkpoint", who: str = "--resume") -> Any:
    """The object :func:`encode` turned into ``raw``; checks and errors as :func:`read`, naming ``path``."""
    if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + 32:
        raise InputError(f"{who}: {path} is not a checkpoint of layout {FORMAT}")
    digest, body = raw[len(MAGIC):len(MAGIC) + 32], memoryview(raw)[len(MAGIC) + 32:]
    if hashlib.sha256(body).digest() != digest:
        raise InputError(f"{who}: {path} is damaged (its SHA-256 does not match its content)")
    src = io.BytesIO(body)
    try:
        allowed = _allowed_globals(torch.serialization.get_unsafe_globals_in_checkpoint(src))
    except ValueError as exc:
        raise InputError(f"{who}: {path} is refused: it names code outside this program's state ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - any unreadable body gets the same one-line error
        raise InputError(f"{who}: {path} is not a readable checkpoint ({exc.__class__.__name__})") from None
    src.seek(0)
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(src, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - as above
        raise InputError(f"{who}: {path} is not a readable checkpoint ({exc.__class__.__name__})") from None


def load(path: Path, now: dict[str, Any], who: str = "--resume") -> dict[str, Any]:
    """Read a checkpoint (:func:`read`) and check it against this run's :func:`stamp`.

    Raises:
        InputError: unreadable file, another layout, damaged, foreign code, or a stamp that
            differs (one line naming the difference, beginning with ``who``).
    """
    doc = read(path, who)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"{who}: {path} is not a checkpoint of layout {FORMAT}")
    why = mismatch(doc.get("stamp", {}), now)
    if why is not None:
        raise InputError(f"{who}: {path} belongs to another run: {why}")
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


def resume_from(path: Path | None, now: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint ``--resume`` goes on from, checked against this run's stamp ``now``.

    Raises:
        InputError: no output (nowhere to look), no checkpoint there, or one of another run.
    """
    if path is None:
        raise InputError("--resume: give the --output of the run to resume (its checkpoint lies beside it)")
    if path.is_dir():
        raise InputError(f"--resume: {path} is a folder, not a checkpoint (move it aside)")
    if not path.is_file():
        raise InputError(f"--resume: no checkpoint {path} (the run finished, never reached its first checkpoint, "
                         "or wrote another --output)")
    return load(path, now)


def check_resume_store(saved_ids: dict[str, str] | None, tracker: Any) -> dict[str, str]:
    """The checkpoint's MLflow run ids (``{role: run id}``), after checking that this run logs to
    the store and experiment that hold them (or logs nowhere, as the checkpointed run did).

    Raises:
        InputError: the checkpointed run logged to MLflow and this one would not, or to another
            store / experiment (naming --tracking-uri / --experiment).
    """
    ids = dict(saved_ids or {})
    if not ids:
        return ids
    if tracker is None:
        raise InputError("--resume: the checkpointed run logs to MLflow; resume it with tracking on")
    rid = ids.get("parent") or next(iter(ids.values()))
    try:
        exp = tracker.client.get_run(rid).info.experiment_id
    except Exception:  # noqa: BLE001 - a store without that run
        raise InputError(f"--resume: the checkpoint's MLflow run {rid} is not in {tracker.uri} "
                         "(give the --tracking-uri of the stopped run)") from None
    if exp != tracker.experiment_id:
        raise InputError("--resume: the checkpoint's MLflow run is in another experiment (give the --experiment "
                         "of the stopped run)")
    return ids


class UnitCheckpoints:
    """Round checkpoints of a benchmark run made of units run one after another (a seed's selector
    in the SAGE benchmark, one gossip simulation): the units done (their results), the unit under
    way (its round state) and the MLflow run ids, in ``<output>.ckpt``.

    Args:
        output: the run's results.json (None: no checkpoints, no resume).
        now: the run's stamp (:func:`benchmark_stamp`).
        cadence: the config's ``checkpoint`` section.
        resume: go on from the checkpoint at ``output`` (InputError as :func:`resume_from`).
        tracker: the run's MLflow tracker or None (checked with :func:`check_resume_store`).
    """

    def __init__(self, output: str | Path | None, now: dict[str, Any], cadence: CheckpointConfig,
                 resume: bool = False, tracker: Any = None) -> None:
        self.path = checkpoint_path(output) if output is not None else None
        self.stamp, self.cadence = now, Cadence(cadence)
        self.writes = self.path is not None and self.cadence.enabled
        saved = resume_from(self.path, now) if resume else None
        self.mlflow: dict[str, str] = check_resume_store(saved.get("mlflow"), tracker) if saved else {}
        self.done: dict[str, Any] = dict(saved["done"]) if saved else {}
        self.current: dict[str, Any] | None = saved["current"] if saved else None

    def going_on(self, unit: str) -> dict[str, Any] | None:
        """The round state ``unit`` goes on from (the unit under way when the run stopped), else None."""
        return self.current["state"] if self.current is not None and self.current["unit"] == unit else None

    def offer(self, unit: str, tau: int, snapshot: Any) -> None:
        """After time point ``tau`` of ``unit``: write ``snapshot()`` when the cadence says so."""
        if self.writes and self.cadence.due(tau):
            self.current = {"unit": unit, "state": snapshot()}
            self._save()

    def finish(self, unit: str, result: Any) -> None:
        """``unit`` is done: a resume keeps ``result`` and skips it."""
        self.done[unit] = result
        self.current = None
        self._save()

    def _save(self) -> None:
        if self.writes:
            save(self.path, {"stamp": self.stamp, "mlflow": self.mlflow, "done": self.done, "current": self.current})

    def remove(self) -> None:
        """The run is complete (results.json written): delete the checkpoint."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def run(self, tracker: Any, role: str, start: Any) -> Any:
        """The MLflow run of ``role`` as a context manager yielding its id: the run of the
        checkpoint reopened, else ``start()`` (a new run, recorded under ``role``)."""
        import contextlib

        @contextlib.contextmanager
        def cm() -> Any:
            ctx = tracker.resume(self.mlflow[role]) if role in self.mlflow else start()
            with ctx as rid:
                self.mlflow[role] = rid
                yield rid
        return cm()


def logged_steps(tracker: Any, run_id: str, key: str) -> int:
    """The last step of metric ``key`` in MLflow run ``run_id`` (-1: none): a resumed run logs only
    later steps, so no step is logged twice."""
    return max((m.step for m in tracker.client.get_metric_history(run_id, key)), default=-1)

"""Cells: the expansion of a sweep into (entry, option values, seed) cells, their hashes, and the
pure cell function :func:`run_cell` that workers run. See :mod:`federation.sweep`."""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from etl.errors import InputError
from federation.core.config import (
    RunConfig,
    build_config,
    canonical_json,
    check_config_file,
    config_hash,
    deep_merge,
    first_error,
    from_folder,
    load_run_config,
)
from federation.data.load import federation_id, load_federation
from federation.engine import kernels
from federation.methods import get_method
from federation.run import checkpoint
from federation.run.runner import run_one
from federation.sweep.spec import SweepSpec

__all__ = ["Cell", "canonical_json", "checkpoint_file", "config_hash", "expand_cells", "sweep_hash", "run_cell",
           "set_round_hook"]

def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """Return a copy of ``raw`` with ``a.b.c`` set to ``value`` (intermediate mappings created)."""
    parts = key.split(".")
    over: dict[str, Any] = {parts[-1]: value}
    for p in reversed(parts[:-1]):
        over = {p: over}
    return deep_merge(raw, over)


def _option_suffix(opts: dict[str, Any]) -> str:
    return ",".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in opts.items())


@dataclass(frozen=True)
class Cell:
    """One (entry, option values, seed) of a sweep.

    Attributes:
        index: position in the expansion order (entries, then options, then seeds).
        label: row name (entry label, plus ``[key=value,...]`` of the options given more than one
            value in the sweep).
        method: registered method name.
        seed: run seed.
        config: the resolved run config.
        options: the option values of this cell (dotted key -> value).
        config_hash: :func:`config_hash` of ``config`` and the cohort id.
    """

    index: int
    label: str
    method: str
    seed: int
    config: RunConfig
    options: dict[str, Any]
    config_hash: str

    @property
    def key(self) -> tuple[str, int]:
        """The resume key ``(config_hash, seed)``."""
        return (self.config_hash, self.seed)

    @property
    def run_name(self) -> str:
        """MLflow run name ``<label>-seed<seed>``."""
        return f"{self.label}-seed{self.seed}"


def expand_cells(spec: SweepSpec, base_dir: str | Path, cohort: str, rounds: int | None = None,
                 seeds: list[int] | None = None) -> list[Cell]:
    """The sweep's cells: entries x cross product of ``options`` x seeds, in that nesting order.

    Args:
        spec: the sweep.
        base_dir: folder that relative ``config:`` paths are read from.
        cohort: cohort id for the hash.
        rounds: override (else ``spec.rounds``; else each config's own).
        seeds: override of ``spec.seeds``.

    Returns:
        ``len(methods) * prod(len(values)) * len(seeds)`` cells.

    Raises:
        InputError: unknown method, unreadable config file, or an option that the run config
            rejects (the message names the entry and the option).
    """
    where = "--rounds" if rounds is not None else "the sweep's rounds:"
    rounds = rounds if rounds is not None else spec.rounds
    seed_list = list(seeds) if seeds else list(spec.seeds)
    keys = list(spec.options)
    if "method" in spec.options:  # the entries name the methods; a run config's method key would contradict them
        raise InputError(f"sweep {spec.name}: options.method: the methods are the entries of `methods:`")
    for entry in spec.methods:
        if "method" in (entry.overrides or {}):
            raise InputError(f"sweep entry {entry.name!r}: overrides.method: give the entry's `method:` instead")
        if "params" in (entry.overrides or {}) and entry.params:  # params: is merged last and would win unseen
            raise InputError(f"sweep entry {entry.name!r}: overrides.params and params: both set method parameters; "
                             "give them in params:")
    if rounds is not None:  # it sets every cell's rounds: a per-cell value would be replaced unseen
        stopping = spec.options.get("early_stopping") or []
        for k in ("rounds", "early_stopping.max_rounds"):
            if k in spec.options or (k != "rounds" and any(isinstance(v, dict) and "max_rounds" in v for v in stopping)):
                raise InputError(f"sweep {spec.name}: options.{k} varies what {where} ({rounds}) sets for every "
                                 "cell; give one of them")
        for entry in spec.methods:
            given = entry.overrides or {}
            es = given.get("early_stopping")
            for k, there in (("rounds", "rounds" in given), ("early_stopping.max_rounds",
                                                            isinstance(es, dict) and "max_rounds" in es)):
                if there:
                    raise InputError(f"sweep entry {entry.name!r}: overrides.{k} is replaced by {where} ({rounds}); "
                                     "give one of them")
    combos = [dict(zip(keys, vals)) for vals in itertools.product(*(spec.options[k] for k in keys))]
    varying = {k for k in keys if len(spec.options[k]) > 1}
    cells: list[Cell] = []
    for entry in spec.methods:
        try:
            cls = get_method(entry.method)
        except InputError as exc:  # the registry speaks of --method; here the name comes from the file
            raise InputError(f"sweep {spec.name}: methods: {exc}".replace("unknown --method", "unknown method", 1)) from None
        file_cfg: dict[str, Any] = {"method": entry.method}
        if entry.config:
            path = from_folder(entry.config, base_dir)
            if not path.is_file():
                what = "is a folder, not a run config file" if path.is_dir() else "not found"
                raise InputError(f"sweep {spec.name}: entry {entry.name!r}: config {entry.config} {what} at {path} "
                                 "(a relative `config:` is read from the sweep file's folder)")
            file_cfg = load_run_config(path)
            file_cfg.setdefault("method", entry.method)
            # the file alone first: a bad key is reported with the file's name
            check_config_file(path, lambda c=cls, f=file_cfg: build_config(entry.method, c.default_config, f))
        if entry.overrides:
            file_cfg = deep_merge(file_cfg, entry.overrides)
        if entry.params:
            file_cfg = deep_merge(file_cfg, {"params": entry.params})
        for opts in combos:
            raw = file_cfg
            for k, v in opts.items():
                raw = _set_dotted(raw, k, v)
            try:
                cfg = build_config(entry.method, cls.default_config, raw, rounds)
                # fully resolved: the method's parameters with their defaults filled in
                full = cls.Params.model_validate(cfg.params).model_dump(mode="json")
                cfg = cfg.model_copy(update={"params": full})
                cls.check_config(cfg)
                rw = cfg.realworld
                for key, f in (("availability.trace", rw.availability.trace if rw else None),
                               ("profiles.file", rw.profiles.file if rw else None)):
                    if f and not Path(f).is_file():  # found before any cell runs, not by each cell
                        raise InputError(f"realworld.{key} {f}: file not found")
            except ValidationError as exc:
                loc, msg = first_error(exc)
                raise InputError(f"sweep entry {entry.name!r}{' ' + _option_suffix(opts) if opts else ''}: "
                                 + (f"invalid {loc}: {msg}" if loc else msg)) from None
            except InputError as exc:
                raise InputError(f"sweep entry {entry.name!r}{' ' + _option_suffix(opts) if opts else ''}: "
                                 f"{exc}") from None
            # a row is named by the options that tell cells apart: one set for the whole sweep (an
            # evaluation rule, say) names no row, so Table 1 still finds the paper's rows
            shown = {k: v for k, v in opts.items() if k in varying}
            label = entry.name + (f"[{_option_suffix(shown)}]" if shown else "")
            h = config_hash(cfg, cohort)
            for seed in seed_list:
                cells.append(Cell(len(cells), label, cfg.method, int(seed), cfg, dict(opts), h))
    seen: dict[tuple[str, int], Cell] = {}
    for c in cells:  # two cells that are one run would be counted as two and run once
        other = seen.setdefault((c.config_hash, c.seed), c)
        if other is not c:
            what = f"rows {other.label!r} and {c.label!r}" if other.label != c.label else f"row {c.label!r} twice"
            raise InputError(f"sweep {spec.name}: {what} with seed {c.seed}: the same run config (an option value "
                             "listed twice, or an option or entry that changes nothing)")
    return cells


def sweep_hash(cells: list[Cell]) -> str:
    """Identity of a sweep: SHA-256 (16 hex) of its sorted cell keys."""
    return hashlib.sha256(canonical_json(sorted([list(c.key) for c in cells])).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# the pure cell function (runs in workers)

_DATA_CACHE: dict[tuple[str, int, float], Any] = {}

#: Per-process live-progress hook ``(event, payload)``: set by the executor around a cell (serial:
#: the driver's logger; pool / Ray: a queue back to the driver). ``run_cell`` reports
#: ``("start", {"ms"})`` and ``("round", {"step", "metrics", "ms"})`` through it.
_ROUND_HOOK: Callable[[str, dict[str, Any]], None] | None = None


def set_round_hook(hook: Callable[[str, dict[str, Any]], None] | None) -> None:
    """Install (or clear, with None) this process's live-progress hook for :func:`run_cell`."""
    global _ROUND_HOOK
    _ROUND_HOOK = hook


def _now_ms() -> int:
    return int(time.time() * 1000)


def _load_data(cohort: str, min_train: int) -> Any:
    """FederatedData of a cohort, cached per worker process (keyed by path, min_train, mtime)."""
    p = Path(cohort) / "cohort.parquet"
    key = (str(Path(cohort).resolve()), int(min_train), p.stat().st_mtime if p.exists() else 0.0)
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = load_federation(cohort, min_train=min_train)
    return _DATA_CACHE[key]


def checkpoint_file(folder: str | Path, cell: Cell) -> Path:
    """``<folder>/<config_hash>-seed<seed>.ckpt``: where cell ``cell`` writes its round checkpoints."""
    return Path(folder) / f"{cell.config_hash}-seed{cell.seed}{checkpoint.SUFFIX}"


def run_cell(config: dict[str, Any], cohort: str, seed: int, threads: int = 1, checkpoint_path: str | None = None,
             cohort_id: str | None = None) -> dict[str, Any]:
    """Compute one cell: a pure function of (config, cohort, seed) (plus the thread count).

    Args:
        config: ``RunConfig.model_dump(mode="json")``.
        cohort: cohort directory (readable by the worker).
        seed: run seed.
        threads: torch intra-op threads of this worker (results depend on it through float
            summation order, so every executor uses the sweep's ``resources.threads``).
        checkpoint_path: the cell's round checkpoint (:func:`checkpoint_file`; None: none). Written
            at the config's ``checkpoint`` cadence; when the file exists the cell goes on after its
            round, with the result of an uninterrupted computation.
        cohort_id: the cohort's :func:`federation.data.load.federation_id` (stamped into the
            checkpoint; computed when not given).

    Raises:
        InputError: the checkpoint belongs to another run (code version, config, cohort or seed;
            one line naming the difference and the file).

    Returns:
        ``{"summary": RunResult.summary(), "history": [per-round metrics], "per_center":
        {center_id: {...}}, "artifacts": {name: json}, "seconds": wall time of the run,
        "started_ms" / "ended_ms": epoch ms of the run's start and end, "round_ms": epoch ms at
        the end of each round, "engine_step": fused C++ kernels or eager
        (:func:`federation.engine.kernels.step_name`), "platform": the worker's
        :func:`federation.engine.kernels.build_info`, "clinical": the run's
        :class:`federation.core.evaluation.ClinicalEvaluation` (aggregates only) or None}``; only aggregates, no row-level value. Each round is also
        reported through the live-progress hook when one is set (:func:`set_round_hook`).
    """
    torch.set_num_threads(int(threads))
    cfg = RunConfig.model_validate(config)
    data = _load_data(cohort, cfg.min_train)
    hook = _ROUND_HOOK
    started = _now_ms()
    round_ms: list[int | None] = []

    def on_round(step: int, metrics: dict[str, float]) -> None:
        round_ms.append(_now_ms())
        if hook is not None:
            hook("round", {"step": step, "metrics": dict(metrics), "ms": round_ms[-1]})

    t0 = time.perf_counter()
    res = run_one(cfg, data, int(seed), on_round, **_cell_checkpoints(cfg, cohort, int(seed), checkpoint_path,
                                                                      cohort_id, hook, started))
    round_ms = [None] * (len(res.history) - len(round_ms)) + round_ms  # rounds before a resume: no time
    return {"summary": res.summary(), "history": res.history, "per_center": res.per_center,
            "artifacts": res.artifacts, "seconds": time.perf_counter() - t0, "started_ms": started,
            "ended_ms": _now_ms(), "round_ms": round_ms, "engine_step": kernels.step_name(),
            "platform": kernels.build_info(), "clinical": res.clinical}


def _cell_checkpoints(cfg: RunConfig, cohort: str, seed: int, path: str | None, cohort_id: str | None,
                      hook: Callable[[str, dict[str, Any]], None] | None, started: int) -> dict[str, Any]:
    """:func:`run_one`'s ``checkpoint`` / ``resume`` arguments for a cell, and its ``start`` event
    (``{"ms", "resumed"}``: the round the cell goes on after, 0 from the start)."""
    state = None
    kw: dict[str, Any] = {}
    if path is not None:
        target = Path(path)
        now = checkpoint.stamp(cfg, cohort_id or federation_id(cohort), [seed])
        if target.is_file():
            saved = checkpoint.load(target, now, who="sweep cell checkpoint")
            state = (saved.get("current") or {}).get("state")
        cadence = checkpoint.Cadence(cfg.checkpoint)

        def on_checkpoint(tau: int, snap: Callable[[], dict[str, Any]]) -> None:
            if cadence.enabled and cadence.due(tau):
                checkpoint.save(target, {"stamp": now, "mlflow": {}, "done": [],
                                         "current": {"seed": seed, "state": snap()}})

        kw = {"checkpoint": on_checkpoint, "resume": state}
    if hook is not None:
        hook("start", {"ms": started, "resumed": int(state["round"]) if state is not None else 0})
    return kw

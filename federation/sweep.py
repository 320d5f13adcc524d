"""Sweeps: the cross product (method entry x option values x seed) as cells, run on a process pool
or on Ray, logged to MLflow from the driver, resumable.

A sweep file (``configs/table1.yaml``) names the methods, the seeds and optional ``options``
(dotted run-config keys -> list of values); every combination is one *cell*. A cell is computed
by the pure function :func:`run_cell` ``(config, cohort, seed, threads) -> dict`` (per-round
history, final summary, per-center aggregates), so the same cell gives the same numbers on the
local process pool, on a Ray cluster and with any number of workers (every worker sets the same
number of torch threads; every random draw of the runtime derives from the seed).

MLflow (ABPS paper Sec. 6.3 reports final-round mean AUROC and cumulative bytes; Table 1 needs 18
methods x 5 seeds): the driver alone writes to the store (no concurrent sqlite writers). One
parent run per sweep (tag ``abps.kind = sweep``, found again by its ``abps.sweep_hash`` on a
rerun) and one child run per cell (tag ``abps.kind = cell``) with

* tags ``method``, ``seed``, ``abps.label``, ``abps.config_hash``, ``abps.cohort_id``;
* params: the flattened resolved :class:`~federation.config.RunConfig` plus ``seed``, ``label``
  and ``cohort_id``; keys that another cell of the sweep has and this one lacks (a method
  without ``params.kappa``) are logged as ``"none"``, so the MLflow compare view lines runs up;
* metrics per round (step = round) and the final ones (``final_auroc_mean`` ...);
* artifacts ``per_center.json`` (keyed by center_id), ``config.json`` and the method's own.

A child run is marked FINISHED only after all of that is logged. Resume: a cell whose
``(config_hash, seed)`` already has a FINISHED cell run in the experiment is skipped; runs left
RUNNING by a killed sweep are ignored and marked KILLED when their cell is rerun.

``config_hash`` = first 16 hex digits of SHA-256 over the canonical JSON (sorted keys, no
spaces) of ``{"config": <resolved RunConfig>, "cohort": <cohort id>}``; the cohort id is the
SHA-256 of ``cohort.parquet`` and ``centers.parquet`` (:func:`cohort_id`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from etl.errors import InputError
from federation.config import RunConfig, build_config, deep_merge, load_yaml
from federation.data import FederatedData, cohort_id

__all__ = [
    "MethodEntry", "Resources", "SweepSpec", "Cell", "SweepOutcome", "load_sweep", "expand_cells",
    "config_hash", "cohort_id", "canonical_json", "run_cell", "run_sweep", "finished_cells", "cell_params",
    "sweep_hash",
]

KIND_TAG, HASH_TAG, COHORT_TAG, LABEL_TAG, SWEEP_TAG = (
    "abps.kind", "abps.config_hash", "abps.cohort_id", "abps.label", "abps.sweep_hash")
_FINAL_KEYS = ("final_auroc_mean", "final_auroc_std", "final_val_auroc_mean", "rounds_run", "best_round",
               "total_bytes", "model_bytes", "probe_bytes", "metadata_bytes", "rel_bandwidth", "n_excluded_test")


# --------------------------------------------------------------------------------------------
# the sweep file


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MethodEntry(_Strict):
    """One row of the sweep's ``methods:`` list.

    Attributes:
        method: registered method name (``abps train --method``).
        label: name of the row in MLflow and the report (default: the method name); two entries
            of the same method need different labels.
        config: optional YAML run config (``configs/<method>.yaml``), read relative to the
            sweep file's folder when not absolute.
        params: method parameters merged over the file's ``params:`` (e.g. ``{goal: diversity}``).
        overrides: any other run-config keys (``exchange``, ``engine``, ``early_stopping`` ...).
    """

    method: str
    label: str | None = None
    config: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    overrides: dict[str, Any] = Field(default_factory=dict)

    @property
    def name(self) -> str:
        """The label, or the lower-cased method name."""
        return self.label or self.method.strip().lower()


class Resources(_Strict):
    """Per-cell resources: Ray ``num_cpus`` of each task and torch threads of each worker."""

    num_cpus: float = Field(1.0, gt=0.0)
    threads: int = Field(1, ge=1)


class SweepSpec(_Strict):
    """A sweep file (see ``configs/table1.yaml``).

    Attributes:
        name: sweep name (parent run name; default experiment name).
        experiment: MLflow experiment (default: ``name``).
        cohort: cohort directory (``--cohort`` overrides).
        seeds: run seeds (paper: 11 22 33 44 55).
        rounds: optional override of every cell's rounds (max rounds with early stopping).
        methods: method names or :class:`MethodEntry` mappings.
        options: dotted run-config key -> list of values; the sweep runs their cross product.
        resources: :class:`Resources`.
        engine, workers, address: defaults of ``--engine``, ``--workers``, ``--address``.
    """

    name: str = "sweep"
    experiment: str | None = None
    cohort: str | None = None
    seeds: list[StrictInt] = Field(default_factory=lambda: [11, 22, 33, 44, 55], min_length=1)
    rounds: int | None = Field(None, ge=1)
    methods: list[MethodEntry] = Field(min_length=1)
    options: dict[str, list[Any]] = Field(default_factory=dict)
    resources: Resources = Resources()
    engine: Literal["local", "ray"] = "local"
    workers: int = Field(1, ge=1)
    address: str | None = None

    @field_validator("methods", mode="before")
    @classmethod
    def _entries(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"method": e} if isinstance(e, str) else e for e in v]
        return v

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("a seed is listed twice")
        if any(s < 0 for s in v):
            raise ValueError("seeds must be non-negative")
        return v

    @field_validator("options")
    @classmethod
    def _non_empty(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for k, vals in v.items():
            if not vals:
                raise ValueError(f"option {k!r} has no values")
        return v


def load_sweep(path: str | Path) -> tuple[SweepSpec, Path]:
    """Read and validate a sweep YAML. Returns (spec, folder of the file).

    Raises:
        InputError: missing file, bad YAML, or an invalid field (the message names the field).
    """
    from pydantic import ValidationError

    doc = load_yaml(path)
    try:
        spec = SweepSpec.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise InputError(f"{path}: invalid sweep field {loc}: {first.get('msg')}") from None
    labels = [e.name for e in spec.methods]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise InputError(f"{path}: methods: label {dup[0]!r} appears twice (give entries distinct `label:`)")
    return spec, Path(path).resolve().parent


# --------------------------------------------------------------------------------------------
# cells and hashing


def canonical_json(obj: Any) -> str:
    """Canonical JSON text: sorted keys, no whitespace, tuples as lists, NaN refused.

    Raises ValueError for NaN / infinity (they have no canonical JSON form)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=True)


def config_hash(cfg: RunConfig, cohort: str) -> str:
    """SHA-256 (16 hex digits) of ``canonical_json({"config": cfg, "cohort": cohort})``.

    Args:
        cfg: fully resolved run config (defaults, method defaults, file, overrides, rounds).
        cohort: the cohort id (:func:`cohort_id`).
    """
    doc = {"config": cfg.model_dump(mode="json"), "cohort": cohort}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()[:16]


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
        label: row name (entry label, plus ``[key=value,...]`` when the sweep has options).
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
    from pydantic import ValidationError

    from federation.methods import get_method

    rounds = rounds if rounds is not None else spec.rounds
    seed_list = list(seeds) if seeds else list(spec.seeds)
    keys = list(spec.options)
    combos = [dict(zip(keys, vals)) for vals in itertools.product(*(spec.options[k] for k in keys))]
    cells: list[Cell] = []
    for entry in spec.methods:
        cls = get_method(entry.method)
        file_cfg: dict[str, Any] = {"method": entry.method}
        if entry.config:
            p = Path(entry.config)
            file_cfg = load_yaml(p if p.is_absolute() else Path(base_dir) / p)
            file_cfg.setdefault("method", entry.method)
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
            except ValidationError as exc:
                first = exc.errors()[0]
                loc = ".".join(str(p) for p in first.get("loc", ()))
                raise InputError(f"sweep entry {entry.name!r}{' ' + _option_suffix(opts) if opts else ''}: "
                                 f"invalid {loc}: {first.get('msg')}") from None
            label = entry.name + (f"[{_option_suffix(opts)}]" if opts else "")
            h = config_hash(cfg, cohort)
            for seed in seed_list:
                cells.append(Cell(len(cells), label, cfg.method, int(seed), cfg, dict(opts), h))
    return cells


# --------------------------------------------------------------------------------------------
# the pure cell function (runs in workers)

_DATA_CACHE: dict[tuple[str, int, float], Any] = {}


def _load_data(cohort: str, min_train: int) -> Any:
    """FederatedData of a cohort, cached per worker process (keyed by path, min_train, mtime)."""
    from federation.data import FederatedData

    p = Path(cohort) / "cohort.parquet"
    key = (str(Path(cohort).resolve()), int(min_train), p.stat().st_mtime if p.exists() else 0.0)
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = FederatedData.from_cohort(cohort, min_train=min_train)
    return _DATA_CACHE[key]


def run_cell(config: dict[str, Any], cohort: str, seed: int, threads: int = 1) -> dict[str, Any]:
    """Compute one cell: a pure function of (config, cohort, seed) (plus the thread count).

    Args:
        config: ``RunConfig.model_dump(mode="json")``.
        cohort: cohort directory (readable by the worker).
        seed: run seed.
        threads: torch intra-op threads of this worker (results depend on it through float
            summation order, so every engine uses the sweep's ``resources.threads``).

    Returns:
        ``{"summary": RunResult.summary(), "history": [per-round metrics], "per_center":
        {center_id: {...}}, "artifacts": {name: json}, "seconds": wall time}``; only
        aggregates, no row-level value.
    """
    import torch

    from federation.runner import run_one

    torch.set_num_threads(int(threads))
    cfg = RunConfig.model_validate(config)
    t0 = time.perf_counter()
    res = run_one(cfg, _load_data(cohort, cfg.min_train), int(seed))
    return {"summary": res.summary(), "history": res.history, "per_center": res.per_center,
            "artifacts": res.artifacts, "seconds": time.perf_counter() - t0}


# --------------------------------------------------------------------------------------------
# MLflow (driver side only)


def _search_all(client: Any, exp_id: str, filter_string: str) -> list[Any]:
    out: list[Any] = []
    token = None
    while True:
        page = client.search_runs([exp_id], filter_string=filter_string, max_results=1000, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def finished_cells(client: Any, exp_id: str) -> set[tuple[str, int]]:
    """``(config_hash, seed)`` of every FINISHED cell run of the experiment."""
    runs = _search_all(client, exp_id, f"tags.`{KIND_TAG}` = 'cell' and attributes.status = 'FINISHED'")
    return {(r.data.tags[HASH_TAG], int(r.data.tags["seed"])) for r in runs
            if HASH_TAG in r.data.tags and "seed" in r.data.tags}


def _stale_runs(client: Any, exp_id: str) -> dict[tuple[str, int], list[str]]:
    runs = _search_all(client, exp_id, f"tags.`{KIND_TAG}` = 'cell' and attributes.status = 'RUNNING'")
    out: dict[tuple[str, int], list[str]] = {}
    for r in runs:
        t = r.data.tags
        if HASH_TAG in t and "seed" in t:
            out.setdefault((t[HASH_TAG], int(t["seed"])), []).append(r.info.run_id)
    return out


def _log_json(client: Any, run_id: str, obj: Any, name: str) -> None:
    """JSON artifact ``name`` on ``run_id``; refuses patient identifier keys (tracking policy)."""
    from federation.tracking import check_no_identifiers

    check_no_identifiers(obj)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, os.path.basename(name))
        with open(path, "w") as fh:
            json.dump(obj, fh, indent=2, allow_nan=True)
        client.log_artifact(run_id, path, artifact_path=os.path.dirname(name) or None)


def cell_params(cell: Cell, cohort: str) -> dict[str, str]:
    """The params of a cell run: flattened config, seed, label, cohort_id, as strings."""
    from federation.tracking import flatten

    flat = flatten(cell.config.model_dump(mode="json"))
    flat.update({"seed": cell.seed, "label": cell.label, "cohort_id": cohort})
    return {k: str(v) for k, v in flat.items()}


def _log_cell(client: Any, exp_id: str, parent_id: str, cell: Cell, cohort: str, all_keys: list[str],
              result: dict[str, Any], sweep_hash: str) -> str:
    """Create the cell's child run, log everything, then mark it FINISHED (FAILED on error)."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

    tags = {MLFLOW_RUN_NAME: cell.run_name, MLFLOW_PARENT_RUN_ID: parent_id, KIND_TAG: "cell",
            HASH_TAG: cell.config_hash, COHORT_TAG: cohort, LABEL_TAG: cell.label, SWEEP_TAG: sweep_hash,
            "method": cell.method, "seed": str(cell.seed)}
    run = client.create_run(exp_id, run_name=cell.run_name, tags=tags)
    rid = run.info.run_id
    try:
        params = cell_params(cell, cohort)
        items = [Param(k, params.get(k, "none")[:6000]) for k in all_keys]
        for lo in range(0, len(items), 100):
            client.log_batch(rid, params=items[lo:lo + 100])
        ts = int(time.time() * 1000)
        metrics: list[Any] = []
        for row in result["history"]:
            step = int(row["round"])
            metrics.extend(Metric(k, float(v), ts, step) for k, v in row.items()
                           if k != "round" and not (isinstance(v, float) and math.isnan(v)))
        s = result["summary"]
        final_step = int(s["rounds_run"])
        metrics.extend(Metric(k, float(s[k]), ts, final_step) for k in _FINAL_KEYS
                       if k in s and s[k] is not None and not (isinstance(s[k], float) and math.isnan(s[k])))
        for lo in range(0, len(metrics), 1000):
            client.log_batch(rid, metrics=metrics[lo:lo + 1000])
        client.log_batch(rid, tags=[RunTag("abps.cell_seconds", f"{result.get('seconds', 0.0):.2f}")])
        _log_json(client, rid, result["per_center"], "per_center.json")
        for name, obj in (result.get("artifacts") or {}).items():
            _log_json(client, rid, obj, name)
        _log_json(client, rid, cell.config.model_dump(mode="json"), "config.json")
    except BaseException:
        client.set_terminated(rid, "FAILED")
        raise
    client.set_terminated(rid, "FINISHED")
    return rid


def _open_parent(client: Any, exp_id: str, spec: SweepSpec, cells: list[Cell], cohort: str,
                 sweep_hash: str, engine: str, workers: int) -> str:
    """Reuse the sweep's parent run (same sweep hash) or create it; leaves it RUNNING."""
    from mlflow.entities import Param
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

    found = _search_all(client, exp_id, f"tags.`{KIND_TAG}` = 'sweep' and tags.`{SWEEP_TAG}` = '{sweep_hash}'")
    if found:
        rid = sorted(found, key=lambda r: r.info.start_time)[0].info.run_id
        client.update_run(rid, status="RUNNING")
    else:
        run = client.create_run(exp_id, run_name=spec.name,
                                tags={MLFLOW_RUN_NAME: spec.name, KIND_TAG: "sweep", SWEEP_TAG: sweep_hash,
                                      COHORT_TAG: cohort})
        rid = run.info.run_id
        params = {"sweep": spec.name, "n_cells": len(cells), "labels": " ".join(dict.fromkeys(c.label for c in cells)),
                  "seeds": " ".join(str(s) for s in dict.fromkeys(c.seed for c in cells)), "cohort_id": cohort}
        client.log_batch(rid, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
    client.set_tag(rid, "abps.engine", f"{engine} x{workers}")
    return rid


# --------------------------------------------------------------------------------------------
# engines


CellResult = tuple[Cell, dict[str, Any] | None, BaseException | None]


def _run_serial(cells: list[Cell], cohort: str, threads: int) -> Iterable[CellResult]:
    import torch

    before = torch.get_num_threads()
    try:
        for c in cells:
            try:
                yield c, run_cell(c.config.model_dump(mode="json"), cohort, c.seed, threads), None
            except Exception as exc:  # noqa: BLE001 - reported per cell
                yield c, None, exc
    finally:
        torch.set_num_threads(before)


def _run_pool(cells: list[Cell], cohort: str, threads: int, workers: int,
              on_submit: Callable[[int], None]) -> Iterable[CellResult]:
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_worker_init)
    clean = False
    try:
        futs = {pool.submit(run_cell, c.config.model_dump(mode="json"), cohort, c.seed, threads): c for c in cells}
        on_submit(len(futs))
        pending = set(futs)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=lambda f: futs[f].index):
                exc = f.exception()
                yield futs[f], (None if exc else f.result()), exc
        clean = True
    finally:
        if not clean:
            # interrupted (Ctrl-C, SIGTERM, an error while logging): drop the queued cells and stop the
            # workers' running cells (Python 3.11 has no public terminate; 3.14 adds terminate_workers)
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        pool.shutdown(wait=clean, cancel_futures=not clean)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast (InputError) when a ``host:port`` / ``ray://host:port`` Ray address does not
    accept a TCP connection: ``ray.init`` itself retries an unreachable address forever."""
    import socket

    target = address.split("://", 1)[-1]
    if target == "auto" or ":" not in target:
        return
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError):
        raise InputError(f"--address {address}: cannot reach a Ray cluster there "
                         f"(no answer within {timeout_s:g} s)") from None


def _worker_init() -> None:
    """Pool worker start-up: die with the driver (Linux ``PR_SET_PDEATHSIG``), so a ``kill -9``
    of ``abps sweep`` leaves no orphaned workers holding memory."""
    import ctypes
    import signal
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        except OSError:
            pass


def _run_ray(cells: list[Cell], cohort: str, threads: int, workers: int, address: str | None,
             num_cpus: float) -> Iterable[CellResult]:
    try:
        import ray
    except ModuleNotFoundError:
        raise InputError("--engine ray needs the `ray` package (pip install 'ray>=2.9')") from None
    started = False
    if not ray.is_initialized():
        if address:
            _check_reachable(address)
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        started = True
    try:
        remote = ray.remote(num_cpus=num_cpus, max_retries=0)(run_cell)
        refs = {remote.remote(c.config.model_dump(mode="json"), cohort, c.seed, threads): c for c in cells}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    yield refs[ref], ray.get(ref), None
                except Exception as exc:  # noqa: BLE001 - a failed task is reported per cell
                    cause = getattr(exc, "cause", None)
                    yield refs[ref], None, cause if isinstance(cause, BaseException) else exc
    finally:
        if started:
            ray.shutdown()


# --------------------------------------------------------------------------------------------
# driver


@dataclass
class SweepOutcome:
    """What a sweep did.

    Attributes:
        parent_run_id: the sweep's MLflow parent run.
        experiment_id: its experiment.
        cells: all cells of the sweep.
        skipped: keys of cells that already had a FINISHED run.
        ran: key -> child run id of the cells computed and logged now.
        failed: key -> one-line error of the cells that raised.
        summaries: key -> final summary of the cells computed now.
        dropped: per distinct ``min_train`` of the cells, the centers the cohort loses (counts
            only, :attr:`FederatedData.dropped`) and the number kept.
    """

    parent_run_id: str
    experiment_id: str
    cells: list[Cell]
    skipped: list[tuple[str, int]] = field(default_factory=list)
    ran: dict[tuple[str, int], str] = field(default_factory=dict)
    failed: dict[tuple[str, int], str] = field(default_factory=dict)
    summaries: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    dropped: list[dict[str, int]] = field(default_factory=list)


class _SweepProgress:
    """rich progress: cells done / total, running, failed, elapsed and ETA."""

    def __init__(self, enabled: bool, total: int, running_cap: int) -> None:
        self.enabled, self.total, self.cap = enabled, total, max(1, running_cap)
        self.done = self.failed = self.submitted = 0
        self._p = None

    def __enter__(self) -> "_SweepProgress":
        if self.enabled and self.total:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self._p = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), transient=False)
            self._p.__enter__()
            self._t = self._p.add_task("cells", total=self.total, info="")
            self._refresh()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self._p.__exit__(None, None, None)

    def _refresh(self, last: str = "") -> None:
        if self._p is not None:
            running = min(self.cap, max(self.submitted - self.done - self.failed, 0))
            info = f"running {running}" + (f"  failed {self.failed}" if self.failed else "") + (f"  {last}" if last else "")
            self._p.update(self._t, completed=self.done + self.failed, info=info)

    def submit(self, n: int) -> None:
        self.submitted = n
        self._refresh()

    def finish(self, ok: bool, last: str) -> None:
        if ok:
            self.done += 1
        else:
            self.failed += 1
        self._refresh(last)


def sweep_hash(cells: list[Cell]) -> str:
    """Identity of a sweep: SHA-256 (16 hex) of its sorted cell keys."""
    return hashlib.sha256(canonical_json(sorted([list(c.key) for c in cells])).encode()).hexdigest()[:16]


def run_sweep(spec: SweepSpec, base_dir: str | Path, cohort_dir: str | Path, *, engine: str | None = None,
              workers: int | None = None, address: str | None = None, rounds: int | None = None,
              seeds: list[int] | None = None, tracking_uri: str | None = None, experiment: str | None = None,
              progress: bool = True) -> SweepOutcome:
    """Run the sweep's missing cells and log each one as a child of the sweep's parent run.

    Args:
        spec: the sweep (:func:`load_sweep`).
        base_dir: folder for relative ``config:`` paths of the entries.
        cohort_dir: cohort directory (``abps etl`` output); on a Ray cluster every node must read
            it at this path.
        engine: ``local`` (process pool; ``workers == 1`` runs in this process) or ``ray``.
        workers: processes of the local pool, or CPUs of a local Ray instance.
        address: Ray cluster address (``ray start --head`` prints it); None = start a local Ray.
        rounds, seeds: overrides of the file.
        tracking_uri, experiment: MLflow store and experiment (defaults: ``sqlite:///mlflow/mlflow.db``,
            ``spec.experiment`` or ``spec.name``).
        progress: show the rich progress bar.

    Returns:
        :class:`SweepOutcome`. The parent run ends FINISHED when every cell of the sweep has a
        FINISHED run, FAILED otherwise.

    Raises:
        InputError: bad cohort, method, option or engine.
    """
    from federation.tracking import Tracker

    engine = (engine or spec.engine).lower()
    if engine not in ("local", "ray"):
        raise InputError(f"--engine must be local or ray, got {engine!r}")
    workers = int(workers or spec.workers)
    if workers < 1:
        raise InputError("--workers must be >= 1")
    address = address or spec.address
    if address and engine != "ray":
        raise InputError("--address applies to --engine ray only")
    if address:
        _check_reachable(address)  # before any MLflow run is opened
    cohort_dir = str(Path(cohort_dir).resolve())
    cid = cohort_id(cohort_dir)
    FederatedData.from_cohort(cohort_dir)  # a bad cohort fails here, before any MLflow run
    cells = expand_cells(spec, base_dir, cid, rounds, seeds)
    dropped = []
    for m in sorted({c.config.min_train for c in cells}):
        d = FederatedData.from_cohort(cohort_dir, min_train=m)
        dropped.append({**d.dropped, "kept": d.n_centers})
    s_hash = sweep_hash(cells)
    all_keys = sorted({k for c in cells for k in cell_params(c, cid)})

    tracker = Tracker(tracking_uri, experiment or spec.experiment or spec.name)
    client, exp_id = tracker.client, tracker.experiment_id
    parent = _open_parent(client, exp_id, spec, cells, cid, s_hash, engine, workers)
    out = SweepOutcome(parent, exp_id, cells, dropped=dropped)
    try:
        done = finished_cells(client, exp_id)
        todo = [c for c in cells if c.key not in done]
        out.skipped = [c.key for c in cells if c.key in done]
        # two cells with the same resolved config and seed are one computation
        todo = list({c.key: c for c in reversed(todo)}.values())[::-1]
        stale = _stale_runs(client, exp_id)
        threads = spec.resources.threads
        bar = _SweepProgress(progress, len(todo), workers)
        with bar:
            if not todo:
                results: Iterable[CellResult] = iter(())
            elif engine == "ray":
                results = _run_ray(todo, cohort_dir, threads, workers, address, spec.resources.num_cpus)
                bar.submit(len(todo))
            elif workers == 1:
                bar.submit(len(todo))
                results = _run_serial(todo, cohort_dir, threads)
            else:
                results = _run_pool(todo, cohort_dir, threads, workers, bar.submit)
            for cell, res, exc in results:
                if exc is not None or res is None:
                    out.failed[cell.key] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    bar.finish(False, f"{cell.run_name} failed")
                    continue
                for rid in stale.pop(cell.key, []):
                    client.set_terminated(rid, "KILLED")
                out.ran[cell.key] = _log_cell(client, exp_id, parent, cell, cid, all_keys, res, s_hash)
                out.summaries[cell.key] = res["summary"]
                bar.finish(True, f"{cell.run_name} AUROC {res['summary']['final_auroc_mean']:.3f}")
        _log_json(client, parent, {"cells": [{"label": c.label, "method": c.method, "seed": c.seed,
                                              "config_hash": c.config_hash} for c in cells],
                                   "cohort_id": cid, "dropped_centers": dropped}, "sweep.json")
    except BaseException:
        client.set_terminated(parent, "FAILED")
        raise
    client.set_terminated(parent, "FAILED" if out.failed else "FINISHED")
    return out

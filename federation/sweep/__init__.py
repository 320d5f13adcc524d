"""Sweeps: the cross product (method entry x option values x seed) as cells, run on a process pool
or on Ray, logged to MLflow from the driver as they run, resumable.

Modules: :mod:`~federation.sweep.spec` (the sweep file), :mod:`~federation.sweep.cells` (expansion,
hashes, the pure cell function), :mod:`~federation.sweep.executors` (serial, process pool, Ray),
:mod:`~federation.sweep.log` (the MLflow runs, through :class:`federation.run.tracking.Tracker`),
:mod:`~federation.sweep.schedule` (longest-expected-first order of the cells on a pool or Ray) and
:mod:`~federation.sweep.driver` (:func:`run_sweep`).

A sweep file (``configs/table1.yaml``) names the methods, the seeds and optional ``options``
(dotted run-config keys -> list of values); every combination is one *cell*. A cell is computed
by the pure function :func:`run_cell` ``(config, cohort, seed, threads) -> dict`` (per-round
history, final summary, per-center aggregates), so the same cell gives the same numbers on the
local process pool, on a Ray cluster and with any number of workers (every worker sets the same
number of torch threads; every random draw of the runtime derives from the seed).

MLflow (ABPS paper Sec. 6.3 reports final-round mean AUROC and cumulative bytes; Table 1 needs 18
methods x 5 seeds): the driver alone writes to the store (no concurrent sqlite writers). One
parent run per sweep (tag ``abps.kind = sweep``, found again by its ``abps.sweep_hash`` on a
rerun; tag ``abps.executor``) and one child run per cell (tag ``abps.kind = cell``) with

* tags ``method``, ``seed``, ``abps.label``, ``abps.config_hash``, ``abps.cohort_id``;
* params: the flattened resolved :class:`~federation.core.config.RunConfig` plus ``seed``, ``label``
  and ``cohort_id``; keys that another cell of the sweep has and this one lacks (a method
  without ``params.kappa``) are logged as ``"none"``, so the MLflow compare view lines runs up;
* metrics per round (step = round), logged while the cell runs (workers send each round back
  to the driver through a queue) and stamped with the time the round ended, and the final ones
  (``final_auroc_mean`` ...);
* artifacts ``per_center.json`` (keyed by center_id), ``config.json`` and the method's own;
* start and end time of the cell's real work (not of the logging), tag ``abps.cell_seconds``.

Tag names are the constants of :mod:`federation.run.tracking`. A child run is marked FINISHED only
after all of that is logged. Resume: a cell whose
``(config_hash, seed)`` already has a FINISHED cell run in the experiment is skipped; runs left
RUNNING by a killed sweep are ignored and marked KILLED when their cell is rerun.

``config_hash`` = first 16 hex digits of SHA-256 over the canonical JSON (sorted keys, no
spaces) of ``{"config": <resolved RunConfig>, "cohort": <cohort id>}``; the cohort id is the
SHA-256 of ``cohort.parquet`` and ``centers.parquet`` (:func:`federation.data.load.federation_id`).
"""

from federation.data.load import federation_id
from federation.sweep.cells import Cell, canonical_json, config_hash, expand_cells, run_cell, sweep_hash
from federation.sweep.driver import SweepOutcome, run_sweep
from federation.sweep.log import cell_params, finished_cells
from federation.sweep.schedule import expected_seconds, longest_first
from federation.sweep.spec import MethodEntry, Resources, SweepSpec, load_sweep

__all__ = [
    "MethodEntry", "Resources", "SweepSpec", "Cell", "SweepOutcome", "load_sweep", "expand_cells",
    "config_hash", "federation_id", "canonical_json", "run_cell", "run_sweep", "finished_cells", "cell_params",
    "sweep_hash", "expected_seconds", "longest_first",
]

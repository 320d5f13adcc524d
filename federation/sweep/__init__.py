"""Sweeps: the cross product (method entry x option values x seed) as cells, run on a process pool
or on Ray, logged to MLflow from the driver as they run, resumable.

Details: docs/runtime.md, "Sweeps in full".
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

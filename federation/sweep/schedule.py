"""Scheduling: the order in which a sweep's cells are handed to a process pool or to Ray.

A sweep's wall time on ``w`` workers is at least its total cell time / ``w``, and at most that
plus the longest cell that starts last. Handing out the cells longest-expected-first (Graham's LPT
rule, 1969: within 4/3 of the optimal makespan) lets the workers end together instead of one of
them starting a long cell (BNN+FL, the SAGE selector) while the others idle. Cells are pure
functions of (config, cohort, seed, threads) (:func:`federation.sweep.cells.run_cell`), so the
order changes no number (tests/test_sweep.py runs a shuffled order and compares).

The expected cost of a cell is a per-method figure measured on the Table 1 cohort (n = 230
centers, 1 torch thread, idle; docs/benchmarks.md "Table 1"), scaled by the rounds the cell may
run (:attr:`federation.methods.base.Method.seconds_per_round`). Only the order uses it.
"""

from __future__ import annotations

from federation.methods import get_method
from federation.sweep.cells import Cell

__all__ = ["FIXED_SECONDS", "expected_seconds", "longest_first"]

#: seconds of a cell that do not depend on its rounds (the end-of-run clinical report, set-up)
FIXED_SECONDS = 5.0


def expected_seconds(cell: Cell) -> float:
    """Expected seconds of one cell: ``FIXED_SECONDS + seconds_per_round * rounds`` (the method class's
    :attr:`federation.methods.base.Method.seconds_per_round`), where
    ``rounds`` is the cell's round count, or half of ``early_stopping.max_rounds`` when it may stop
    early (ABPS-X / FedAvg-X at 100 took about as long as 50-round cells in the idle sweep)."""
    cfg = cell.config
    rounds = cfg.max_rounds / 2.0 if cfg.early_stopping.enabled else float(cfg.max_rounds)
    return FIXED_SECONDS + get_method(cell.method).seconds_per_round * rounds


def longest_first(cells: list[Cell]) -> list[Cell]:
    """The cells ordered by :func:`expected_seconds`, longest first; ties keep the sweep's order
    (entries, options, seeds), so the order is the same on every run."""
    return sorted(cells, key=lambda c: (-expected_seconds(c), c.index))

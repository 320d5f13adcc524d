"""Scheduling: a sweep's cells are handed out longest-expected-first (Graham's LPT rule), from each
method's ``seconds_per_round``; the order changes no number. Details: docs/sweeps.md.
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

"""Scheduling: the order in which a sweep's cells are handed to a process pool or to Ray.

A sweep's wall time on ``w`` workers is at least its total cell time / ``w``, and at most that
plus the longest cell that starts last. Handing out the cells longest-expected-first (Graham's LPT
rule, 1969: within 4/3 of the optimal makespan) lets the workers end together instead of one of
them starting a long cell (BNN+FL, the SAGE selector) while the others idle. Cells are pure
functions of (config, cohort, seed, threads) (:func:`federation.sweep.cells.run_cell`), so the
order changes no number (tests/test_sweep.py runs a shuffled order and compares).

The expected cost of a cell is a per-method figure measured on the Table 1 cohort (n = 230
centers, 1 torch thread, idle; docs/benchmarks.md "Table 1"), scaled by the rounds the cell may
run. Only the order uses it: a method missing from the table gets FedAvg's figure.
"""

from __future__ import annotations

from federation.sweep.cells import Cell

__all__ = ["SECONDS_PER_ROUND", "FIXED_SECONDS", "expected_seconds", "longest_first"]

#: seconds per round of a cell at n = 230, 1 torch thread (idle Table 1 sweep of session 4 and the
#: per-method profile of session 5, docs/benchmarks.md); only their ratios matter (the order).
#: Centralized trains 2-3 s a round on the pooled rows but stops after about 12: its figure makes its
#: 50 expected rounds last the 33 s it took
SECONDS_PER_ROUND: dict[str, float] = {
    "local": 0.50, "fedavg": 0.55, "fedprox": 0.80, "feddyn": 1.00, "moon": 1.15, "decefl": 0.65,
    "defta": 0.75, "wpfed": 0.75, "bnn-fl": 2.40, "abps": 0.80, "abps+p": 0.85, "abps+q": 0.85,
    "abps+p+q+k1": 0.65, "random-partners": 0.60, "fedavg-pq": 0.60, "abps-hom": 0.70, "abps-div": 0.60,
    "abps-align": 0.70, "abps-x": 0.70, "fedavg-x": 0.70, "centralized": 0.55, "abps-drift": 0.90,
    "sage": 6.40,
}
#: seconds of a cell that do not depend on its rounds (the end-of-run clinical report, set-up)
FIXED_SECONDS = 5.0


def expected_seconds(cell: Cell) -> float:
    """Expected seconds of one cell: ``FIXED_SECONDS + SECONDS_PER_ROUND[method] * rounds``, where
    ``rounds`` is the cell's round count, or half of ``early_stopping.max_rounds`` when it may stop
    early (ABPS-X / FedAvg-X at 100 took about as long as 50-round cells in the idle sweep)."""
    cfg = cell.config
    rounds = cfg.max_rounds / 2.0 if cfg.early_stopping.enabled else float(cfg.max_rounds)
    return FIXED_SECONDS + SECONDS_PER_ROUND.get(cell.method, SECONDS_PER_ROUND["fedavg"]) * rounds


def longest_first(cells: list[Cell]) -> list[Cell]:
    """The cells ordered by :func:`expected_seconds`, longest first; ties keep the sweep's order
    (entries, options, seeds), so the order is the same on every run."""
    return sorted(cells, key=lambda c: (-expected_seconds(c), c.index))

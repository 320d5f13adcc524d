"""Bounds of run options shared by the command line and the config files (no imports beyond
:mod:`etl.limits`: the command line reads them before any engine loads)."""

from etl.limits import MAX_THREADS

__all__ = ["MAX_SEED", "MAX_THREADS", "few_centers"]

#: the largest run seed: torch's generators and NumPy's take a signed 64-bit seed
MAX_SEED = 2**63 - 1



def few_centers(scored: float, n_centers: float) -> bool:
    """True when a mean AUROC rests on fewer than half of the cohort's centers (those whose test
    split holds both classes): ``abps train`` warns, and ``abps runs`` and the report say how many
    beside the value."""
    return scored < n_centers / 2

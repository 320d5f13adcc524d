"""Bounds of run options shared by the command line and the config files (no imports beyond
:mod:`etl.limits`: the command line reads them before any engine loads)."""

from etl.limits import MAX_THREADS

__all__ = ["MAX_SEED", "MAX_THREADS"]

#: the largest run seed: torch's generators and NumPy's take a signed 64-bit seed
MAX_SEED = 2**63 - 1


"""Bounds of run options shared by the command line and the config files (no imports: the
command line reads them before any engine loads)."""

#: the largest run seed: torch's generators and NumPy's take a signed 64-bit seed
MAX_SEED = 2**63 - 1

#: the most torch CPU threads ``--threads`` or a config's thread key may ask for
MAX_THREADS = 1024

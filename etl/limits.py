"""Bounds of options shared by the ETL, the runs and the command line (no imports: the command
line reads them before any engine loads)."""

#: the most threads ``--threads`` (DuckDB's in the ETL, torch's in a run) or a config's thread key
#: may ask for; each is an OS thread, and more than the cores gains nothing
MAX_THREADS = 1024

"""Core primitives of the runtime, importing nothing else of ``federation``: run configuration,
seeding, ledger, metrics, evaluation, the round-loop driver, graphs, variance, provenance."""

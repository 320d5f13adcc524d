"""The federation runtime: stacked multi-center training, mixing, ledger, metrics, methods, tracking."""

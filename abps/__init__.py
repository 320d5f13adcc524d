"""ABPS: Adaptive Bayesian Partner Selection (Seidi, Roy, Das 2026)."""

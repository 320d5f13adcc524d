"""One run of a method: the runner, real-world conditions (availability, deadlines), MLflow tracking."""

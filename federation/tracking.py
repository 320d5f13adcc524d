"""MLflow tracking shared by every runner (clinical, SAGE, gossip).

Default store: ``sqlite:///mlflow/mlflow.db`` relative to the current working directory
(the folder is created), artifacts under ``mlflow/artifacts``; ``make ui`` opens it. For an
explicit ``sqlite:///PATH/x.db`` URI the artifacts go to ``PATH/artifacts``.

Privacy: callers log configs, aggregate metrics and per-center aggregates keyed by
center_id only; :meth:`Tracker.log_json` refuses documents that carry a patient identifier
key (stay_id, subject_id, hadm_id).

Usage::

    tr = Tracker(None, "table1")
    with tr.parent("fedavg", {"seeds": "11 22"}):
        with tr.child("fedavg-seed11", {"seed": 11}, {"method": "fedavg"}):
            tr.log_dict_params(cfg)
            tr.log_metrics({"val_auroc_mean": 0.71}, step=1)
            tr.log_json({"MICU|2110-2111": {"test_auroc": 0.7}}, "per_center.json")
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

_FORBIDDEN_KEYS = {"stay_id", "subject_id", "hadm_id"}


def default_tracking_uri() -> str:
    """``sqlite:///mlflow/mlflow.db`` (relative to the working directory; folder created)."""
    Path("mlflow").mkdir(exist_ok=True)
    return "sqlite:///mlflow/mlflow.db"


def flatten(cfg: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> dotted keys: ``{"engine": {"lr": 1e-3}} -> {"engine.lr": 1e-3}``;
    lists and tuples become their JSON text."""
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out[key] = json.dumps(list(v))
        elif v is None:
            out[key] = "none"  # one spelling for "not set" across methods (compare view, filters)
        else:
            out[key] = v
    return out


def finite(obj: Any) -> Any:
    """``obj`` with every NaN / infinity replaced by None, so that it is strict JSON
    (JavaScript's ``JSON.parse``, used by the MLflow UI, rejects ``NaN``)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def check_no_identifiers(obj: Any) -> None:
    """Raise ValueError when any mapping key in ``obj`` (nested dicts / lists) names a patient
    identifier (stay_id, subject_id, hadm_id): such a document never leaves the ETL outputs."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if str(k).lower() in _FORBIDDEN_KEYS:
                raise ValueError(f"refusing to write a document with the patient identifier key {k!r}")
            check_no_identifiers(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            check_no_identifiers(v)


class Tracker:
    """Thin MLflow wrapper: a parent run per invocation, nested child runs, batched metrics.

    Args:
        tracking_uri: MLflow URI; None -> :func:`default_tracking_uri`.
        experiment: experiment name (created on first use with the artifact root above).
    """

    def __init__(self, tracking_uri: str | None, experiment: str) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri or default_tracking_uri()
        self._mlflow = mlflow
        mlflow.set_tracking_uri(self.uri)
        self.client = MlflowClient(self.uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            art = self._artifact_root()
            exp_id = self.client.create_experiment(experiment, artifact_location=art)
        else:
            exp_id = exp.experiment_id
        self.experiment_id = exp_id
        self._stack: list[str] = []

    def _artifact_root(self) -> str | None:
        if self.uri.startswith("sqlite:///"):
            db = Path(self.uri[len("sqlite:///"):])
            root = (db.parent / "artifacts").resolve()
            root.mkdir(parents=True, exist_ok=True)
            return root.as_uri()
        return None

    @property
    def run_id(self) -> str:
        """Id of the innermost open run. Raises RuntimeError outside a run."""
        if not self._stack:
            raise RuntimeError("no open MLflow run")
        return self._stack[-1]

    @contextlib.contextmanager
    def _run(self, name: str, params: dict[str, Any] | None, tags: dict[str, str] | None) -> Iterator[str]:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

        all_tags = {MLFLOW_RUN_NAME: name, **(tags or {})}
        if self._stack:
            all_tags[MLFLOW_PARENT_RUN_ID] = self._stack[-1]
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        rid = run.info.run_id
        self._stack.append(rid)
        status = "FAILED"
        try:
            if params:
                self.log_params(params)
            yield rid
            status = "FINISHED"
        finally:
            self._stack.pop()
            self.client.set_terminated(rid, status)

    def parent(self, run_name: str, params: dict[str, Any] | None = None,
               tags: dict[str, str] | None = None) -> contextlib.AbstractContextManager[str]:
        """Open a top-level run (context manager yielding its run id)."""
        return self._run(run_name, params, tags)

    def child(self, run_name: str, params: dict[str, Any] | None = None,
              tags: dict[str, str] | None = None) -> contextlib.AbstractContextManager[str]:
        """Open a run nested under the innermost open run (context manager yielding its id)."""
        return self._run(run_name, params, tags)

    def log_params(self, params: dict[str, Any]) -> None:
        """Log params of the current run in one batch (values stringified, 6000 chars max)."""
        from mlflow.entities import Param

        items = [Param(str(k), str(v)[:6000]) for k, v in params.items()]
        for lo in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[lo : lo + 100])

    def log_dict_params(self, cfg: dict[str, Any]) -> None:
        """Log a nested config as dotted-key params (see :func:`flatten`)."""
        self.log_params(flatten(cfg))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Log a dict of metrics at ``step`` in one batched call (NaN values are skipped)."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k, float(v), ts, int(step)) for k, v in metrics.items() if v == v]
        for lo in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[lo : lo + 1000])

    def log_json(self, obj: Any, artifact_file: str) -> None:
        """Store ``obj`` as a JSON artifact of the current run.

        Raises ValueError when a mapping key names a patient identifier.
        """
        check_no_identifiers(obj)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, os.path.basename(artifact_file))
            with open(path, "w") as fh:
                json.dump(finite(obj), fh, indent=2, allow_nan=False)
            sub = os.path.dirname(artifact_file) or None
            self.client.log_artifact(self.run_id, path, artifact_path=sub)

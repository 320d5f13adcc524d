"""The one MLflow writer and tag schema of the project (:class:`Tracker`): ``abps train``, ``abps
sweep``, the image benchmarks and ``abps report`` all write through it. Store, privacy, tags and
concurrency: docs/runtime.md, "Module notes".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from etl.errors import InputError
from federation.core.targets import target_name

_FORBIDDEN_KEYS = {"stay_id", "subject_id", "hadm_id"}
_T = TypeVar("_T")

# ---- the tag schema ------------------------------------------------------------------------
KIND_TAG = "abps.kind"
KIND_TRAIN, KIND_RUN, KIND_SWEEP, KIND_CELL, KIND_REPORT = "train", "run", "sweep", "cell", "report"
METHOD_TAG = "method"
SEED_TAG = "seed"
COHORT_TAG = "abps.cohort_id"
COHORT_NAME_TAG = "abps.cohort"  # the cohort's folder name (how notes name a cohort; the id is its content hash)
HASH_TAG = "abps.config_hash"
LABEL_TAG = "abps.label"
METRIC_TAG = "abps.metric"  # the split metric of the run's final_auroc_* figures: auroc, or accuracy (images)
SWEEP_TAG = "abps.sweep_hash"
CELL_SECONDS_TAG = "abps.cell_seconds"
EXECUTOR_TAG = "abps.executor"
ENGINE_STEP_TAG = "abps.engine_step"  # federation.engine.kernels.step_name(): fused C++ kernels or eager
BENCHMARK_TAG = "benchmark"
SELECTOR_TAG = "selector"  # SAGE runs: the selector's display name
ARM_TAG = "arm"  # variance-correction runs: the arm (plain / corrected)
GRID_CELL_TAG = "cell"  # variance-correction runs: the grid cell's label
PLATFORM_TAG_PREFIX = "abps.platform."  # + cpu, cpu_capability, machine, threads, versions, engine_step, kernel_*
#: the platform facts whose difference between compared runs the report names
PLATFORM_COMPARED = ("cpu", "cpu_capability", "engine_step", "kernel_flags", "versions")

#: final metrics of a clinical run, logged at step = rounds run (train and sweep alike)
FINAL_KEYS = ("final_auroc_mean", "final_auroc_std", "final_val_auroc_mean", "rounds_run", "best_round",
              "total_bytes", "model_bytes", "probe_bytes", "metadata_bytes", "rel_bandwidth", "n_excluded_test",
              "n_scored_test", "min_scored_test")


def platform_tags(info: dict[str, str]) -> dict[str, str]:
    """Provenance facts (:func:`federation.core.provenance.machine_info`) -> tags under
    :data:`PLATFORM_TAG_PREFIX`."""
    return {PLATFORM_TAG_PREFIX + k: str(v) for k, v in info.items()}


def engine_tags(info: dict[str, str]) -> dict[str, str]:
    """Tags of a clinical run from :func:`federation.engine.kernels.build_info` (computed where the run
    ran): :data:`ENGINE_STEP_TAG` and the platform tags."""
    return {ENGINE_STEP_TAG: info.get("engine_step", "?"), **platform_tags(info)}


#: MLflow's own settings, honoured by every command (a ``--tracking-uri`` / ``--experiment`` option wins)
URI_ENV, EXPERIMENT_ENV = "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"
#: the experiment tag the MLflow UI (3.x) reads to open an experiment on its runs, not on GenAI traces
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
#: headline final metrics, named to sort first in the UI's metric lists (upper case before lower
#: case): the test AUROC mean across centers, bandwidth = cumulative model bytes / FedAvg's reference
#: traffic (n x full fp32 model x reference_rounds; ``rel_bandwidth``), isolation = share of centers
#: with no partner, mean over rounds (``rest_share_mean``; partner-selection methods only)
HEADLINE = {"AUROC": "final_auroc_mean", "Bandwidth": "rel_bandwidth", "Isolation": "rest_share_mean"}


#: URI schemes of the MLflow tracking stores (a URI without ``://`` is a local path)
TRACKING_SCHEMES = ("sqlite", "http", "https", "file", "postgresql", "mysql", "mssql", "databricks",
                    "databricks-uc", "uc")


def check_uri_scheme(uri: str, named_by: str) -> str:
    """``uri`` when its scheme names an MLflow tracking store (:data:`TRACKING_SCHEMES`);
    InputError naming ``named_by`` (the option or environment variable) otherwise: MLflow's own
    message speaks of its model registry."""
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else None
    if scheme is not None and scheme not in TRACKING_SCHEMES:
        raise InputError(f"{named_by} {uri}: no MLflow store has the scheme {scheme!r} "
                         "(e.g. sqlite:///mlflow/mlflow.db or http://HOST:5000)")
    return uri


def default_tracking_uri(make_folder: bool = True) -> str:
    """The ``MLFLOW_TRACKING_URI`` environment variable when set (MLflow's convention, e.g. a shared
    tracking server), else the project's store ``sqlite:///mlflow/mlflow.db`` (relative to the
    working directory; with ``make_folder``, its folder is created when it can be: an unwritable
    folder is reported by :func:`open_client`, naming the store; a reader passes False)."""
    env = os.environ.get(URI_ENV, "").strip()
    if env:
        return check_uri_scheme(env, URI_ENV)
    if make_folder:
        with contextlib.suppress(OSError):
            Path("mlflow").mkdir(exist_ok=True)
    return "sqlite:///mlflow/mlflow.db"


def experiment_name(given: str | None, default: str) -> str:
    """The experiment a command uses: ``given`` (its ``--experiment``), else the
    ``MLFLOW_EXPERIMENT_NAME`` environment variable, else ``default``.

    Raises:
        InputError: ``given`` is an empty or blank name.
    """
    if given is not None and not given.strip():
        raise InputError("--experiment: an empty name; give a name, or leave the option out for the default")
    return given or os.environ.get(EXPERIMENT_ENV, "").strip() or default


def _no_caught_traceback(record) -> bool:
    """Logging filter: False for a record that carries an exception (MLflow logs the database
    error it is about to raise, with its traceback; the command words that error in one line)."""
    return record.exc_info is None


def quiet_mlflow() -> None:
    """Keep MLflow's INFO lines (database creation and upgrades, run links), the tracebacks it logs
    before raising (:func:`_no_caught_traceback`) and library deprecation warnings off the console;
    warnings and other errors still show. Call it after MLflow is imported (its handler is made then)."""
    import logging
    import warnings

    for name in ("mlflow", "alembic"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        for handler in logger.handlers:
            if _no_caught_traceback not in handler.filters:
                handler.addFilter(_no_caught_traceback)
    for mod in ("mlflow", "starlette", "pydantic", "alembic", "sqlalchemy"):
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=mod)
        warnings.filterwarnings("ignore", category=FutureWarning, module=mod)


def headline_metrics(final: dict[str, Any]) -> dict[str, float]:
    """The :data:`HEADLINE` metrics of a run's final metrics (those present and finite)."""
    out = {}
    for name, key in HEADLINE.items():
        v = final.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
            out[name] = float(v)
    return out


def target_metrics(reached: list[dict[str, Any]]) -> dict[str, float]:
    """``rounds_to_auroc_<t>`` and ``bytes_to_auroc_<t>`` (``<t>`` with three decimals) of each
    reached target of a run summary's ``bytes_to_target`` (federation.core.targets.reach_all); a
    target never reached logs nothing (MLflow has no "not reached" value; never 0)."""
    out: dict[str, float] = {}
    for e in reached:
        if e.get("round") is not None:
            name = target_name(float(e["auroc"]))
            out[f"rounds_to_auroc_{name}"] = float(e["round"])
            out[f"bytes_to_auroc_{name}"] = float(e["bytes"])
    return out


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


def seed_of(tags: dict[str, str]) -> int | None:
    """The seed of a run from its ``seed`` tag; None when the tag is missing or not an integer (a
    run this program did not log, skipped by the readers)."""
    try:
        return int(tags[SEED_TAG])
    except (KeyError, ValueError):
        return None


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (relative to the working folder when
    the URI's path is), else None."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def _engine_uri(uri: str) -> str:
    """The URI handed to MLflow: a relative sqlite path made absolute. MLflow keeps one database
    engine per URI string for the process, so ``sqlite:///mlflow/mlflow.db`` would otherwise go
    on writing to the first working directory's store after a change of directory."""
    db = sqlite_path(uri)
    return f"sqlite:///{db.resolve()}" if db is not None and not db.is_absolute() else uri


def store_lock(uri: str, timeout_s: float = 600.0) -> contextlib.AbstractContextManager[Any]:
    """An inter-process lock for one-time store work (schema creation, experiment creation):
    a :class:`filelock.FileLock` on ``<db>.lock`` beside a sqlite store; no lock for other
    stores (an MLflow server serializes itself)."""
    db = sqlite_path(uri)
    if db is None:
        return contextlib.nullcontext()
    from filelock import FileLock

    db.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(db) + ".lock", timeout=timeout_s)


def _retry(fn: Callable[[], _T], attempts: int = 8, first_wait_s: float = 0.05) -> _T:
    """Call ``fn``; when it fails because another process holds the sqlite database ("database is
    locked"), wait (doubling) and try again, up to ``attempts`` times; other errors pass through."""
    wait = first_wait_s
    for i in range(attempts):
        try:
            return fn()
        except Exception as exc:  # MLflowException wrapping sqlalchemy's OperationalError
            if i == attempts - 1 or "database is locked" not in str(exc):
                raise
            time.sleep(wait)
            wait *= 2
    raise AssertionError("unreachable")


_SQLITE_MAGIC = b"SQLite format 3\x00"


def _store_error(uri: str, exc: BaseException) -> InputError:
    """One line naming the store for an MLflow / SQLAlchemy / OS failure on it (their messages run to
    a hundred lines)."""
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    if "MLFLOW_ALLOW_FILE_STORE" in text:  # MLflow 3 refuses folder stores; its advice ends past 300 characters
        return InputError(f"MLflow store {uri}: MLflow no longer writes folder stores (./mlruns); give "
                          "--tracking-uri sqlite:///<folder>/mlflow.db (or set MLFLOW_ALLOW_FILE_STORE=true "
                          "to keep using the folder)")
    return InputError(f"MLflow store {uri}: {text[:300]}")


def _check_server(uri: str, timeout_s: float = 10.0) -> None:
    """InputError when the tracking server of ``uri`` does not accept a TCP connection, or accepts
    one and sends no HTTP answer to ``GET <uri>/health`` within ``timeout_s`` (any status counts as
    an answer: a server behind a login still answers)."""
    import http.client
    import socket
    import ssl
    import urllib.error
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname or "", port), timeout=timeout_s):
            pass
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc) or exc.__class__.__name__
        raise InputError(f"MLflow tracking server {uri}: cannot connect ({why})") from None
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return  # it answers HTTP; MLflow's own requests say what it refuses
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLError):
            return  # it answers TLS; MLflow verifies the certificate under its own settings
        if isinstance(reason, (TimeoutError, socket.timeout)):
            why = f"no answer within {timeout_s:g} s"
        elif isinstance(reason, http.client.HTTPException):
            why = f"no HTTP answer ({type(reason).__name__})"
        else:
            why = f"no HTTP answer ({getattr(reason, 'strerror', None) or type(reason).__name__})"
        raise InputError(f"MLflow tracking server {uri}: it accepts connections but sent {why}") from None


def _mlflow_schema(db: Path) -> bool:
    """True when the SQLite file ``db`` holds MLflow's tables (``alembic_version`` and
    ``experiments``), or no table at all (a new store); read-only, through ``sqlite3``."""
    import sqlite3

    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error:
        return True  # unreadable here: MLflow's own error names it
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error:
        return True
    finally:
        con.close()
    return not tables or {"alembic_version", "experiments"} <= tables


def check_store(uri: str) -> None:
    """Refuse a sqlite store file that is not an SQLite database (a truncated or foreign file),
    naming it, before MLflow reads it. A missing or empty file is a new store.

    An http(s) tracking server that does not accept a connection within 10 s is refused too:
    MLflow's client retries it with back-off for minutes before it says so.

    Raises:
        InputError: the path is a folder, unreadable, or not an SQLite database; the server
            cannot be reached.
    """
    if uri.startswith(("http://", "https://")):
        _check_server(uri)
        return
    db = sqlite_path(uri)
    if db is None or not db.exists():
        return
    if not db.is_file():
        raise InputError(f"MLflow store {db}: not a file")
    try:
        with open(db, "rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
    except OSError as exc:
        raise InputError(f"MLflow store {db}: cannot read it ({exc.strerror})") from None
    if head and head != _SQLITE_MAGIC:
        raise InputError(f"MLflow store {db}: not an SQLite database (damaged or another file); move it "
                         "aside or give another --tracking-uri")
    if head and not _mlflow_schema(db):  # MLflow would add its tables to another program's database
        raise InputError(f"MLflow store {db}: an SQLite database that MLflow did not write (no MLflow tables); "
                         "give another --tracking-uri")


def open_client(uri: str, write: bool = True) -> Any:
    """An ``MlflowClient`` on ``uri`` whose store exists: a new sqlite store's schema is created
    here, once, under :func:`store_lock` (concurrent first users used to crash on the race).

    ``write=False`` (reading commands: ``abps runs``, ``abps report``) reads a store whose folder
    cannot be written (no lock file can be made there; a reader needs none).

    Raises:
        InputError: the store is damaged, unreadable, or (``write``) cannot be written; one line
            naming it.
    """
    from mlflow.tracking import MlflowClient

    quiet_mlflow()
    check_store(uri)
    db = sqlite_path(uri)
    if db is not None and write:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"MLflow store {db}: cannot create its folder ({exc.strerror})") from None
        probe = db if db.exists() else db.parent
        if not os.access(probe, os.W_OK) or _read_only_fs(db.parent):
            raise InputError(f"MLflow store {db}: not writable; give another --tracking-uri")
    lock = store_lock(uri) if write or db is None or not db.is_file() else contextlib.nullcontext()
    try:
        with lock:
            client = MlflowClient(_engine_uri(uri))
            client.search_experiments(max_results=1)  # creates / upgrades the schema
    except InputError:
        raise
    except Exception as exc:  # sqlalchemy / MLflow / filelock: one line naming the store
        raise _store_error(uri, exc) from None
    return client


def _read_only_fs(path: Path) -> bool:
    """True when ``path`` lies on a file system mounted read-only (``os.access`` says writable there
    for root)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class Tracker:
    """The MLflow writer: runs (nested through a stack or under an explicit parent), batched
    params and metrics, strict-JSON artifacts, searches.

    Args:
        tracking_uri: MLflow URI; None -> :func:`default_tracking_uri`.
        experiment: experiment name (created on first use, under :func:`store_lock`, with the
            artifact root beside a sqlite store).
        create: False -> raise InputError when the experiment does not exist (``abps report``).
    """

    def __init__(self, tracking_uri: str | None, experiment: str, create: bool = True) -> None:
        # the client carries the URI; mlflow.set_tracking_uri would also export it as
        # MLFLOW_TRACKING_URI, so that every later command in the process followed this store
        self.uri = tracking_uri or default_tracking_uri()
        self.client = open_client(self.uri, write=create)
        try:
            exp = self.client.get_experiment_by_name(experiment)
        except Exception as exc:
            raise _store_error(self.uri, exc) from None
        if exp is None and not create:
            raise InputError(f"--experiment {experiment!r}: no such MLflow experiment in {self.uri}")
        if exp is not None and exp.lifecycle_stage == "deleted":  # MLflow refuses runs in it, naming only its id
            raise InputError(f"MLflow experiment {experiment!r} is deleted in {self.uri}: restore it (mlflow "
                             f"experiments restore --experiment-id {exp.experiment_id}) or give another --experiment")
        if exp is None:
            with store_lock(self.uri):
                exp = self.client.get_experiment_by_name(experiment)  # another process may have made it
                exp_id = exp.experiment_id if exp is not None else \
                    self.client.create_experiment(experiment, artifact_location=self._artifact_root(),
                                                  tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        else:
            exp_id = exp.experiment_id
            if create and EXPERIMENT_KIND_TAG not in exp.tags:  # made before the tag, or by another tool
                _retry(lambda: self.client.set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND))
        self.experiment_id = exp_id
        self._stack: list[str] = []
        self._end: dict[str, tuple[str | None, int | None]] = {}

    def _artifact_root(self) -> str | None:
        db = sqlite_path(self.uri)
        if db is None:
            return None
        root = (db.parent / "artifacts").resolve()
        root.mkdir(parents=True, exist_ok=True)
        return root.as_uri()

    @property
    def run_id(self) -> str:
        """Id of the innermost open run. Raises RuntimeError outside a run."""
        if not self._stack:
            raise RuntimeError("no open MLflow run")
        return self._stack[-1]

    @contextlib.contextmanager
    def _open(self, rid: str) -> Iterator[str]:
        """Push ``rid``; at exit terminate it FINISHED (FAILED on an exception), or with what
        :meth:`finish_as` set."""
        self._stack.append(rid)
        failed = True
        try:
            yield rid
            failed = False
        finally:
            self._stack.pop()
            status, end = self._end.pop(rid, (None, None))
            self.close(rid, "FAILED" if failed else (status or "FINISHED"), end)

    def create(self, name: str, params: dict[str, Any] | None = None, tags: dict[str, str] | None = None,
               parent_id: str | None = None, start_time_ms: int | None = None) -> str:
        """Create a RUNNING run and return its id (close it with :meth:`close`): nested under
        ``parent_id``, else under the innermost open run, else top-level. ``start_time_ms``
        (epoch ms, default now) is when its work started. Every run carries this machine's
        provenance tags (:func:`federation.core.provenance.machine_info`); a run computed elsewhere (a
        Ray worker) overwrites them with its own."""
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

        from federation.core import provenance  # imports torch: only a writer needs it

        all_tags = {MLFLOW_RUN_NAME: name, **platform_tags(provenance.machine_info()), **(tags or {})}
        parent = parent_id or (self._stack[-1] if self._stack else None)
        if parent:
            all_tags[MLFLOW_PARENT_RUN_ID] = parent
        run = _retry(lambda: self.client.create_run(self.experiment_id, start_time=start_time_ms, tags=all_tags,
                                                    run_name=name))
        rid = run.info.run_id
        if params:
            with self.on(rid):
                self.log_params(params)
        return rid

    @contextlib.contextmanager
    def on(self, run_id: str) -> Iterator[str]:
        """Make ``run_id`` the innermost run for the block (no status change)."""
        self._stack.append(run_id)
        try:
            yield run_id
        finally:
            self._stack.pop()

    def close(self, run_id: str, status: str = "FINISHED", end_time_ms: int | None = None) -> None:
        """End a run: ``status`` (FINISHED, FAILED, KILLED) at ``end_time_ms`` (default now)."""
        _retry(lambda: self.client.set_terminated(run_id, status, end_time_ms))

    def run(self, name: str, params: dict[str, Any] | None = None, tags: dict[str, str] | None = None,
            parent_id: str | None = None, start_time_ms: int | None = None) -> contextlib.AbstractContextManager[str]:
        """:meth:`create` a run and open it for the block (context manager yielding its id); it
        ends FINISHED, FAILED on an exception (KeyboardInterrupt included), or as :meth:`finish_as` set."""
        rid = self.create(name, None, tags, parent_id, start_time_ms)

        @contextlib.contextmanager
        def cm() -> Iterator[str]:
            with self._open(rid):
                if params:
                    self.log_params(params)
                yield rid

        return cm()

    def reopen(self, run_id: str) -> None:
        """Set an ended or interrupted run RUNNING again (it is then logged to with :meth:`on` and
        ended with :meth:`close`)."""
        _retry(lambda: self.client.update_run(run_id, status="RUNNING"))

    def resume(self, run_id: str) -> contextlib.AbstractContextManager[str]:
        """Reopen an existing run (status RUNNING) as the innermost run; ends like :meth:`run`."""
        self.reopen(run_id)
        return self._open(run_id)

    def parent(self, run_name: str, params: dict[str, Any] | None = None,
               tags: dict[str, str] | None = None) -> contextlib.AbstractContextManager[str]:
        """Open a top-level run (context manager yielding its run id)."""
        return self.run(run_name, params, tags)

    def child(self, run_name: str, params: dict[str, Any] | None = None,
              tags: dict[str, str] | None = None) -> contextlib.AbstractContextManager[str]:
        """Open a run nested under the innermost open run (context manager yielding its id)."""
        return self.run(run_name, params, tags)

    def finish_as(self, status: str | None = None, end_time_ms: int | None = None) -> None:
        """Status (default FINISHED) and end time (default now) the innermost run gets when it
        closes without an exception."""
        self._end[self.run_id] = (status, end_time_ms)

    def set_tags(self, tags: dict[str, Any]) -> None:
        """Set tags of the innermost run (values stringified)."""
        from mlflow.entities import RunTag

        items = [RunTag(str(k), str(v)) for k, v in tags.items()]
        rid = self.run_id
        _retry(lambda: self.client.log_batch(rid, tags=items))

    def log_params(self, params: dict[str, Any]) -> None:
        """Log params of the current run in one batch (values stringified, 6000 chars max)."""
        from mlflow.entities import Param

        items = [Param(str(k), str(v)[:6000]) for k, v in params.items()]
        rid = self.run_id
        for lo in range(0, len(items), 100):
            _retry(lambda: self.client.log_batch(rid, params=items[lo : lo + 100]))

    def log_dict_params(self, cfg: dict[str, Any]) -> None:
        """Log a nested config as dotted-key params (see :func:`flatten`)."""
        self.log_params(flatten(cfg))

    def log_metrics(self, metrics: dict[str, Any], step: int, timestamp_ms: int | None = None) -> None:
        """Log a dict of metrics at ``step`` in one batched call. NaN, infinite and None values
        are skipped (MLflow's UI cannot plot them; a NaN AUROC means "undefined", not a value);
        ``timestamp_ms`` (epoch ms, default now) is when the value was computed."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
        items = [Metric(k, float(v), ts, int(step)) for k, v in metrics.items()
                 if v is not None and math.isfinite(float(v))]
        rid = self.run_id
        for lo in range(0, len(items), 1000):
            _retry(lambda: self.client.log_batch(rid, metrics=items[lo : lo + 1000]))

    def log_history(self, history: list[dict[str, float]], times_ms: list[int] | None = None) -> None:
        """Log per-round metric rows (each with its ``round``; step = round) in batches, each
        value stamped with the time its round ended when ``times_ms`` is given."""
        for i, row in enumerate(history):
            ts = times_ms[i] if times_ms and i < len(times_ms) else None
            self.log_metrics({k: v for k, v in row.items() if k != "round"}, int(row["round"]), ts)

    def log_final(self, summary: dict[str, Any]) -> None:
        """Log the :data:`FINAL_KEYS` of a run summary, the finite numbers of its
        ``method_summary`` (a method's ``final_metrics``, e.g. ABPS's ``rest_share_mean``), its
        reached targets (:func:`target_metrics`) and the :data:`HEADLINE` metrics as final metrics
        at step = rounds run."""
        final = {k: summary[k] for k in FINAL_KEYS if k in summary}
        final.update({k: float(v) for k, v in (summary.get("method_summary") or {}).items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))})
        final.update(target_metrics(summary.get("bytes_to_target") or []))
        self.log_metrics({**headline_metrics(final), **final}, int(summary.get("rounds_run") or 0))

    def log_json(self, obj: Any, artifact_file: str) -> None:
        """Store ``obj`` as a strict-JSON artifact of the current run (NaN / infinity -> null).

        Raises ValueError when a mapping key names a patient identifier.
        """
        check_no_identifiers(obj)
        rid = self.run_id
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, os.path.basename(artifact_file))
            with open(path, "w") as fh:
                json.dump(finite(obj), fh, indent=2, allow_nan=False)
            sub = os.path.dirname(artifact_file) or None
            _retry(lambda: self.client.log_artifact(rid, path, artifact_path=sub))

    def log_file(self, path: str | Path) -> None:
        """Store a file (a report's table or figure) as an artifact of the current run."""
        rid = self.run_id
        _retry(lambda: self.client.log_artifact(rid, str(path)))

    def search(self, filter_string: str) -> list[Any]:
        """Every run of the experiment matching ``filter_string`` (all pages)."""
        return search_all(self.client, self.experiment_id, filter_string)


def search_all(client: Any, experiment_id: str, filter_string: str) -> list[Any]:
    """Every active run of experiment ``experiment_id`` matching ``filter_string``, all pages of
    ``client.search_runs`` (an ``MlflowClient``), newest first."""
    out: list[Any] = []
    token = None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string, max_results=1000, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out

"""Reading an experiment's finished runs for the commands that only look (``abps runs``, the URL
``abps ui`` prints): ``sqlite3`` on the project's sqlite store, MLflow's client on any other
(docs/runtime.md, Module notes).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from etl.errors import InputError
from federation.run.tracking import (
    _store_error,
    check_store,
    default_tracking_uri,
    open_client,
    search_all,
    sqlite_path,
)

__all__ = ["RunStore", "StoredRun", "open_store"]

#: MLflow tracking tables and the columns read here
_COLUMNS = {
    "experiments": {"experiment_id", "name", "lifecycle_stage", "creation_time"},
    "runs": {"run_uuid", "name", "status", "start_time", "end_time", "lifecycle_stage", "experiment_id"},
    "tags": {"key", "value", "run_uuid"},
    "params": {"key", "value", "run_uuid"},
    "latest_metrics": {"key", "value", "is_nan", "run_uuid"},
}
_DEFAULT_WORKSPACE = "default"  # MLflow's single-tenant workspace (mlflow.utils.workspace_utils)


@dataclass(frozen=True)
class RunInfo:
    """The fields of ``mlflow.entities.RunInfo`` read by the run list (times in epoch ms)."""

    run_id: str
    run_name: str | None
    experiment_id: str
    status: str
    start_time: int | None
    end_time: int | None


@dataclass(frozen=True)
class RunData:
    """``mlflow.entities.RunData``: latest metric values, params and tags, each name -> value."""

    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredRun:
    """One run as ``mlflow.entities.Run`` presents it (``.info``, ``.data``)."""

    info: RunInfo
    data: RunData


class RunStore(Protocol):
    """What the run list reads from a tracking store."""

    uri: str

    def experiment_id(self, name: str) -> str | None:
        """The id of experiment ``name`` (deleted ones included, as MLflow's lookup by name), or None."""

    def latest_experiment_with_runs(self) -> str | None:
        """The name of the most recently used active experiment (the one holding the active run
        that started last), or None."""

    def finished_runs(self, experiment_id: str) -> list[Any]:
        """The experiment's active FINISHED runs, newest first (MLflow's ``search_runs`` order)."""


class _SqliteStore:
    """:class:`RunStore` on an MLflow sqlite file through ``sqlite3``, read-only."""

    def __init__(self, uri: str, con: sqlite3.Connection) -> None:
        self.uri, self._con = uri, con

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._con.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise _store_error(self.uri, exc) from None

    def experiment_id(self, name: str) -> str | None:
        rows = self._rows("SELECT experiment_id FROM experiments WHERE name = ?", (name,))
        return str(rows[0][0]) if rows else None

    def latest_experiment_with_runs(self) -> str | None:
        rows = self._rows(
            "SELECT e.name FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id "
            "WHERE e.lifecycle_stage = 'active' AND r.lifecycle_stage = 'active' "
            "ORDER BY r.start_time DESC, r.run_uuid LIMIT 1")
        return str(rows[0][0]) if rows else None

    def finished_runs(self, experiment_id: str) -> list[StoredRun]:
        runs = self._rows(
            "SELECT run_uuid, name, experiment_id, status, start_time, end_time FROM runs WHERE experiment_id = ? "
            "AND lifecycle_stage = 'active' AND status = 'FINISHED' ORDER BY start_time DESC, run_uuid",
            (int(experiment_id),))
        ids = [r[0] for r in runs]
        where = "run_uuid IN (SELECT run_uuid FROM runs WHERE experiment_id = ?)"
        tags: dict[str, dict[str, str]] = {i: {} for i in ids}
        params: dict[str, dict[str, str]] = {i: {} for i in ids}
        metrics: dict[str, dict[str, float]] = {i: {} for i in ids}
        for table, into in (("tags", tags), ("params", params)):
            for key, value, rid in self._rows(f"SELECT key, value, run_uuid FROM {table} WHERE {where}",
                                              (int(experiment_id),)):
                if rid in into:
                    into[rid][key] = value
        for key, value, is_nan, rid in self._rows(
                f"SELECT key, value, is_nan, run_uuid FROM latest_metrics WHERE {where}", (int(experiment_id),)):
            if rid in metrics:
                metrics[rid][key] = float("nan") if is_nan else float(value)
        return [StoredRun(RunInfo(rid, name, str(exp), status, start, end),
                          RunData(metrics=metrics[rid], params=params[rid], tags=tags[rid]))
                for rid, name, exp, status, start, end in runs]


class _ClientStore:
    """:class:`RunStore` through :class:`mlflow.tracking.MlflowClient` (any MLflow store or server)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._client = open_client(uri, write=False)

    def experiment_id(self, name: str) -> str | None:
        try:
            exp = self._client.get_experiment_by_name(name)
        except Exception as exc:
            raise _store_error(self.uri, exc) from None
        return None if exp is None else str(exp.experiment_id)

    def latest_experiment_with_runs(self) -> str | None:
        exps = {str(e.experiment_id): str(e.name) for e in self._client.search_experiments(max_results=1000)}
        if not exps:
            return None
        runs = self._client.search_runs(list(exps), max_results=1, order_by=["attributes.start_time DESC", "attributes.run_id"])
        return exps[str(runs[0].info.experiment_id)] if runs else None

    def finished_runs(self, experiment_id: str) -> list[Any]:
        return search_all(self._client, experiment_id, "attributes.status = 'FINISHED'")


def _open_sqlite(db: Path) -> sqlite3.Connection | None:
    """A read-only connection to the MLflow sqlite file ``db`` when its schema has every column
    :class:`_SqliteStore` reads and no experiment outside the default workspace; else None."""
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error:
        return None
    try:
        for table, needed in _COLUMNS.items():
            have = {row[1] for row in con.execute(f"PRAGMA table_info({table})")}
            if not needed <= have:
                con.close()
                return None
        have = {row[1] for row in con.execute("PRAGMA table_info(experiments)")}
        if "workspace" in have and con.execute(
                "SELECT 1 FROM experiments WHERE workspace IS NOT NULL AND workspace != ? LIMIT 1",
                (_DEFAULT_WORKSPACE,)).fetchone():
            con.close()
            return None
    except sqlite3.Error:
        con.close()
        return None
    return con


@contextlib.contextmanager
def open_store(tracking_uri: str | None) -> Iterator[RunStore]:
    """The store at ``tracking_uri`` (None: :func:`~federation.run.tracking.default_tracking_uri`)
    for reading runs: ``sqlite3`` on an existing local sqlite file MLflow wrote, no experiment at
    all for a local sqlite file that does not exist (nothing is made), else MLflow's client.
    Nothing is written to an existing store.

    Raises:
        InputError: the store is damaged or unreadable (one line naming it).
    """
    uri = tracking_uri or default_tracking_uri(make_folder=False)  # a reader makes nothing
    db = sqlite_path(uri)
    con = None
    if db is not None and (not db.exists() or (db.is_file() and db.stat().st_size == 0)):
        yield _EmptyStore(uri)  # no store yet (or an empty file): nothing to read, and nothing made
        return
    if db is not None and db.is_file() and db.stat().st_size > 0:
        check_store(uri)
        con = _open_sqlite(db)
    if con is None:
        check_store(uri)  # a server that does not answer is named at once
        yield _ClientStore(uri)
        return
    try:
        yield _SqliteStore(uri, con)
    finally:
        con.close()


class _EmptyStore:
    """:class:`RunStore` of a local sqlite store that does not exist yet: no experiment, no run."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def experiment_id(self, name: str) -> str | None:  # noqa: ARG002
        return None

    def latest_experiment_with_runs(self) -> str | None:
        return None

    def finished_runs(self, experiment_id: str) -> list[StoredRun]:  # noqa: ARG002
        return []


def experiment_or_error(store: RunStore, name: str, named_by: str = "--experiment") -> str:
    """The id of experiment ``name``; InputError naming it, what named it (``named_by``: the option
    or the environment variable) and the store when there is none."""
    exp = store.experiment_id(name)
    if exp is None:
        raise InputError(f"{named_by} {name!r}: no such MLflow experiment in {store.uri}")
    return exp

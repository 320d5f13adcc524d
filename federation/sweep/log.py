"""The MLflow side of a sweep (driver process only), written through :class:`federation.run.tracking.Tracker`.

One parent run per sweep (found again by its sweep hash on a rerun) and one child run per cell.
A cell's run is created when its work starts (start time = the cell's real start), its per-round
metrics are logged while it runs (stamped with the time each round ended), and it is marked
FINISHED, with the cell's real end time, only after its final metrics, tags and artifacts are
logged. A cell that fails, or a driver that is interrupted, leaves the run FAILED; a driver that
is killed (``kill -9``) leaves it RUNNING. On the rerun, a cell that goes on from its round
checkpoint continues its newest interrupted run (same run id; steps it holds are not logged again);
one computed from round 0 marks runs left RUNNING KILLED and starts a new run.
"""

from __future__ import annotations

from typing import Any

from federation.core.evaluation import log_clinical, publishable_per_center
from federation.run.tracking import (
    CELL_SECONDS_TAG,
    COHORT_NAME_TAG,
    COHORT_TAG,
    ENGINE_STEP_TAG,
    HASH_TAG,
    KIND_CELL,
    KIND_SWEEP,
    KIND_TAG,
    LABEL_TAG,
    METHOD_TAG,
    METRIC_TAG,
    SEED_TAG,
    SWEEP_TAG,
    Tracker,
    engine_tags,
    flatten,
)
from federation.sweep.cells import Cell

__all__ = ["cell_params", "finished_cells", "finished_labels", "stale_runs", "interrupted_runs", "open_parent", "CellLog"]

Key = tuple[str, int]


def cell_params(cell: Cell, cohort: str) -> dict[str, str]:
    """The params of a cell run: flattened config, seed, label, cohort_id, as strings."""
    flat = flatten(cell.config.model_dump(mode="json"))
    flat.update({"seed": cell.seed, "label": cell.label, "cohort_id": cohort})
    return {k: str(v) for k, v in flat.items()}


def _keys(runs: list[Any]) -> dict[Key, list[str]]:
    out: dict[Key, list[str]] = {}
    for r in runs:
        t = r.data.tags
        if HASH_TAG in t and SEED_TAG in t:
            out.setdefault((t[HASH_TAG], int(t[SEED_TAG])), []).append(r.info.run_id)
    return out


def finished_cells(tracker: Tracker) -> set[Key]:
    """``(config_hash, seed)`` of every FINISHED cell run of the tracker's experiment."""
    return set(finished_labels(tracker))


def finished_labels(tracker: Tracker) -> dict[Key, set[str]]:
    """``(config_hash, seed)`` -> the row labels its FINISHED cell runs carry, in the tracker's experiment."""
    out: dict[Key, set[str]] = {}
    for r in tracker.search(f"tags.`{KIND_TAG}` = '{KIND_CELL}' and attributes.status = 'FINISHED'"):
        t = r.data.tags
        if HASH_TAG in t and SEED_TAG in t:
            out.setdefault((t[HASH_TAG], int(t[SEED_TAG])), set()).add(t.get(LABEL_TAG, ""))
    return out


def stale_runs(tracker: Tracker) -> dict[Key, list[str]]:
    """Cell runs left RUNNING (a killed sweep), by key."""
    return _keys(tracker.search(f"tags.`{KIND_TAG}` = '{KIND_CELL}' and attributes.status = 'RUNNING'"))


def interrupted_runs(tracker: Tracker) -> dict[Key, str]:
    """The newest cell run left RUNNING (a killed sweep) or FAILED (an interrupted one), by key: the
    run a cell that goes on from its round checkpoint continues."""
    runs = tracker.search(f"tags.`{KIND_TAG}` = '{KIND_CELL}' and attributes.status != 'FINISHED'")
    runs = [r for r in runs if r.info.status in ("RUNNING", "FAILED")]
    return {k: ids[-1] for k, ids in _keys(sorted(runs, key=lambda r: r.info.start_time)).items()}


def open_parent(tracker: Tracker, name: str, cells: list[Cell], cohort: str, sweep_hash: str) -> Any:
    """The sweep's parent run as a context manager yielding its id: the run with the same sweep
    hash reopened, or a new one. Ends FINISHED unless the caller sets otherwise
    (``tracker.finish_as``), FAILED on an exception."""
    found = tracker.search(f"tags.`{KIND_TAG}` = '{KIND_SWEEP}' and tags.`{SWEEP_TAG}` = '{sweep_hash}'")
    if found:
        return tracker.resume(sorted(found, key=lambda r: r.info.start_time)[0].info.run_id)
    params = {"sweep": name, "n_cells": len(cells), "labels": " ".join(dict.fromkeys(c.label for c in cells)),
              "seeds": " ".join(str(s) for s in dict.fromkeys(c.seed for c in cells)), "cohort_id": cohort}
    return tracker.run(name, params, {KIND_TAG: KIND_SWEEP, SWEEP_TAG: sweep_hash, COHORT_TAG: cohort})


class CellLog:
    """Cell runs as their work happens (see the module docstring).

    Args:
        tracker: the sweep's tracker (its innermost run is the parent).
        parent_id: the sweep's parent run.
        cohort: cohort id.
        all_keys: the union of the cells' param keys (a key a cell lacks is logged as "none",
            so the MLflow compare view lines runs up).
        sweep_hash: the sweep's identity tag.
        stale: runs left RUNNING by a killed sweep, by key (marked KILLED when their cell restarts).
        cohort_name: the cohort's folder name (tag ``abps.cohort``).
        interrupted: :func:`interrupted_runs` (continued by a cell that resumes from its checkpoint).
        metric: the cohort's split metric (tag ``abps.metric``: ``auroc``, or ``accuracy`` on images).
    """

    def __init__(self, tracker: Tracker, parent_id: str, cohort: str, all_keys: list[str], sweep_hash: str,
                 stale: dict[Key, list[str]], cohort_name: str = "", interrupted: dict[Key, str] | None = None,
                 metric: str = "auroc") -> None:
        self.tracker, self.parent_id, self.cohort, self.cohort_name = tracker, parent_id, cohort, cohort_name
        self.metric = metric
        self.all_keys, self.sweep_hash, self.stale = all_keys, sweep_hash, stale
        self.interrupted = dict(interrupted or {})
        self.open: dict[Key, list[Any]] = {}  # key -> [run id, steps logged]

    def start(self, cell: Cell, ms: int | None, resumed: int = 0) -> str:
        """Create the cell's run (once), with its start time ``ms`` (epoch ms); a cell that goes on
        after round ``resumed`` > 0 of its checkpoint continues its interrupted run when there is one."""
        if cell.key in self.open:
            return self.open[cell.key][0]
        going_on = self.interrupted.pop(cell.key, None) if resumed > 0 else None
        for rid in self.stale.pop(cell.key, []):
            if rid != going_on:
                self.tracker.close(rid, "KILLED")
        if going_on is not None:
            self.tracker.reopen(going_on)
            steps = {m.step for m in self.tracker.client.get_metric_history(going_on, "cum_bytes")}
            self.open[cell.key] = [going_on, steps]
            return going_on
        tags = {KIND_TAG: KIND_CELL, HASH_TAG: cell.config_hash, COHORT_TAG: self.cohort, LABEL_TAG: cell.label,
                COHORT_NAME_TAG: self.cohort_name,
                SWEEP_TAG: self.sweep_hash, METHOD_TAG: cell.method, SEED_TAG: str(cell.seed), METRIC_TAG: self.metric}
        params = cell_params(cell, self.cohort)
        rid = self.tracker.create(cell.run_name, {k: params.get(k, "none") for k in self.all_keys}, tags,
                                  parent_id=self.parent_id, start_time_ms=ms)
        self.open[cell.key] = [rid, set()]
        return rid

    def event(self, kind: str, cell: Cell, payload: dict[str, Any]) -> None:
        """A live event of a running cell: ``start`` (``{"ms"}``) or ``round`` (``{"step",
        "metrics", "ms"}``; the metrics are logged now, at that step and time)."""
        if kind == "start":
            self.start(cell, payload.get("ms"), int(payload.get("resumed") or 0))
        elif kind == "round":
            rid = self.start(cell, payload.get("ms"))
            step = int(payload["step"])
            if step not in self.open[cell.key][1]:
                with self.tracker.on(rid):
                    self.tracker.log_metrics(payload["metrics"], step, payload.get("ms"))
                self.open[cell.key][1].add(step)

    def finish(self, cell: Cell, result: dict[str, Any]) -> str:
        """Log the rest of a computed cell and mark its run FINISHED at the cell's real end time
        (FAILED when logging fails or is interrupted). Returns the run id."""
        rid = self.start(cell, result.get("started_ms"))
        logged = self.open[cell.key][1]
        tr = self.tracker
        try:
            with tr.on(rid):
                times = result.get("round_ms") or []
                rows = [(row, times[i] if i < len(times) else None) for i, row in enumerate(result["history"])]
                for row, ms in rows:
                    if int(row["round"]) not in logged:  # rounds the live log has not seen
                        tr.log_metrics({k: v for k, v in row.items() if k != "round"}, int(row["round"]), ms)
                tr.log_final(result["summary"])
                tags = {CELL_SECONDS_TAG: f"{result.get('seconds', 0.0):.2f}"}
                if result.get("engine_step"):
                    tags[ENGINE_STEP_TAG] = result["engine_step"]  # the worker's step (fused / eager)
                if result.get("platform"):
                    tags.update(engine_tags(result["platform"]))  # the worker's machine and kernel build
                tr.set_tags(tags)
                log_clinical(tr, result.get("clinical"), int(result["summary"].get("rounds_run") or 0))
                tr.log_json(publishable_per_center(result["per_center"]), "per_center.json")
                for name, obj in (result.get("artifacts") or {}).items():
                    tr.log_json(obj, name)
                tr.log_json(cell.config.model_dump(mode="json"), "config.json")
        except BaseException:
            self.open.pop(cell.key, None)
            tr.close(rid, "FAILED")
            raise
        self.open.pop(cell.key, None)
        tr.close(rid, "FINISHED", result.get("ended_ms"))
        return rid

    def fail(self, cell: Cell) -> None:
        """The cell raised: its run (if it started) ends FAILED."""
        entry = self.open.pop(cell.key, None)
        if entry is not None:
            self.tracker.close(entry[0], "FAILED")

    def abort(self) -> None:
        """The driver is stopping: every open cell run ends FAILED."""
        for key in list(self.open):
            rid = self.open.pop(key)[0]
            self.tracker.close(rid, "FAILED")

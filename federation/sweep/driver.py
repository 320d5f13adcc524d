"""The sweep driver: :func:`run_sweep` expands the cells, skips the FINISHED ones, runs the rest on
an executor and logs every cell through :class:`federation.sweep.log.CellLog` as it runs."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etl.errors import InputError
from etl.io import folder_name
from federation.data.load import federation_id, load_federation
from federation.run.tracking import EXECUTOR_TAG, Tracker
from federation.sweep.cells import Cell, checkpoint_file, expand_cells, sweep_hash
from federation.sweep.executors import Event, check_reachable, run_pool, run_ray, run_serial
from federation.sweep.log import CellLog, cell_params, finished_labels, interrupted_runs, open_parent, stale_runs
from federation.sweep.schedule import longest_first
from federation.sweep.spec import Resources, SweepSpec

__all__ = ["SweepOutcome", "run_sweep"]


@dataclass
class SweepOutcome:
    """What a sweep did.

    Attributes:
        parent_run_id: the sweep's MLflow parent run.
        experiment_id: its experiment.
        cells: all cells of the sweep.
        skipped: keys of cells that already had a FINISHED run.
        ran: key -> child run id of the cells computed and logged now.
        failed: key -> one-line error of the cells that raised.
        summaries: key -> final summary of the cells computed now.
        dropped: per distinct ``min_train`` of the cells, the centers the cohort loses (counts
            only, :attr:`FederatedData.dropped`) and the number kept.
        seconds: key -> wall seconds of the cell's run inside its worker (``run_cell``'s ``seconds``).
        relabeled: ``(label, label logged, seed)`` of skipped cells whose finished run carries
            another row label (the same run config and seed in an earlier sweep of the experiment).
    """

    parent_run_id: str
    experiment_id: str
    cells: list[Cell]
    skipped: list[tuple[str, int]] = field(default_factory=list)
    ran: dict[tuple[str, int], str] = field(default_factory=dict)
    failed: dict[tuple[str, int], str] = field(default_factory=dict)
    summaries: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    dropped: list[dict[str, int]] = field(default_factory=list)
    seconds: dict[tuple[str, int], float] = field(default_factory=dict)
    relabeled: list[tuple[str, str, int]] = field(default_factory=list)


class _SweepProgress:
    """rich progress: cells done / total, running, failed, elapsed and ETA."""

    def __init__(self, enabled: bool, total: int, running_cap: int) -> None:
        self.enabled, self.total, self.cap = enabled, total, max(1, running_cap)
        self.done = self.failed = self.submitted = 0
        self._p = None

    def __enter__(self) -> _SweepProgress:
        if self.enabled and self.total:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._p = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), transient=False)
            self._p.__enter__()
            self._t = self._p.add_task("cells", total=self.total, info="")
            self._refresh()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self._p.__exit__(None, None, None)

    def _refresh(self, last: str = "") -> None:
        if self._p is not None:
            running = min(self.cap, max(self.submitted - self.done - self.failed, 0))
            info = f"running {running}" + (f"  failed {self.failed}" if self.failed else "") + (f"  {last}" if last else "")
            self._p.update(self._t, completed=self.done + self.failed, info=info)

    def submit(self, n: int) -> None:
        self.submitted = n
        self._refresh()

    def finish(self, ok: bool, last: str) -> None:
        if ok:
            self.done += 1
        else:
            self.failed += 1
        self._refresh(last)


def run_sweep(spec: SweepSpec, base_dir: str | Path, cohort_dir: str | Path, *, executor: str | None = None,
              workers: int | None = None, address: str | None = None, rounds: int | None = None,
              seeds: list[int] | None = None, tracking_uri: str | None = None, experiment: str | None = None,
              progress: bool = True) -> SweepOutcome:
    """Run the sweep's missing cells and log each one as a child of the sweep's parent run.

    Args:
        spec: the sweep (:func:`federation.sweep.load_sweep`).
        base_dir: folder for relative ``config:`` paths of the entries.
        cohort_dir: cohort directory (``abps etl`` output); on a Ray cluster every node must read
            it at this path.
        executor: ``local`` (process pool; ``workers == 1`` runs in this process) or ``ray``.
        workers: processes of the local pool, or CPUs of a local Ray instance.
        address: Ray cluster address (``ray start --head`` prints it); None = start a local Ray.
        rounds, seeds: overrides of the file.
        tracking_uri, experiment: MLflow store and experiment (defaults: ``sqlite:///mlflow/mlflow.db``,
            ``spec.experiment`` or ``spec.name``).
        progress: show the rich progress bar.

    Returns:
        :class:`SweepOutcome`. The parent run ends FINISHED when every cell of the sweep has a
        FINISHED run, FAILED otherwise. A cell writes round checkpoints (its config's ``checkpoint``
        cadence) into ``spec.checkpoints`` (default ``runs/<experiment>/checkpoints``); a cell
        stopped inside (a kill, Ctrl-C) goes on from its last one on the rerun, in its interrupted
        MLflow run, with the figures of an uninterrupted computation. A cell's file is removed once
        its run is FINISHED.

    Raises:
        InputError: bad cohort, method, option or executor.
    """
    executor = (executor or spec.executor).lower()
    if executor not in ("local", "ray"):
        raise InputError(f"--executor must be local or ray, got {executor!r}")
    workers = int(workers or spec.workers)
    if workers < 1:
        raise InputError("--workers must be >= 1")
    address = address or spec.address
    if address and executor != "ray":
        raise InputError("--address applies to --executor ray only")
    if executor != "ray" and spec.resources.num_cpus != Resources().num_cpus:
        raise InputError(f"resources.num_cpus {spec.resources.num_cpus:g} applies to --executor ray only (a local "
                         "cell is one process with resources.threads threads); drop it or run with --executor ray")
    if address:
        check_reachable(address)  # before any MLflow run is opened
    cohort_dir = str(Path(cohort_dir).resolve())
    cid = federation_id(cohort_dir)
    metric = load_federation(cohort_dir).metric_name  # a bad cohort fails here, before any MLflow run
    cells = expand_cells(spec, base_dir, cid, rounds, seeds)
    dropped = []
    for m in sorted({c.config.min_train for c in cells}):
        with warnings.catch_warnings():  # the cohort's data warnings were said by the load above
            warnings.filterwarnings("ignore", message="per-center preprocessing")
            d = load_federation(cohort_dir, min_train=m)
        dropped.append({**d.dropped, "kept": d.n_centers})
    s_hash = sweep_hash(cells)
    all_keys = sorted({k for c in cells for k in cell_params(c, cid)})

    exp_name = experiment or spec.experiment or spec.name
    folder = Path(spec.checkpoints or Path("runs") / folder_name(exp_name) / "checkpoints").resolve()
    tracker = Tracker(tracking_uri, exp_name)
    with open_parent(tracker, spec.name, cells, cid, s_hash) as parent:
        tracker.set_tags({EXECUTOR_TAG: f"{executor} x{workers}"})
        out = SweepOutcome(parent, tracker.experiment_id, cells, dropped=dropped)
        done = finished_labels(tracker)
        todo = [c for c in cells if c.key not in done]
        out.skipped = [c.key for c in cells if c.key in done]
        # a finished run of the same config and seed under another row label (an earlier sweep) is
        # not computed again; the reports show it under the label it was logged with
        out.relabeled = [(c.label, sorted(done[c.key])[0], c.seed) for c in cells
                         if c.key in done and c.label not in done[c.key]]
        # two cells with the same resolved config and seed are one computation
        todo = list({c.key: c for c in reversed(todo)}.values())[::-1]
        log = CellLog(tracker, parent, cid, all_keys, s_hash, stale_runs(tracker),
                      cohort_name=Path(cohort_dir).resolve().name, interrupted=interrupted_runs(tracker), metric=metric)
        ck = (str(folder), cid)
        threads = spec.resources.threads
        bar = _SweepProgress(progress, len(todo), workers)
        try:
            with bar:
                events: Iterable[Event]
                if not todo:
                    events = iter(())
                elif executor == "ray":  # longest expected cells first: the workers end together
                    events = run_ray(longest_first(todo), cohort_dir, threads, workers, address,
                                     spec.resources.num_cpus, checkpoints=ck)
                    bar.submit(len(todo))
                elif workers == 1:
                    bar.submit(len(todo))
                    events = run_serial(todo, cohort_dir, threads, log.event, checkpoints=ck)
                else:
                    events = run_pool(longest_first(todo), cohort_dir, threads, workers, bar.submit, checkpoints=ck)
                for kind, cell, payload in events:
                    if kind != "done":
                        log.event(kind, cell, payload)
                        continue
                    res, exc = payload["result"], payload["error"]
                    if exc is not None or res is None:
                        log.fail(cell)
                        out.failed[cell.key] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                        bar.finish(False, f"{cell.run_name} failed")
                        continue
                    out.ran[cell.key] = log.finish(cell, res)
                    checkpoint_file(folder, cell).unlink(missing_ok=True)  # the cell is complete
                    out.summaries[cell.key] = res["summary"]
                    out.seconds[cell.key] = float(res.get("seconds", 0.0))
                    bar.finish(True, f"{cell.run_name} AUROC {res['summary']['final_auroc_mean']:.3f}")
        finally:
            log.abort()  # cells still open (an interrupted driver) end FAILED
        tracker.log_json({"cells": [{"label": c.label, "method": c.method, "seed": c.seed,
                                     "config_hash": c.config_hash} for c in cells],
                          "cohort_id": cid, "dropped_centers": dropped}, "sweep.json")
        tracker.finish_as("FAILED" if out.failed else "FINISHED")
    return out


"""Executors: where the cells run (this process, a local process pool, or Ray).

Each executor is a generator of events ``(kind, cell, payload)`` for the driver:
``("start", cell, {"ms"})`` and ``("round", cell, {"step", "metrics", "ms"})`` while a cell runs
(live progress, sent back from the workers through a queue), then ``("done", cell, {"result",
"error"})`` once. Every worker sets the sweep's torch thread count, so the same cell gives the
same numbers on every executor and any number of workers.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import queue as queue_mod
import signal
import socket
import sys
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

import torch

import federation.sweep.cells as cells_mod
from etl.errors import InputError
from federation.sweep.cells import Cell

__all__ = ["Event", "run_serial", "run_pool", "run_ray", "check_reachable"]

Event = tuple[str, Cell, dict[str, Any]]
_POLL_S = 0.2


def _done(cell: Cell, result: dict[str, Any] | None, error: BaseException | None) -> Event:
    return ("done", cell, {"result": result, "error": error})


def _checkpoint_args(cell: Cell, checkpoints: tuple[str, str] | None) -> dict[str, Any]:
    """:func:`run_cell`'s checkpoint arguments for ``cell`` (``checkpoints``: (folder, cohort id))."""
    if checkpoints is None:
        return {}
    return {"checkpoint_path": str(cells_mod.checkpoint_file(checkpoints[0], cell)), "cohort_id": checkpoints[1]}


def run_serial(cells: list[Cell], cohort: str, threads: int,
               emit: Callable[[str, Cell, dict[str, Any]], None],
               checkpoints: tuple[str, str] | None = None) -> Iterator[Event]:
    """Run the cells one after another in this process; live events go straight to ``emit``.
    ``checkpoints``: (folder, cohort id) of the cells' round checkpoints (None: none)."""
    before = torch.get_num_threads()
    try:
        for c in cells:
            cells_mod.set_round_hook(lambda kind, payload, c=c: emit(kind, c, payload))
            try:
                result = cells_mod.run_cell(c.config.model_dump(mode="json"), cohort, c.seed, threads,
                                            **_checkpoint_args(c, checkpoints))
            except Exception as exc:  # noqa: BLE001 - reported per cell
                yield _done(c, None, exc)
            else:
                yield _done(c, result, None)
            finally:
                cells_mod.set_round_hook(None)
    finally:
        torch.set_num_threads(before)


_QUEUE: Any = None


def _worker_init(q: Any) -> None:
    """Pool worker start-up: keep the driver's event queue, and die with the driver (Linux
    ``PR_SET_PDEATHSIG``), so a ``kill -9`` of ``abps sweep`` leaves no orphaned workers."""
    global _QUEUE
    _QUEUE = q
    # the driver has said what the cohort's data warn of (it loads the cohort first); a warning of
    # the worker's own is one line, as the command line prints them
    warnings.filterwarnings("ignore", message="per-center preprocessing")
    warnings.formatwarning = lambda message, *a, **k: f"warning: {str(message).splitlines()[0]}\n"
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        except OSError:
            pass


def _queued_cell(index: int, config: dict[str, Any], cohort: str, seed: int, threads: int, q: Any = None,
                 **checkpoint: Any) -> dict:
    """:func:`run_cell` in a worker, its live events put on the driver's queue as ``(index, kind, payload)``."""
    q = q if q is not None else _QUEUE
    cells_mod.set_round_hook(lambda kind, payload: q.put((index, kind, payload)))
    try:
        return cells_mod.run_cell(config, cohort, seed, threads, **checkpoint)
    finally:
        cells_mod.set_round_hook(None)


def _drain(q: Any, by_index: dict[int, Cell], empty: type[BaseException]) -> Iterator[Event]:
    while True:
        try:
            index, kind, payload = q.get_nowait()
        except empty:
            return
        yield (kind, by_index[index], payload)


def run_pool(cells: list[Cell], cohort: str, threads: int, workers: int,
             on_submit: Callable[[int], None], checkpoints: tuple[str, str] | None = None) -> Iterator[Event]:
    """Run the cells on a spawn-context process pool of ``workers`` processes (``checkpoints`` as
    :func:`run_serial`)."""
    ctx = mp.get_context("spawn")
    # a plain queue, handed to the workers as they start: a Manager's server process would outlive
    # a `kill -9` of the driver (it does not die with its parent, as the workers do)
    q = ctx.Queue()
    by_index = {c.index: c for c in cells}
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init, initargs=(q,))
    clean = False
    try:
        futs = {pool.submit(_queued_cell, c.index, c.config.model_dump(mode="json"), cohort, c.seed, threads,
                            **_checkpoint_args(c, checkpoints)): c
                for c in cells}
        on_submit(len(futs))
        pending = set(futs)
        while pending:
            done, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_COMPLETED)
            yield from _drain(q, by_index, queue_mod.Empty)  # a cell's rounds come before its end
            for f in sorted(done, key=lambda f: futs[f].index):
                exc = f.exception()
                yield _done(futs[f], None if exc else f.result(), exc)
        clean = True
    finally:
        if not clean:
            # interrupted (Ctrl-C, SIGTERM, an error while logging): drop the queued cells and stop the
            # workers' running cells (Python 3.11 has no public terminate; 3.14 adds terminate_workers)
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        pool.shutdown(wait=clean, cancel_futures=not clean)
        q.close()


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast (InputError) when a ``host:port`` / ``ray://host:port`` Ray address does not
    accept a TCP connection, or accepts one but does not answer as a gRPC server (Ray's GCS and
    its client server both speak gRPC): ``ray.init`` itself retries an unreachable address forever
    and hangs or ends in a traceback on a port that serves something else."""
    import grpc

    target = address.split("://", 1)[-1]
    if target == "auto" or ":" not in target:
        return
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError):
        raise InputError(f"--address {address}: cannot reach a Ray cluster there "
                         f"(no answer within {timeout_s:g} s)") from None
    channel = grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
    except grpc.FutureTimeoutError:
        raise InputError(f"--address {address}: the port answers but is not a Ray cluster "
                         f"(no gRPC handshake within {timeout_s:g} s)") from None
    finally:
        channel.close()


#: Ray's words for a local start that ran out of its fixed waits (the raylet registering, the GCS
#: server writing its port file)
RAY_STARTUP_TIMEOUTS = ("timed out during startup", "Timed out waiting for file")


def start_local_ray(ray: Any, workers: int, attempts: int = 3) -> None:
    """``ray.init`` of a local Ray with ``workers`` CPUs, started again (after ``ray.shutdown``) when
    its start times out (:data:`RAY_STARTUP_TIMEOUTS`): Ray waits fixed times for the raylet and the
    GCS server, which a machine whose cores are busy can miss. Any other error, or the last
    attempt's, is raised."""
    for attempt in range(1, attempts + 1):
        try:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
            return
        except Exception as exc:
            if attempt == attempts or not any(w in str(exc) for w in RAY_STARTUP_TIMEOUTS):
                raise
            ray.shutdown()


def run_ray(cells: list[Cell], cohort: str, threads: int, workers: int, address: str | None,
            num_cpus: float, checkpoints: tuple[str, str] | None = None) -> Iterator[Event]:
    """Run the cells as Ray tasks (a local Ray with ``workers`` CPUs, or the cluster at ``address``;
    ``checkpoints`` as :func:`run_serial`, a folder every node reads and writes)."""
    try:
        import ray
        from ray.util.queue import Empty, Queue
    except ModuleNotFoundError:
        raise InputError("--executor ray needs the `ray` package (pip install 'ray>=2.9')") from None
    started = False
    if not ray.is_initialized():
        if address:
            check_reachable(address)
            try:
                ray.init(address=address, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:  # a gRPC server that is not Ray's
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise InputError(f"--address {address}: ray.init could not join a cluster there ({first})") from None
        else:
            start_local_ray(ray, workers)
        started = True
    try:
        q = Queue()
        by_index = {c.index: c for c in cells}
        remote = ray.remote(num_cpus=num_cpus, max_retries=0)(_queued_cell)
        refs = {remote.remote(c.index, c.config.model_dump(mode="json"), cohort, c.seed, threads, q,
                              **_checkpoint_args(c, checkpoints)): c
                for c in cells}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=_POLL_S)
            yield from _drain(q, by_index, Empty)
            for ref in done:
                try:
                    yield _done(refs[ref], ray.get(ref), None)
                except Exception as exc:  # noqa: BLE001 - a failed task is reported per cell
                    cause = getattr(exc, "cause", None)
                    yield _done(refs[ref], None, cause if isinstance(cause, BaseException) else exc)
    finally:
        if started:
            ray.shutdown()

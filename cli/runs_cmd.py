"""``abps ui`` (the MLflow UI on the project's store) and ``abps runs`` (a terminal table of finished runs).

Both read the project's MLflow store (``sqlite:///mlflow/mlflow.db`` in the folder ``abps`` runs in),
unless ``MLFLOW_TRACKING_URI`` or ``--tracking-uri`` names another (an MLflow server included).
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING

import typer

from cli import project
from cli.app import app
from etl.errors import InputError

if TYPE_CHECKING:
    from federation.report.collect import Collected
    from federation.run.store_read import RunStore


@app.command("ui")
def ui(
    port: int = typer.Option(5000, "--port", min=1, max=65535, help="port of the UI (http://127.0.0.1:PORT)"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (127.0.0.1: this machine only)"),
    tracking_uri: str | None = project.tracking_uri_option(),
    experiment: str | None = typer.Option(None, "--experiment", help="experiment whose runs the printed URL "
                                             "compares (default as abps runs)"),
) -> int:
    """Start the MLflow UI on the project's store; once it answers, print the URL of the comparison
    of the experiment's latest runs (AUROC, Bandwidth, Isolation first). Ctrl-C stops it. With an
    http(s) tracking URI (an MLflow server) only the URL on that server is printed."""
    from federation.run.tracking import default_tracking_uri, experiment_name

    experiment_name(experiment, "")  # an empty --experiment is refused before a server starts
    uri = tracking_uri or default_tracking_uri()
    served = uri.startswith(("http://", "https://"))
    if served:  # the server's own UI: nothing starts here, so the options of a local one do nothing
        for opt, given, default in (("--port", port, 5000), ("--host", host, "127.0.0.1")):
            if given != default:
                raise InputError(f"{opt} applies to a UI started here; the tracking URI {uri} is an MLflow "
                                 "server, whose UI is already served: drop it")
    named = experiment_source(experiment)
    if named is not None or served:  # a named experiment that the store lacks is refused, as abps runs does
        from federation.run.store_read import experiment_or_error, open_store

        with open_store(uri) as store:  # a server that does not answer is named here
            if named is not None:
                experiment_or_error(store, default_experiment(experiment, uri, store), named)
    if served:
        typer.echo(f"MLflow UI: {compare_url(uri.rstrip('/'), uri, experiment)}")
        return 0
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    _check_port_free(host, port)
    base = f"http://{shown}:{port}"
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port),
           "--workers", "1"]
    # MLflow's job runner (huey consumers, one process per job kind, ~2.5 GB together) serves its
    # GenAI features, not the runs pages; it stays off unless the environment asks for it
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ,
           "PYTHONWARNINGS": "ignore"}  # the server's library deprecation warnings
    log = tempfile.TemporaryFile()
    # its own process group (the server and its workers), stopped as one when we stop; its log
    # lines stay off the console (shown when it fails to start)
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        typer.echo(f"starting the MLflow UI on {base} (store {uri}) ...", err=True)
        if not _wait_healthy(base, proc, timeout_s=300.0):
            log.seek(0)
            tail = [ln for ln in log.read().decode(errors="replace").splitlines() if ln.strip()]
            raise InputError(f"the MLflow UI did not start on port {port}: " + (tail[-1] if tail else "no output"))
        typer.echo(f"MLflow UI: {compare_url(base, uri, experiment)}  (store {uri}; Ctrl-C stops it)")
        try:
            return proc.wait()
        except KeyboardInterrupt:  # Ctrl-C is how the UI is meant to stop: no error
            from cli.app import interrupt_handled

            interrupt_handled()
            typer.echo("MLflow UI stopped", err=True)
            return 0
    finally:  # normal exit, Ctrl-C or SIGTERM (cli.app turns it into SystemExit)
        stop_process_tree(proc.pid)
        log.close()


def stop_process_tree(pid: int, timeout_s: float = 10.0) -> None:
    """Stop process ``pid`` and every process below it, also those that left its session (the
    MLflow server's uvicorn and job workers do): SIGTERM to all, then SIGKILL to those still alive
    after ``timeout_s`` seconds. A process already gone is no error."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


def _check_port_free(host: str, port: int) -> None:
    """Raise InputError when ``host:port`` cannot be bound (another server holds it)."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        try:
            s.bind((host, port))
        except socket.gaierror as exc:  # not an address nor a name this machine resolves
            raise InputError(f"--host {host}: not an address of this machine ({exc.strerror or exc})") from None
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise InputError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
            raise InputError(f"--port {port}: {host}:{port} is taken ({exc.strerror or exc}); "
                             "give another --port") from None


def _wait_healthy(base: str, proc: subprocess.Popen, timeout_s: float) -> bool:
    """Poll ``base/health`` until it answers 200 (True), the server exits or ``timeout_s`` passes (False)."""
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.25)
    return False


def compare_url(base: str, uri: str, experiment: str | None) -> str:
    """The MLflow UI URL (at ``base``) of the comparison of the experiment's latest runs (one per
    row label and seed, as ``abps runs`` shows them), opened as model training, not GenAI; the
    experiment's runs page when it has no finished clinical run; the home page without an experiment."""
    import json
    import urllib.parse

    from federation.report import collect_runs
    from federation.run.store_read import open_store

    ml = "workflowType=machine_learning"
    try:
        with open_store(uri) as store:
            exp = store.experiment_id(default_experiment(experiment, uri, store))
            cells = [] if exp is None else collect_runs(store.finished_runs(exp)).cells
    except InputError:  # a store the UI shows but this process cannot read: the home page
        exp = None
    if exp is None:
        return f"{base}/#/experiments?{ml}"
    if not cells:
        return f"{base}/#/experiments/{exp}/runs?{ml}"
    runs = json.dumps([c.run_id for c in sorted(cells, key=lambda c: (c.label, c.seed))], separators=(",", ":"))
    q = f"runs={urllib.parse.quote(runs)}&experiments={urllib.parse.quote(json.dumps([exp]))}&{ml}"
    return f"{base}/#/compare-runs?{q}"


def _fmt(x: float, spec: str) -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


@app.command("runs")
def runs(
    experiment: str | None = typer.Option(
        None, "--experiment", help="MLflow experiment (default: MLFLOW_EXPERIMENT_NAME, else the experiment of this "
        "project's cohort, its folder name as abps train uses, else the most recently used experiment)"),
    tracking_uri: str | None = project.tracking_uri_option(),
) -> None:
    """Print the experiment's finished runs: one row per method (and goal) with its seeds, rounds run
    (mean over seeds; fewer than asked where early stopping ended a run), AUROC
    mean +- std across seeds, bandwidth (x FedAvg's reference traffic) and isolation (share of
    centers that rest, with no partner, mean over rounds)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from federation.report import collect_runs, table1
    from federation.report.abps_table1 import BANDWIDTH_NOTE, ISOLATION_NOTE, auroc_cell, isolation_cell, rounds_cell
    from federation.run.store_read import experiment_or_error, open_store

    with open_store(tracking_uri) as store:
        named = experiment_source(experiment)
        experiment = default_experiment(experiment, tracking_uri, store)
        if named is None and store.experiment_id(experiment) is None:  # nothing trained into this store yet
            typer.echo(f"no training runs yet in {store.uri} (abps train --goal diversity)")
            return
        col = collect_runs(store.finished_runs(experiment_or_error(store, experiment, named or "--experiment")))
    images = _image_runs_note(experiment, col)
    if not col.cells:
        typer.echo(f"experiment {experiment}: " + (images or "no finished training runs yet (abps train --goal diversity)"))
        return
    rows = table1(col.cells)
    table = Table(title=f"experiment {experiment}: finished runs ({len(col.cells)})")
    metrics = sorted({c.metric for c in col.cells})
    score = "AUROC" if metrics == ["auroc"] else "/".join(metrics)  # one cohort, so one metric
    for head in ("method", "seed ids", "rounds", f"{score} mean +- std", "bandwidth (x FedAvg)", "isolation"):
        table.add_column(head, justify="left" if head in ("method", "seed ids") else "right")
    for r in rows:
        auroc = auroc_cell(r).replace("±", "+-")
        table.add_row(escape(r.label), r.seeds, rounds_cell(r.rounds_mean), auroc, f"{_fmt(r.bandwidth, '.2f')}x", isolation_cell(r.rest_share).replace("–", "-"))
    Console(width=max(100, Console().width)).print(table)
    typer.echo(BANDWIDTH_NOTE.replace("×", "x") + " " + ISOLATION_NOTE)
    for note in col.notes + ([images] if images else []):
        typer.echo(f"note: {note}")


def _image_runs_note(experiment: str, col: Collected) -> str | None:
    """What ``abps runs`` says of an experiment's image-benchmark runs (it tables clinical runs):
    how many and the report that tables them; None without any."""
    counts = [f"{n} {kind}" for n, kind in ((len(col.sage), "SAGE"), (len(col.vv), "gossip")) if n]
    if not counts:
        return None
    return (f"{' and '.join(counts)} image-benchmark run(s), which abps runs does not table; "
            f"abps report --experiment {experiment} --out report/{experiment}/ tables them")


def experiment_source(given: str | None) -> str | None:
    """What named the experiment a reading command shows: ``--experiment``, the
    ``MLFLOW_EXPERIMENT_NAME`` variable, or None (the command falls back on a default)."""
    from federation.run.tracking import EXPERIMENT_ENV

    if given:
        return "--experiment"
    return EXPERIMENT_ENV if os.environ.get(EXPERIMENT_ENV, "").strip() else None


def default_experiment(given: str | None, tracking_uri: str | None, store: RunStore | None = None) -> str:
    """The experiment ``abps runs`` / ``abps report`` / ``abps ui`` show: ``given``, else
    ``MLFLOW_EXPERIMENT_NAME``, else the folder name of this project's cohort (``abps train``'s
    default experiment) when the store has it, else the store's most recently used
    experiment (the one whose latest run started last), else ``abps``. ``store``: the store already open on
    ``tracking_uri`` (opened here, read-only, when None)."""
    from federation.run.store_read import open_store
    from federation.run.tracking import EXPERIMENT_ENV, experiment_name

    experiment_name(given, "")  # an empty --experiment is refused, not read as the default
    if given or os.environ.get(EXPERIMENT_ENV, "").strip():
        return given or os.environ[EXPERIMENT_ENV].strip()
    if store is None:
        with open_store(tracking_uri) as opened:
            return default_experiment(None, tracking_uri, opened)
    cohort = project.recorded_cohort()
    if cohort is not None and store.experiment_id(cohort.name) is not None:
        return cohort.name
    return store.latest_experiment_with_runs() or "abps"

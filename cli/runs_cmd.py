"""``abps ui`` (the MLflow UI on the project's store) and ``abps runs`` (a terminal table of finished runs).

Both read the project's MLflow store (``sqlite:///mlflow/mlflow.db`` in the folder ``abps`` runs in,
unless ``--tracking-uri`` names another).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys

import typer

from cli.app import app


@app.command("ui")
def ui(
    port: int = typer.Option(5000, "--port", min=1, max=65535, help="port of the UI (http://127.0.0.1:PORT)"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (127.0.0.1: this machine only)"),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow store (default sqlite:///mlflow/mlflow.db)"),
) -> int:
    """Start the MLflow UI on the project's store and print its URL; Ctrl-C stops it."""
    from federation.run.tracking import default_tracking_uri

    uri = tracking_uri or default_tracking_uri()
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    typer.echo(f"MLflow UI: http://{shown}:{port}  (store {uri}; Ctrl-C stops it)")
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port),
           "--workers", "1"]
    # its own process group (the server and its workers), stopped as one when we stop
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        return proc.wait()
    finally:  # normal exit, Ctrl-C or SIGTERM (cli.app turns it into SystemExit)
        with contextlib.suppress(ProcessLookupError):  # workers may outlive the server's own exit
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def _fmt(x: float, spec: str) -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


@app.command("runs")
def runs(
    experiment: str = typer.Option("abps", "--experiment", help="MLflow experiment (default abps, as abps train)"),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow store (default sqlite:///mlflow/mlflow.db)"),
) -> None:
    """Print the experiment's finished runs: one row per method (and goal) with its seeds, AUROC
    mean +- std across seeds, bandwidth relative to FedAvg and the last round's isolation rate."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from federation.report import collect_runs, mean_std, table1
    from federation.report.abps_table1 import auroc_cell
    from federation.run.tracking import Tracker

    tracker = Tracker(tracking_uri, experiment, create=False)  # InputError naming a missing experiment
    col = collect_runs(tracker)
    if not col.cells:
        typer.echo(f"experiment {experiment}: no finished training runs yet (abps train --goal diversity)")
        return
    rows, basis = table1(col.cells)
    last_isolation = {r.info.run_id: r.data.metrics.get("isolation_rate", math.nan)  # last round's, ABPS only
                      for r in tracker.search("attributes.status = 'FINISHED'")}
    isolation: dict[str, list[float]] = {}
    for c in col.cells:
        isolation.setdefault(c.label, []).append(last_isolation.get(c.run_id, math.nan))
    table = Table(title=f"experiment {experiment}: finished runs ({len(col.cells)})")
    for head in ("method", "seeds", "AUROC mean +- std", "bandwidth (x FedAvg)", "isolation"):
        table.add_column(head, justify="left" if head in ("method", "seeds") else "right")
    for r in rows:
        iso = mean_std(isolation.get(r.label, []))[0]
        auroc = (auroc_cell(r) if r.n_undefined else f"{_fmt(r.auroc_mean, '.3f')} +- {_fmt(r.auroc_std, '.3f')}")
        table.add_row(escape(r.label), r.seeds, auroc,  # a label such as "abps [kappa=1]" is no rich markup
                      f"{_fmt(r.bandwidth, '.2f')}x", _fmt(iso, '.2f'))
    Console(width=max(100, Console().width)).print(table)
    if basis != "fedavg":
        col.notes.append("no FedAvg run in this experiment: bandwidth is relative to FedAvg's reference traffic "
                         "(every center sends the full fp32 model each of reference_rounds rounds)")
    for note in col.notes:
        typer.echo(f"note: {note}")

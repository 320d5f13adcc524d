"""``abps report``: the papers' tables and figures from the runs of an MLflow experiment.

See :mod:`federation.report` for the sections (ABPS Table 1 and Figure 3, SAGE Tables I-III and
Fig. 3, variance-correction Table I) and docs/sweeps.md.
"""

from __future__ import annotations

from pathlib import Path

import typer

from cli import project
from cli.app import app


@app.command("report")
def report(
    out: Path = typer.Option(..., "--out", parser=project.folder_path, metavar="DIR", help="output folder (Markdown, CSV, PNG; written atomically)"),
    experiment: str | None = typer.Option(
        None, "--experiment", help="MLflow experiment, e.g. the sweep's (default: MLFLOW_EXPERIMENT_NAME, else as "
        "abps runs)"),
    tracking_uri: str | None = project.tracking_uri_option(),
    no_log: bool = typer.Option(False, "--no-log", help="do not log the report as a `report` run in MLflow"),
    force: bool = typer.Option(False, "--force", help="replace a report of another experiment in --out (an "
                               "earlier report of the same experiment is always brought up to date)"),
) -> None:
    """Rebuild Table 1, Figure 3 and the bytes-to-target table (and the SAGE / variance-correction tables when such runs exist)."""
    from cli.runs_cmd import default_experiment, experiment_source
    from etl.errors import InputError
    from federation.report import write_report
    from federation.run.store_read import experiment_or_error, open_store

    with open_store(tracking_uri) as store:  # read-only: a missing experiment is refused before any write
        named = experiment_source(experiment)
        chosen = default_experiment(experiment, tracking_uri, store)
        if named is None and store.experiment_id(chosen) is None:  # none named and none to fall back on
            raise InputError(f"no experiment to report: {store.uri} holds no runs "
                             "(run abps train or abps sweep first, or pass --experiment NAME)")
        experiment_or_error(store, chosen, named or "--experiment")
    experiment = chosen
    doc = write_report(experiment, out, tracking_uri, log_to_mlflow=not no_log, force=force)
    done = ", ".join(doc["sections"]) or "no section (no FINISHED run with a defined final AUROC: check that the runs finished and that some centers' test splits hold both classes)"
    typer.echo(f"report of {experiment}: {done} -> {out / 'report.md'}")
    for note in doc["notes"]:
        typer.echo(f"note: {note}")

"""``abps sweep``: run a sweep file's (method x options x seed) cells on a process pool or on Ray.

Cells that already have a FINISHED run in the experiment are skipped (resume); see
:mod:`federation.sweep` and docs/sweeps.md.
"""

from __future__ import annotations

from pathlib import Path

import typer

from cli import project
from cli.app import app
from etl.errors import InputError
from federation.core.limits import MAX_THREADS


@app.command("sweep", context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def sweep(
    ctx: typer.Context,
    config: Path = typer.Option(..., "--config", help="sweep YAML (e.g. configs/table1.yaml)"),
    executor: str | None = typer.Option(None, "--executor", help="local (process pool) or ray; default from the file"),
    engine: str | None = typer.Option(None, "--engine", hidden=True, help="renamed --executor"),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address (default: start a local Ray)"),
    workers: int | None = typer.Option(None, "--workers", min=1, help="pool processes / local Ray CPUs"),
    cohort: Path | None = typer.Option(None, "--cohort", help="cohort directory (default: the file's `cohort:`, else this project's cohort, as abps train)"),
    rounds: int | None = typer.Option(None, "--rounds", min=1, help="override every cell's rounds"),
    seeds: list[int] | None = typer.Option(None, "--seeds", help="override the file's seeds, e.g. --seeds 11 22 33"),
    tracking_uri: str | None = project.tracking_uri_option(),
    experiment: str | None = typer.Option(
        None, "--experiment", help="MLflow experiment (default: MLFLOW_EXPERIMENT_NAME, else the file's)"),
    no_progress: bool = typer.Option(False, "--no-progress", help="hide the progress bar"),
) -> None:
    """Run the missing cells of a sweep; each cell is one MLflow run under the sweep's parent run."""
    # `kill PID` unwinds like Ctrl-C (cli.app's handler): the run being logged ends FAILED, workers
    # stop, Ray shuts down, and the command says it was interrupted
    from federation.sweep import load_sweep, run_sweep

    if engine is not None:
        raise InputError("--engine is now called --executor (local or ray)")
    if workers is not None and workers > MAX_THREADS:  # each one a process of this machine
        raise InputError(f"--workers {workers}: at most {MAX_THREADS}")

    seeds = project.parse_seeds(seeds, list(ctx.args)) or None
    from federation.run.tracking import experiment_name

    experiment = experiment_name(experiment, "") or None  # None: the file's experiment
    from federation.sweep.cross import cross_summary_line, is_cross_sweep, run_cross_sweep

    if is_cross_sweep(config):  # `datasets:` (configs/cross.yaml): one sweep per data set, one experiment
        if cohort is not None:
            raise InputError(f"{config}: a cross sweep names its cohorts under `datasets:`; drop --cohort")
        outs = run_cross_sweep(config, executor=executor, workers=workers, address=address, rounds=rounds,
                               seeds=list(seeds) if seeds else None, tracking_uri=tracking_uri,
                               experiment=experiment, progress=not no_progress)
        typer.echo(f"cross sweep {config}: {len(outs)} data sets")
        for label, res in outs.items():
            typer.echo(cross_summary_line(label, res))
        if any(res.failed for res in outs.values()):
            raise typer.Exit(1)
        return
    spec, base = load_sweep(config)
    cohort_dir = cohort or (Path(spec.cohort) if spec.cohort else None)
    if cohort_dir is None:  # as abps train: this project's cohort
        try:
            cohort_dir = project.default_cohort()
        except InputError as exc:
            raise InputError(f"{config}: {exc} (or `cohort:` in the file)") from None
        typer.echo(f"cohort: {project.shown_path(cohort_dir)} (this project's default; --cohort DIR for another)",
                   err=True)
    out = run_sweep(spec, base, cohort_dir, executor=executor, workers=workers, address=address, rounds=rounds,
                    seeds=list(seeds) if seeds else None, tracking_uri=tracking_uri, experiment=experiment,
                    progress=not no_progress)
    from federation.run.runner import dropped_message

    for d in out.dropped:
        note = dropped_message(d, d["kept"])
        if note:
            typer.echo(note, err=True)
    for label, logged, seed in out.relabeled:
        typer.echo(f"note: row {label!r} seed {seed} is the finished run {logged!r} of this experiment (the same run "
                   f"config); it is not run again, and reports show it as {logged!r}", err=True)
    typer.echo(f"sweep {spec.name}: {len(out.cells)} cells, {len(out.skipped)} already finished, "
               f"{len(out.ran)} run now, {len(out.failed)} failed (parent run {out.parent_run_id})")
    for (h, seed), msg in sorted(out.failed.items()):
        label = next(c.label for c in out.cells if c.key == (h, seed))
        typer.echo(f"  failed: {label} seed {seed}: {msg}", err=True)
    if out.failed:
        raise typer.Exit(1)

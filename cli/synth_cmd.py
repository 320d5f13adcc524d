"""`abps synth mimic`: a synthetic MIMIC-IV v3.1-format folder with its ground truth (etl.synth)."""

from __future__ import annotations

from pathlib import Path

import typer

from cli import project
from cli.app import synth_app
from etl.synth_spec import DEFAULT_STAYS


@synth_app.command("mimic")
def synth_mimic_command(
    out: Path = typer.Option(..., "--out", parser=project.folder_path, metavar="DIR", help="Output folder (hosp/, icu/, ground_truth.parquet); new, empty or a previous synth output."),
    stays: int = typer.Option(DEFAULT_STAYS, "--stays", help="Number of ICU stays (default: MIMIC-IV v3.1's 94,458)."),
    seed: int = typer.Option(0, "--seed", callback=project.seed_value,
                             help="Seed; the same seed and options give byte-identical files."),
    chart_hours_step: float = typer.Option(1.0, "--chart-hours-step", help="Hours between charting rounds (0.5 doubles chartevents)."),
    chartevents: bool = typer.Option(True, "--chartevents/--no-chartevents", help="Write icu/chartevents.csv.gz (the slow part)."),
    compress_level: int = typer.Option(1, "--compress-level", help="gzip level 1..9."),
    heterogeneity: float = typer.Option(1.0, "--heterogeneity", help="How far the care units' risk models and base rates differ: 0 = one shared model and base rate, 1 = the built-in units, 2 = twice as far apart (at most 10)."),
) -> None:
    """Write synthetic MIMIC-IV tables (patients, admissions, diagnoses_icd, icustays, chartevents, d_items)."""
    from etl import progress
    from etl.synth import SynthConfig, synth_mimic

    with progress.bar("synth mimic", total=1):
        summary = synth_mimic(out, SynthConfig(stays=stays, seed=seed, chart_hours_step=chart_hours_step,
                                               chartevents=chartevents, compresslevel=compress_level,
                                               heterogeneity=heterogeneity))
    typer.echo(summary.line())

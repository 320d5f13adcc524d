"""``abps synth fedprox``: write a FedProx-Synthetic(alpha, beta) cohort directory."""

from __future__ import annotations

from pathlib import Path

import typer

from cli import project
from cli.app import synth_app


@synth_app.command("fedprox")
def synth_fedprox(
    out: Path = typer.Option(..., "--out", parser=project.folder_path, metavar="DIR", help="output directory (cohort.parquet + centers.parquet)"),
    centers: int = typer.Option(230, "--centers", min=1, help="number of centers n"),
    alpha: float = typer.Option(1.0, "--alpha", min=0.0, help="model heterogeneity (variance of u_k)"),
    beta: float = typer.Option(1.0, "--beta", min=0.0, help="feature heterogeneity (variance of B_k)"),
    seed: int = typer.Option(0, "--seed", callback=project.seed_value, help="generator seed"),
    mean_size: float = typer.Option(300.0, "--mean-size", help="mean stays per center (lognormal sizes)"),
    shared: float = typer.Option(0.0, "--shared", help="weight of a model component common to all centers"),
) -> None:
    """FedProx-Synthetic (Li et al. 2020, Sec. 5.1) in the cohort contract (binary logistic labels)."""
    from federation.data.synthetic import write_fedprox_cohort

    write_fedprox_cohort(out, n_centers=centers, alpha=alpha, beta=beta, seed=seed, mean_size=mean_size,
                         shared=shared)
    typer.echo(f"wrote {out}/cohort.parquet and centers.parquet ({centers} centers)")

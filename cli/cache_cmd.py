"""``abps cache clear``: remove the per-user caches (``make clean`` runs it)."""

from __future__ import annotations

import shutil

import typer

from cli.app import cache_app

#: the kinds of cached artefacts (etl.io.user_cache_dir): the ETL's chartevents Parquet cache and
#: the engine's compiled kernels
KINDS = ("chartevents", "kernels")


@cache_app.command("clear")
def cache_clear() -> None:
    """Remove the ETL's chartevents cache and the compiled kernels under $ABPS_CACHE_DIR (else
    $XDG_CACHE_HOME/abps, else ~/.cache/abps); they are rebuilt when next needed."""
    from etl.io import user_cache_dir

    freed = 0
    for kind in KINDS:
        d = user_cache_dir(kind)
        if not d.exists():
            continue
        freed += sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(d)
        typer.echo(f"removed {d}")
    root = user_cache_dir(KINDS[0]).parent
    if root.is_dir() and not any(root.iterdir()):
        root.rmdir()
    typer.echo(f"cache clear: {freed / 2**20:.1f} MiB freed")

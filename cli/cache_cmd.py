"""``abps cache list`` and ``abps cache clear``: show or remove the per-user caches, which every
clone of the project on the machine shares (``make clean`` leaves them)."""

from __future__ import annotations

import json
import os

import typer

from cli.app import cache_app
from etl.errors import InputError

#: the kinds of cached artefacts (etl.io.user_cache_dir): the ETL's chartevents Parquet cache and
#: the engine's compiled kernels
KINDS = ("chartevents", "kernels")


def _files(folder) -> list:
    """The plain files under ``folder`` (none when it does not exist)."""
    return [f for f in folder.rglob("*") if f.is_file() and not f.is_symlink()] if folder.is_dir() else []


def _cache_folder(kind: str):
    """``etl.io.user_cache_dir(kind)``, refused when it or a folder above it is a file (for
    instance ``ABPS_CACHE_DIR`` naming a file), which would otherwise list as empty.

    Raises:
        InputError: naming the path and the variable that set it.
    """
    from etl.io import user_cache_dir

    d = user_cache_dir(kind)
    for p in (d, *d.parents):
        if p.exists() or p.is_symlink():
            if p.is_dir():
                return d
            var = next((v for v in ("ABPS_CACHE_DIR", "XDG_CACHE_HOME") if os.environ.get(v)), "HOME")
            raise InputError(f"{p}: a file, not a folder; the cache folder {d} ({var}) cannot be there")
    return d


@cache_app.command("clear")
def cache_clear() -> None:
    """Remove the ETL's chartevents cache and the compiled kernels under $ABPS_CACHE_DIR (else
    $XDG_CACHE_HOME/abps, else ~/.cache/abps); they are rebuilt when next needed."""
    from etl.io import rmtree_calling

    freed = 0
    for kind in KINDS:
        d = _cache_folder(kind)
        if not d.exists():
            continue
        if d.is_symlink() or not d.is_dir():
            raise InputError(f"{d}: not a folder of the cache (a link or a file); remove it yourself if it should go")
        size = sum(f.stat().st_size for f in _files(d))

        def refused(_func, path, exc, freed=freed):  # a file or folder this user cannot remove
            raise InputError(f"{path}: cannot remove it ({getattr(exc, 'strerror', None) or exc}); "
                             f"{freed / 2**20:.1f} MiB freed before it")

        rmtree_calling(d, refused)
        freed += size
        typer.echo(f"removed {d}")
    root = _cache_folder(KINDS[0]).parent
    # the program's own folder (.../abps) goes when empty; a folder the user named in ABPS_CACHE_DIR stays
    if not os.environ.get("ABPS_CACHE_DIR") and root.is_dir() and not any(root.iterdir()):
        root.rmdir()
    typer.echo(f"cache clear: {freed / 2**20:.1f} MiB freed")


@cache_app.command("list")
def cache_list() -> None:
    """Show the ETL's chartevents cache and the compiled kernels under $ABPS_CACHE_DIR (else
    $XDG_CACHE_HOME/abps, else ~/.cache/abps): each folder with its files and size, and each
    chartevents entry with the source file it caches (its path; marked when it no longer exists),
    its rows and size (no row content)."""
    total = 0
    for kind in KINDS:
        d = _cache_folder(kind)
        files = _files(d)
        size = sum(f.stat().st_size for f in files)
        total += size
        n = len(files)
        typer.echo(f"{kind}: {d} ({n} file{'' if n == 1 else 's'}, {size / 2**20:.1f} MiB)" if n else f"{kind}: {d} (empty)")
        if kind != "chartevents":
            continue
        for manifest in sorted(d.glob("*.json")):
            try:
                m = json.loads(manifest.read_text())
                entry = manifest.with_suffix(".parquet")
                mib = entry.stat().st_size / 2**20 if entry.is_file() else 0.0
                source = m.get("source_path") or m.get("source_name", "?")
                gone = " (source gone: `abps cache clear` frees it)" if m.get("source_path") and \
                    not os.path.exists(m["source_path"]) else ""
                typer.echo(f"  {entry.name}: {source}, {int(m['rows']):,} rows, {mib:.1f} MiB{gone}")
            except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError):
                typer.echo(f"  {manifest.name}: unreadable manifest (the entry is rebuilt when next needed)")
    typer.echo(f"cache list: {total / 2**20:.1f} MiB in all")


"""Crash-safe output: everything is written to a temporary sibling, then renamed."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from etl.errors import InputError


@contextlib.contextmanager
def atomic_output_dir(out: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``out`` only if the block succeeds.

    The temporary directory is created beside ``out`` (same file system, so the final
    ``os.replace`` is atomic for the directory entry). On any exception the temporary
    directory is removed and an existing ``out`` is left untouched.

    Files already present in ``out`` that the block does not write are kept: the new
    files are moved over the old ones one by one after success.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    if any(p.exists() and not p.is_dir() for p in out.parents):
        raise InputError(f"--out {out}: a parent path is a file")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; the renamed output gets normal permissions
    try:
        yield tmp
        if not out.exists():
            os.replace(tmp, out)
            return
        for src in sorted(tmp.rglob("*")):
            if src.is_dir():
                continue
            dst = out / src.relative_to(tmp)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def user_cache_dir(kind: str) -> Path:
    """The per-user cache folder of one kind of cached artefact (``chartevents``: the ETL's
    Parquet cache; ``kernels``: the engine's compiled kernels): ``$ABPS_CACHE_DIR/<kind>``, else
    ``$XDG_CACHE_HOME/abps/<kind>``, else ``~/.cache/abps/<kind>``. Nothing is created."""
    if os.environ.get("ABPS_CACHE_DIR"):
        return Path(os.environ["ABPS_CACHE_DIR"]) / kind
    base = Path(os.environ["XDG_CACHE_HOME"]) if os.environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "abps" / kind

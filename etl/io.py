"""Crash-safe output: everything is written to a temporary sibling, then renamed."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import glob
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from etl.errors import InputError


@contextlib.contextmanager
def atomic_output_dir(out: str | os.PathLike[str], keep_unwritten: bool = True) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``out`` as one unit, only if the block succeeds.

    The temporary directory is created beside ``out`` (same file system). On success it takes
    ``out``'s place in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``; elsewhere the old folder
    is renamed aside first), so a reader, or a second writer running at the same time, sees the
    old folder or the new one, never a mix of files from two runs. On any exception the temporary
    directory is removed and an existing ``out`` is left untouched.

    Files already present in ``out`` that the block does not write are kept (hard-linked, else
    copied, into the new folder before the swap), unless ``keep_unwritten`` is False: then the
    new folder replaces the old one whole (a writer that owns the folder, such as ``abps synth``,
    whose earlier output must not outlive a run that does not write it).

    The temporary directory stays locked (``flock``) while its writer lives, so a temporary
    directory that a killed run (``kill -9``, a power cut) left beside ``out``, with the rows it
    had written, is removed by the next run for the same ``out`` (:func:`clear_stale_temporaries`).

    Raises:
        InputError: ``out`` (or a parent) is a file, or the folder cannot be created or written,
            or the block failed because the file system refused a write (full, over quota, past
            the file size limit: :func:`write_refused`).
    """
    out = Path(out)
    if out.is_symlink():  # the output goes to the folder the link names; the link stays
        out = out.resolve()
    here, target = Path.cwd().resolve(), out.resolve()
    if target == here or target in here.parents:  # the swap would move the folder the command runs in
        raise InputError(f"--out {out}: it holds the current folder; give the output a folder of its own "
                         "(e.g. --out cohort)")
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    if any(p.exists() and not p.is_dir() for p in out.parents):
        raise InputError(f"--out {out}: a parent path is a file")
    mount = _mount_inside(out)
    if mount is not None:  # the swap and the removal of the old output would reach into another file system
        raise InputError(f"--out {out}: {mount} inside it is a mount point; give the output a folder of its own")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        clear_stale_temporaries(out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    held = _lock_dir(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; the renamed output gets normal permissions
    try:
        try:
            yield tmp
        except Exception as exc:
            # an InputError is bad input unless a refused write caused it (atomic_write_text's
            # "cannot write <temporary path>": the user knows --out, not the temporary folder)
            reason = refused_errno(exc) if isinstance(exc, InputError) else write_refused(tmp, exc)
            if reason is not None:
                raise InputError(f"--out {out}: cannot write there ({reason})") from None
            raise
        try:
            _commit_dir(tmp, out, keep_unwritten)
        except OSError as exc:
            raise InputError(f"--out {out}: cannot replace it ({exc.strerror or exc})") from None
    finally:
        remove_tree(tmp)
        if held is not None:
            os.close(held)


#: A temporary directory younger than this (seconds) is never taken for stale: its writer may
#: not have locked it yet.
STALE_AFTER_S = 5.0


def _lock_dir(path: Path, blocking: bool = False) -> int | None:
    """An open descriptor of the directory ``path`` holding an exclusive ``flock``, or None where
    the lock is taken by a living process or the file system cannot lock (the kernel drops the
    lock when the holder exits, however it exits)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except OSError:
        os.close(fd)
        return None
    return fd


def clear_stale_temporaries(out: Path) -> list[Path]:
    """Remove the temporary directories of :func:`atomic_output_dir` beside ``out`` whose writer
    is gone (killed before it could clean up): unlocked, and older than :data:`STALE_AFTER_S`.
    A directory a running writer holds is left alone. Returns the directories removed; warns
    (``UserWarning``) naming how many, since each held rows of an unfinished output."""
    removed = []
    now = time.time()
    for p in sorted(out.parent.glob(f".{glob.escape(out.name)}.tmp-*")):
        try:
            st = p.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or now - st.st_mtime < STALE_AFTER_S:
            continue
        fd = _lock_dir(p)
        if fd is None:  # a living writer holds it (or the lock cannot be taken: leave it)
            continue
        try:
            remove_tree(p)
        finally:
            os.close(fd)
        if not p.exists():
            removed.append(p)
    if removed:
        warnings.warn(f"--out {out}: removed {len(removed)} unfinished output(s) an interrupted run left beside it",
                      stacklevel=2)
    return removed


def _mount_inside(out: Path) -> Path | None:
    """The first mount point at or inside the folder ``out`` (``out`` itself counts: it cannot be
    renamed), else None; links are not followed."""
    if not out.is_dir():
        return None
    for root, dirs, _ in os.walk(out):
        if os.path.ismount(root):
            return Path(root)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
    return None


def rmtree_calling(path: str | os.PathLike[str], handler) -> None:
    """``shutil.rmtree(path)`` calling ``handler(func, path, error)`` where a removal fails (Python
    3.12's ``onexc``; 3.11's ``onerror``, whose third argument is the exc_info triple)."""
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=handler)
    else:
        shutil.rmtree(path, onerror=lambda func, p, info: handler(func, p, info[1]))


def remove_tree(path: Path) -> None:
    """Remove the folder ``path`` (the temporary side of :func:`atomic_output_dir`, which holds
    the old output after the swap), making read-only folders inside it writable first; a folder
    copied from a read-only output would otherwise stay behind, hidden, with its rows.

    Warns (``UserWarning``, naming the path) when something still cannot be removed.
    """
    root = os.path.abspath(path)

    def inside(q: str) -> bool:  # only folders of the tree are made writable, never its parent
        q = os.path.abspath(q)
        return q == root or q.startswith(root + os.sep)

    def writable_then_retry(func, p, _error):
        with contextlib.suppress(OSError):
            parent = os.path.dirname(p) or "."
            if inside(parent):
                os.chmod(parent, 0o700)
            if inside(p) and os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)

    if not path.exists():
        return
    rmtree_calling(path, writable_then_retry)
    if path.exists():
        rmtree_calling(path, writable_then_retry)  # a folder made writable holds more to remove
    if path.exists():
        warnings.warn(f"{path}: could not be removed; remove it yourself (it holds an earlier output)", stacklevel=2)


#: errno values of a file system that refuses a write: full, over quota, past the file size
#: limit, read-only.
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)
#: Bytes :func:`write_refused` tries to write when an error does not say why it failed.
PROBE_BYTES = 1 << 20


def refused_errno(exc: BaseException) -> str | None:
    """The reason of the first OSError with one of :data:`WRITE_ERRNOS` among ``exc`` and the
    exceptions it was raised from or while handling (``raise ... from None`` keeps the latter);
    None when there is none."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in WRITE_ERRNOS:
            return os.strerror(e.errno)
        e = e.__cause__ or e.__context__
    return None


def write_refused(folder: Path, exc: BaseException) -> str | None:
    """Why writing under ``folder`` failed, when ``exc`` (raised while a command wrote there)
    comes from a file system that refuses writes; None otherwise.

    Libraries word a full disk in their own ways (Polars: "parquet: ... File too large (os error
    27)" or "Invalid thrift: transport error"; DuckDB: "IO Error: ..."), so an error that carries
    no :data:`WRITE_ERRNOS` OSError is checked by writing :data:`PROBE_BYTES` into ``folder``
    (removed after): a refused probe gives its reason.
    """
    reason = refused_errno(exc)
    if reason is not None:
        return reason
    probe = folder / f".write-probe-{os.getpid()}"
    try:
        with probe.open("wb") as fh:
            fh.write(b"\0" * PROBE_BYTES)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        return os.strerror(err.errno) if err.errno in WRITE_ERRNOS else None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap the directory entries ``a`` and ``b`` atomically; False where the system cannot."""
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _commit_dir(tmp: Path, out: Path, keep_unwritten: bool = True) -> None:
    """Put the finished folder ``tmp`` in ``out``'s place (see :func:`atomic_output_dir`); afterwards
    ``tmp`` holds the old folder (or nothing) and is removed by the caller."""
    for _ in range(5):  # a concurrent writer may create or swap ``out`` in between
        if not out.exists():
            try:
                os.rename(tmp, out)
                return
            except OSError:  # created meanwhile (not empty): swap with it instead
                continue
        for old in sorted(out.rglob("*")) if keep_unwritten else ():  # keep what the block did not write
            new = tmp / old.relative_to(out)
            if old.is_dir() and not old.is_symlink():
                new.mkdir(exist_ok=True)
            elif not new.exists() and not new.is_symlink():
                with contextlib.suppress(FileNotFoundError):
                    _link_or_copy(str(old), str(new))
        if _exchange(tmp, out):
            return
        aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        try:
            os.replace(out, aside / "d")
        except FileNotFoundError:
            shutil.rmtree(aside, ignore_errors=True)
            continue
        try:
            os.rename(tmp, out)
        except OSError:
            with contextlib.suppress(OSError):
                os.rename(aside / "d", out)  # put the old folder back
            raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)
        return
    raise OSError(f"{out} kept changing while it was replaced")


def check_writable(path: str | os.PathLike[str], option: str) -> None:
    """Refuse, before any work, an output file ``path`` that cannot be written: a parent that is a
    file, a folder that cannot be created or written, a read-only file system.

    Raises:
        InputError: naming ``option`` and ``path``.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{option} {path}: is a directory (give a file such as results.json)")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{option} {path}: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK | os.X_OK) or _read_only_fs(parent):
                raise InputError(f"{option} {path}: {parent} is not writable")
            try:  # what the permission bits do not tell (/proc, /sys, a full or odd file system)
                with tempfile.NamedTemporaryFile(dir=parent, prefix=".abps-probe-"):
                    pass
            except OSError as exc:
                raise InputError(f"{option} {path}: {parent} does not take a new file ({exc.strerror})") from None
            return


def _read_only_fs(path: Path) -> bool:
    """True on a file system mounted read-only (``os.access`` says writable there for root)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, exclusive: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``.

    ``exclusive=True`` never replaces a file: the temporary file is linked to ``path`` (an atomic
    create-if-absent), so of two writers racing for one path the later one fails.

    Raises:
        InputError: ``exclusive`` and ``path`` exists; or the write fails (a full disk, a read-only
            or missing folder): one line naming ``path``; ``path`` is then left as it was.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file where a folder of the path goes
        raise InputError(f"cannot write {path}: a part of its folder is a file") from None
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600
        if exclusive:
            os.link(tmp, path)
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
        tmp = None
    except FileExistsError:
        raise InputError(f"{path} exists (written meanwhile by another run); give --force to replace it, "
                         "or another --output") from None
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def atomic_write_text(path: str | os.PathLike[str], text: str, exclusive: bool = False) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"), exclusive)


def user_cache_dir(kind: str) -> Path:
    """The per-user cache folder of one kind of cached artefact (``chartevents``: the ETL's
    Parquet cache; ``kernels``: the engine's compiled kernels): ``$ABPS_CACHE_DIR/<kind>``, else
    ``$XDG_CACHE_HOME/abps/<kind>``, else ``~/.cache/abps/<kind>``. Nothing is created."""
    if os.environ.get("ABPS_CACHE_DIR"):
        return Path(os.environ["ABPS_CACHE_DIR"]) / kind
    base = Path(os.environ["XDG_CACHE_HOME"]) if os.environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "abps" / kind


#: The files of a cohort folder whose SHA-256 the folder's manifest records (``files``).
COHORT_FILES = ("cohort.parquet", "centers.parquet")
#: The manifests that record them: the ETL's report, or ``abps synth fedprox``'s manifest.
MANIFESTS = ("cohort_report.json", "fedprox_manifest.json")


def file_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of the bytes of ``path``, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cohort_file_digests(folder: str | os.PathLike[str]) -> tuple[str, dict[str, str]]:
    """Read the :data:`COHORT_FILES` of ``folder`` once; return ``(chained, {name: SHA-256})``.

    ``chained`` is the SHA-256 (hex) of each file's name then bytes, in :data:`COHORT_FILES`
    order (the cohort's identity); the dict holds each file's own SHA-256 (the manifest's
    ``files``). The result is remembered per (path, inode, size, mtime), so the identity and the
    manifest check of one run read the files once.

    Raises:
        InputError: a file is missing.
    """
    key = []
    for name in COHORT_FILES:
        p = Path(folder) / name
        try:
            st = p.stat()
        except OSError:
            raise InputError(f"{p}: file not found (expected {name} from `abps etl`)") from None
        key.append((str(p.resolve()), st.st_ino, st.st_size, st.st_mtime_ns))
    return _digests_of(tuple(key))


@functools.lru_cache(maxsize=8)
def _digests_of(key: tuple[tuple[str, int, int, int], ...]) -> tuple[str, dict[str, str]]:
    chained = hashlib.sha256()
    each: dict[str, str] = {}
    for name, (path, *_) in zip(COHORT_FILES, key):
        own = hashlib.sha256()
        chained.update(name.encode())
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                chained.update(chunk)
                own.update(chunk)
        each[name] = own.hexdigest()
    return chained.hexdigest(), each


def cohort_digests(folder: str | os.PathLike[str]) -> dict[str, str]:
    """``{name: SHA-256}`` of the :data:`COHORT_FILES` just written to ``folder``, for its manifest
    (``files``); :func:`check_cohort_files` compares a folder against it."""
    return cohort_file_digests(folder)[1]


def check_cohort_files(folder: str | os.PathLike[str]) -> None:
    """Refuse a cohort folder whose ``cohort.parquet`` and ``centers.parquet`` are not the files its
    manifest (:data:`MANIFESTS`, written last by the run that wrote them) records: files copied in
    from another run, or a folder mixed by hand. A folder without a manifest, or whose manifest
    records no ``files``, is accepted (nothing to compare).

    Raises:
        InputError: one line naming the folder, the manifest and each file that differs; or a
            manifest that is not readable JSON.
    """
    folder = Path(folder)
    for name in MANIFESTS:
        path = folder / name
        if not path.is_file():
            continue
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{path}: not readable JSON ({exc.__class__.__name__})") from None
        files = manifest.get("files") if isinstance(manifest, dict) else None
        if not isinstance(files, dict):
            continue
        if not all((folder / f).is_file() for f in COHORT_FILES):
            differ = [f for f in COHORT_FILES if f in files and (not (folder / f).is_file()
                                                                 or file_digest(folder / f) != files[f])]
        else:
            now = cohort_file_digests(folder)[1]
            differ = [f for f in COHORT_FILES if f in files and now[f] != files[f]]
        if differ:
            one = len(differ) == 1
            raise InputError(f"{' and '.join(str(folder / f) for f in differ)} {'is' if one else 'are'} not the "
                             f"file{'' if one else 's'} {name} records (SHA-256 differs): the folder mixes files of "
                             "different runs, or a file changed since; write the folder again with one run")


def folder_name(s: str) -> str:
    """``s`` as one folder name (runs under ``runs/<experiment>/``): runs of characters other than
    letters, digits and ``+._-`` become ``-``."""
    return re.sub(r"[^A-Za-z0-9+._-]+", "-", s).strip("-") or "_"

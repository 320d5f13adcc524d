"""The project folder's conventions shared by the CLI commands: the recorded default cohort
(``.abps/state.json``), the default results path ``runs/<experiment>/<run>/results.json`` and the
``--tracking-uri`` option. Details: docs/runtime.md, "Module notes".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import typer

from etl.errors import InputError
from etl.io import atomic_write_text, folder_name
from federation.core.limits import MAX_SEED

#: help of ``--tracking-uri``, one text on every command that reads or writes MLflow
TRACKING_URI_HELP = "MLflow tracking URI (default: MLFLOW_TRACKING_URI, else this project's sqlite:///mlflow/mlflow.db)"


def file_path(value: str) -> Path:
    """The value of an option that names a file to write (``--output``, ``--capture``,
    ``--checkpoint``): refused when it ends in a path separator, which names a folder (typer's
    ``Path`` would drop the separator and write a file of that folder's name).

    Raises:
        typer.BadParameter: ``value`` ends in ``/`` (or the platform's separator).
    """
    if value.endswith(("/", os.sep)):
        raise typer.BadParameter(f"{value} ends in {value[-1]}, which names a folder; give a file such as "
                                 f"{value}results.json")
    return Path(value)


def folder_path(value: str) -> Path:
    """The value of an option that names a folder to write (``--out``): refused when empty, which
    typer's ``Path`` reads as the working folder ``.``.

    Raises:
        typer.BadParameter: ``value`` is empty or blank.
    """
    if not value.strip():
        raise typer.BadParameter("an empty path; give a folder such as cohort/")
    return Path(value)


def tracking_uri_option() -> Any:
    """The ``--tracking-uri`` option (default None: MLFLOW_TRACKING_URI, else the project's store)."""
    return typer.Option(None, "--tracking-uri", callback=_non_empty_uri, help=TRACKING_URI_HELP)


def _non_empty_uri(value: str | None) -> str | None:
    """An empty ``--tracking-uri`` is refused, not taken for the default store; so is a scheme
    that names no MLflow store (MLflow's own message speaks of its model registry)."""
    if value is not None and not value.strip():
        raise InputError("--tracking-uri: an empty URI (leave the option out for MLFLOW_TRACKING_URI or this "
                         "project's store)")
    from federation.run.tracking import check_uri_scheme

    return check_uri_scheme(value, "--tracking-uri") if value else value


def _state_path() -> Path:
    """``.abps/state.json`` in the project folder; the ``ABPS_STATE`` environment variable names
    another file (the test suite sets it so that tests never touch a checkout's own record)."""
    return Path(os.environ.get("ABPS_STATE") or Path(".abps") / "state.json")


def _read_state() -> tuple[dict, str]:
    """``(record, damage)``: the project's record (``{}`` when there is none) and, when the file is
    there but unreadable, not JSON or not a mapping, a few words naming it (else ``""``); a damaged
    record counts as none and the next ``abps etl`` writes it anew."""
    path = _state_path()
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, ""
    except (OSError, ValueError) as exc:
        why = "not JSON" if isinstance(exc, ValueError) else (exc.strerror or type(exc).__name__).lower()
        return {}, f"the project record {path} is damaged ({why})"
    if not isinstance(doc, dict):
        return {}, f"the project record {path} is damaged (not a JSON mapping)"
    return doc, ""


def record_etl(out: Path, source: str) -> None:
    """Record ``out`` (absolute) as the project's latest cohort in ``.abps/state.json`` (atomic)
    and print the command to run next."""
    import typer

    doc = {**_read_state()[0], "cohort": str(Path(out).resolve()), "source": source}
    try:
        atomic_write_text(_state_path(), json.dumps(doc, indent=2) + "\n")
    except InputError as exc:  # the cohort is built; only the record of it failed
        raise InputError(f"the cohort is in {out}, but the project record could not be written "
                         f"({'ABPS_STATE: ' if os.environ.get('ABPS_STATE') else ''}{exc})") from None
    typer.echo("next: abps train --goal diversity   (trains on this cohort, the project's default from now on)")


def _is_cohort(d: Path) -> bool:
    return (d / "cohort.parquet").is_file() and (d / "centers.parquet").is_file()


def recorded_cohort() -> Path | None:
    """The cohort folder of this project's most recent ``abps etl`` when it still holds a cohort,
    else ``./cohort`` when that does, else None."""
    recorded = _read_state()[0].get("cohort")
    if isinstance(recorded, str) and _is_cohort(Path(recorded)):
        return Path(recorded)
    return Path("cohort") if _is_cohort(Path("cohort")) else None


def default_cohort() -> Path:
    """The cohort of the most recent ``abps etl`` in this project, else ``./cohort``.

    Raises:
        InputError: neither holds ``cohort.parquet`` and ``centers.parquet`` (one line naming both
            ways to give a cohort).
    """
    state, damage = _read_state()
    recorded = state.get("cohort")
    if isinstance(recorded, str) and _is_cohort(Path(recorded)):
        return Path(recorded)
    if _is_cohort(Path("cohort")):
        return Path("cohort")
    gone = f" ({damage})" if damage else f" (the recorded {recorded} is gone)" if recorded else ""
    raise InputError(f"no cohort{gone}: give --cohort DIR, or build one with `abps etl --mimic-dir DIR --out DIR` "
                     "(this project then uses it by default)")


def _safe(s: str) -> str:
    """``s`` as a folder name (runs of :func:`run_output`; :func:`etl.io.folder_name`)."""
    return folder_name(s)


def run_output(experiment: str, method: str) -> Path:
    """``runs/<experiment>/<method>-<UTC yyyymmdd-HHMMSS>/results.json`` (folder names made safe).

    A second run of the same label within the same second gets the first free folder among
    ``...-HHMMSS-2``, ``-3``, ... so a default output never collides with an earlier run's.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = Path("runs") / _safe(experiment) / f"{_safe(method)}-{stamp}"
    folder, n = base, 1
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder / "results.json"


def latest_checkpointed_output(experiment: str, method: str) -> Path:
    """The results.json path of the newest run folder of ``method`` under ``runs/<experiment>/``
    (:func:`run_output`'s names) that holds a round checkpoint (``results.json.ckpt``).

    Raises:
        InputError: none has one (naming the folder searched and --output).
    """
    from federation.run.checkpoint import SUFFIX

    folder = Path("runs") / _safe(experiment)
    own = re.compile(re.escape(_safe(method)) + r"-\d{8}-\d{6}(-\d+)?")  # not abps-hom-... for abps
    found = [p for p in folder.glob(f"*/results.json{SUFFIX}") if own.fullmatch(p.parent.name) and p.is_file()]
    if not found:
        raise InputError(f"--resume: no checkpoint of {method!r} under {folder}/ (give the stopped run's --output)")
    newest = max(found, key=lambda p: (p.stat().st_mtime, str(p)))
    return newest.with_name("results.json")


def force_option() -> Any:
    """The ``--force`` option of a command that writes one results file (``--output``)."""
    return typer.Option(False, "--force", help="replace an existing --output file")


def check_output(path: Path, force: bool) -> None:
    """Refuse to replace an existing results file unless ``force``.

    Raises:
        InputError: ``path`` exists and ``force`` is False.
    """
    if path.exists() and not force:
        raise InputError(f"{path} exists; give --force to replace it, or another --output")


def check_apart(outputs: dict[str, Path | None], inputs: dict[str, Path | None],
                tracking_uri: str | None | bool = False) -> None:
    """Refuse an output that would overwrite what the command reads, or another of its outputs.

    Args:
        outputs: option (``--output``) -> path the command writes (None: not given).
        inputs: what it is (``"the run config"``) -> a file the command reads, or a folder whose
            existing files it reads (the cohort folder); None: not given.
        tracking_uri: the command's ``--tracking-uri`` (None: the default store) when it writes
            MLflow, whose sqlite file is then an input too; False: the command logs nothing.

    Raises:
        InputError: naming the option, the path and what it would overwrite.
    """
    ins = {what: Path(p).expanduser().resolve() for what, p in inputs.items() if p is not None}
    if tracking_uri is not False:
        from federation.run.tracking import default_tracking_uri, sqlite_path

        db = sqlite_path(tracking_uri or default_tracking_uri(make_folder=False))
        if db is not None:
            ins["the MLflow store"] = db.expanduser().resolve()
    seen: dict[Path, str] = {}
    for option, given in outputs.items():
        if given is None:
            continue
        out = Path(given).expanduser().resolve()
        for what, p in ins.items():
            inside = p.is_dir() and out.parent == p and out.exists()
            if out == p or inside or (out.exists() and p.exists() and os.path.samefile(out, p)):
                raise InputError(f"{option} {given}: would overwrite {what}")
        if out in seen:
            raise InputError(f"{option} {given}: is also {seen[out]}; give each its own file")
        seen[out] = f"the {option}"


def check_out_ignored(out: Path, option: str = "--out", probe_file: str = "cohort.parquet",
                      holds: str = "cohort.parquet holds patient identifiers") -> None:
    """Refuse a folder of patient rows inside a git work tree that does not ignore it: an ETL
    output folder (cohort.parquet holds subject_id, hadm_id and stay_id) or the chartevents cache
    (stay_id rows) must never be committed. ``probe_file`` is the file name asked of
    ``git check-ignore``; ``option`` and ``holds`` word the error. Nothing is checked where git is
    not installed or ``out`` is outside any work tree.

    Raises:
        InputError: ``out`` is inside a git work tree and ``git check-ignore`` does not ignore it
            (one line naming the option, the folder, the work tree and the ``.gitignore`` line to add).
    """
    import shutil
    import subprocess

    git = shutil.which("git")
    if git is None:
        return
    target = Path(out).resolve()
    probe = next((p for p in (target, *target.parents) if p.is_dir()), None)
    if probe is None:
        return
    top = subprocess.run([git, "-C", str(probe), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode != 0:
        return
    root = Path(top.stdout.strip()).resolve()
    rel = target.relative_to(root).as_posix() if target != root else "."
    ignored = subprocess.run([git, "-C", str(root), "check-ignore", "-q", f"{rel}/{probe_file}"],
                             capture_output=True).returncode == 0
    if not ignored:
        raise InputError(f"{option} {out}: not ignored by git in the work tree {root} ({holds}); "
                         f"add /{rel}/ to its .gitignore, or write outside the repository")


def parse_seeds(first: list[int] | None, extra: list[str]) -> list[int]:
    """The ``--seeds`` values: the option's integers plus the extra arguments after them.

    Raises:
        InputError: a non-integer, a seed outside 0 .. :data:`MAX_SEED`, or a repeated seed.
    """
    seeds = list(first or [])
    for tok in extra:
        try:
            seeds.append(int(tok))
        except ValueError:
            raise InputError(f"unexpected argument {tok!r} (--seeds takes integers)") from None
    if any(s < 0 or s > MAX_SEED for s in seeds):
        raise InputError(f"--seeds must be integers from 0 to {MAX_SEED} (2^63 - 1, the largest a random stream takes)")
    if len(set(seeds)) != len(seeds):
        raise InputError("--seeds holds a seed twice")
    return seeds


def shown_path(path: str | Path) -> Path:
    """``path`` as a message shows it: relative to the working folder when it lies inside it (the
    recorded cohort is absolute), else as it is."""
    p = Path(path)
    with contextlib.suppress(OSError, ValueError):
        return p.resolve().relative_to(Path.cwd().resolve())
    return p


#: the seed of a run given none: the first of the ABPS paper's five (11 22 33 44 55), for
#: ``abps train`` and ``abps launch`` alike, so that their default runs are the same computation
DEFAULT_SEED = 11


def seed_value(value: int | None) -> int | None:
    """A ``--seed`` option's value, checked as :func:`parse_seeds` checks each of ``--seeds`` (a
    typer ``callback``: the bound stays out of the help's type column).

    Raises:
        InputError: a seed outside 0 .. :data:`MAX_SEED`.
    """
    if value is not None and not 0 <= value <= MAX_SEED:
        raise InputError(f"--seed must be an integer from 0 to {MAX_SEED} (2^63 - 1, the largest a random stream "
                         f"takes), got {value}")
    return value


#: the longest wait ``--timeout`` / ``--start-timeout`` take (one day; gRPC refuses far larger deadlines)
MAX_WAIT_SECONDS = 86400.0


def seconds_value(ctx: typer.Context, param: typer.CallbackParam, value: float) -> float:
    """A wait in seconds (``--timeout``, ``--start-timeout``): a number from 0.1 to
    :data:`MAX_WAIT_SECONDS`. A typer ``callback``, so the bounds stay out of the help's type column.

    Raises:
        InputError: a value below 0.1 s or above the bound, or not a number; names the option.
    """
    if not (0.1 <= value <= MAX_WAIT_SECONDS):  # NaN fails both comparisons
        raise InputError(f"{param.opts[0]} must be a number of seconds from 0.1 to {MAX_WAIT_SECONDS:g}, "
                         f"got {value:g}")
    return value

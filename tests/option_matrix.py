"""The option matrix: every command x every option of the typer app x every kind of run.

Each cell runs a kind's base invocation with one option changed (a *probe*) and passes when either
the command exits 2 with one ``error:`` line naming the option (refused), or what the run leaves
behind (outputs, recorded config, MLflow store, console) differs from the base run's (applied).
The commands and options are read from the typer app, so a new option or command is covered
without anyone listing it: an option of a type with a generic probe (int, float, flag) is probed
as is; any other fails here until it has a probe, and a command fails until it has a kind.

The run kinds (etl per source, train per run kind and benchmark config, sweep, runs / report / ui,
synth) are split between the two CI workers by the files ``test_option_matrix_*.py``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sqlite3
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

REPO = Path(__file__).resolve().parents[1]


def commands() -> dict[tuple[str, ...], Any]:
    """Every leaf command of the typer app: path (``("synth", "mimic")``) -> click command."""
    import typer.main

    from cli.app import _register, app

    _register()
    out: dict[tuple[str, ...], Any] = {}

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, (*path, name))
        else:
            out[path] = cmd

    walk(typer.main.get_command(app), ())
    return out


def options(path: tuple[str, ...]) -> list[Any]:
    """The options of one command (help excluded), as the typer app declares them."""
    return [p for p in commands()[path].params if getattr(p, "opts", None) and p.name != "help"]


def flag_of(p: Any) -> str:
    return max(p.opts, key=len)


def _annotation(p: Any) -> Any:
    ann = p.type_descriptor.annotation
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    if typing.get_origin(ann) is typing.Union and len(args) == 1:
        ann = args[0]
    return ann


@dataclass
class Probe:
    """One changed option: ``args`` replace the option in the base argv (``[]`` with ``drop``
    removes it); ``setup(scratch)`` prepares the scratch folder for both the base and the probe."""

    args: list[str]
    setup: Callable[[Path], None] | None = None
    drop: bool = False


@dataclass
class Kind:
    """A kind of run of one command: the base argv (given the shared inputs; paths of outputs are
    relative: every run works in a scratch folder of its own) and the probes of options whose
    generic probe does not fit."""

    command: tuple[str, ...]
    name: str
    base: Callable[[dict[str, Path]], list[str]]
    probes: dict[str, Callable[[dict[str, Path]], Probe]] = field(default_factory=dict)
    #: options that by design can change nothing observable in this kind, with the reason
    trivial: dict[str, str] = field(default_factory=dict)
    #: prepares every run's scratch folder (e.g. copies a store into it)
    setup: Callable[[Path, dict[str, Path]], None] | None = None
    #: ``patch(monkeypatch, scratch)`` before every run (e.g. stands in for a server process)
    patch: Callable[[Any, Path], None] | None = None


def generic_probe(p: Any, base: list[str]) -> Probe | None:
    """A changed value from the option's type and default: a flag toggled, a number moved; None
    for a type with no generic change (a path, a name)."""
    flag = flag_of(p)
    if getattr(p, "is_flag", False):
        if flag in base:
            return Probe([], drop=True)
        if p.secondary_opts and p.default:
            return Probe([p.secondary_opts[0]])
        return Probe([flag])
    ann = _annotation(p)
    current = _value_in(base, flag)
    if ann is int:
        v = int(current) if current is not None else (p.default if isinstance(p.default, int) else 1)
        return Probe([flag, str(v + 1)])
    if ann is float:
        v = float(current) if current is not None else (float(p.default) if p.default is not None else 1.0)
        return Probe([flag, repr(v * 2 + 1)])
    return None


def _value_in(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None


def apply_probe(base: list[str], p: Any, probe: Probe) -> list[str]:
    """``base`` with option ``p`` replaced by ``probe.args`` (every occurrence and its value)."""
    names = set(p.opts) | set(p.secondary_opts)
    out: list[str] = []
    i = 0
    while i < len(base):
        if base[i] in names:
            i += 1
            if not getattr(p, "is_flag", False):  # the option's values (several for a multi-value option)
                while i < len(base) and not base[i].startswith("--"):
                    i += 1
            continue
        out.append(base[i])
        i += 1
    return out if probe.drop else [*out, *probe.args] if probe.args else out


# -------------------------------------------------------------------------------- observing a run

_VOLATILE_KEY = re.compile(r"(^|_)(s|seconds|time|times|timings|timestamp|duration|started|ended|wall|"
                           r"elapsed|ms|run_id|start_time|end_time|created|host|pid)($|_)", re.I)
_STAMP = re.compile(r"\d{8}-\d{6}|\b[0-9a-f]{32}\b")  # a UTC stamp in a path, an MLflow run id
_FLOATS = re.compile(r"\d+\.\d+ ?s\b")
_LOG_LINE = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d ")  # a library's timestamped log line


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in sorted(obj.items()) if not _VOLATILE_KEY.search(str(k))}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    if isinstance(obj, str):
        return _STAMP.sub("<stamp>", obj)
    return obj


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _store(db: Path) -> Any:
    """What an MLflow sqlite store holds, without ids and times: experiments, and per run its name,
    status, params, tags (MLflow's own left out) and final metrics."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        exps = {r[0]: r[1] for r in con.execute("SELECT experiment_id, name FROM experiments")}
        runs = []
        for rid, name, status, exp in con.execute("SELECT run_uuid, name, status, experiment_id FROM runs"):
            params = sorted(con.execute("SELECT key, value FROM params WHERE run_uuid = ?", (rid,)).fetchall())
            tags = sorted((k, v) for k, v in con.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (rid,))
                          if not k.startswith("mlflow.") and not _VOLATILE_KEY.search(k))
            mets = sorted((k, v) for k, v in con.execute("SELECT key, value FROM latest_metrics WHERE run_uuid = ?",
                                                          (rid,)) if not _VOLATILE_KEY.search(k))
            runs.append((exps.get(exp), name, status, params, tags, mets))
        return sorted(runs, key=_digest), sorted(exps.values())
    finally:
        con.close()


def observe(scratch: Path, code: int, out: str, err: str) -> dict[str, Any]:
    """Everything a run left in ``scratch`` (file names; the content of Parquet, JSON, CSV and
    MLflow stores, times and ids left out), its exit code and console, paths made relative."""
    files: dict[str, Any] = {}
    for f in sorted(scratch.rglob("*")):
        rel = _STAMP.sub("<stamp>", str(f.relative_to(scratch)))
        if not f.is_file() or "/artifacts/" in f"/{rel}" or f.name == ".abps-state.json":
            continue
        try:
            if f.suffix == ".parquet":
                df = pl.read_parquet(f)
                files[rel] = (df.columns, int(df.hash_rows(seed=0).sum()) if df.height else 0, df.height)
            elif f.suffix == ".json":
                files[rel] = _digest(_clean(json.loads(f.read_text().replace(str(scratch), "<scratch>"))))
            elif f.suffix == ".db":
                files[rel] = json.loads(json.dumps(_store(f)).replace(str(scratch), "<scratch>"))
            elif f.suffix in (".csv", ".gz", ".yaml"):
                files[rel] = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
            else:
                files[rel] = "present"
        except Exception as exc:  # noqa: BLE001 - an unreadable output is itself an observation
            files[rel] = f"unreadable {type(exc).__name__}"
    console = [_FLOATS.sub("<t>", _STAMP.sub("<stamp>", ln.replace(str(scratch), "<scratch>")))
               for ln in (out + "\n" + err).splitlines() if ln.strip() and not _LOG_LINE.match(ln)]
    return {"exit": code, "files": files, "console": console}


def refused_naming(code: int, err: str, flag: str) -> bool:
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("warning:", "note:", "cohort:"))
             and not _LOG_LINE.match(ln)]  # MLflow's own INFO lines on creating a store
    return code == 2 and "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: ") \
        and flag in lines[0]


def fresh(scratch: Path) -> Path:
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    return scratch


def run_cli(argv: list[str], scratch: Path, capsys: Any, monkeypatch: Any) -> tuple[int, str, str]:
    """``abps ARGV`` in-process with ``scratch`` as the working folder and state file; the torch
    thread count is restored afterwards (``--threads`` sets it process-wide)."""
    import torch

    from cli.app import main

    threads = torch.get_num_threads()
    # an MLflow store URI relative to the working folder is made absolute: SQLAlchemy keeps one engine
    # per URI text in a process, so a relative URI would reach the first run's folder
    argv = [f"sqlite:///{scratch / a[len('sqlite:///'):]}" if a.startswith("sqlite:///") and
            not a[len("sqlite:///"):].startswith("/") else a for a in argv]
    monkeypatch.chdir(scratch)
    monkeypatch.setenv("ABPS_STATE", str(scratch / ".abps-state.json"))
    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        torch.set_num_threads(threads)
    out, err = capsys.readouterr()
    return code, out, err


_BASES: dict[str, dict[str, Any]] = {}


_RUNS = [0]


def run_observed(kind: Kind, argv: list[str], scratch: Path, setup: Callable[[Path], None] | None, capsys: Any,
                 monkeypatch: Any, inputs: dict[str, Path]) -> tuple[int, str, dict[str, Any]]:
    # a new folder per run: SQLAlchemy keeps the engine of a store path open within the process
    _RUNS[0] += 1
    scratch = fresh(scratch.with_name(f"{scratch.name}-{_RUNS[0]}"))
    if kind.setup is not None:
        kind.setup(scratch, inputs)
    if setup is not None:
        setup(scratch)
    if kind.patch is not None:
        kind.patch(monkeypatch, scratch)
    code, out, err = run_cli(argv, scratch, capsys, monkeypatch)
    assert "Traceback" not in err, err[-1500:]
    return code, err, observe(scratch, code, out, err)


def base_observation(kind: Kind, inputs: dict[str, Path], root: Path, capsys: Any, monkeypatch: Any,
                     setup: Callable[[Path], None] | None = None) -> dict[str, Any]:
    """The base run's observation (cached per kind when no setup is needed)."""
    if setup is None and kind.name in _BASES:
        return _BASES[kind.name]
    code, err, obs = run_observed(kind, [*kind.command, *kind.base(inputs)], root / "base", setup, capsys,
                                  monkeypatch, inputs)
    if setup is None:  # (with a setup, e.g. an existing output, the base may be refused)
        assert code == 0, f"base run of {kind.name} failed: {err[-800:]}"
        _BASES[kind.name] = obs
    return obs


def check_base_repeats(kind: Kind, inputs: dict[str, Path], root: Path, capsys: Any, monkeypatch: Any) -> None:
    """The base run twice gives the same observation (else a probe's change proves nothing)."""
    first = base_observation(kind, inputs, root, capsys, monkeypatch)
    _, _, again = run_observed(kind, [*kind.command, *kind.base(inputs)], root / "again", None, capsys, monkeypatch,
                               inputs)
    assert again == first, _diff(first, again)


def _diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    files = sorted(k for k in set(a["files"]) | set(b["files"]) if a["files"].get(k) != b["files"].get(k))
    for k in files:
        if k.endswith(".db") and k in a["files"] and k in b["files"]:
            for x, y in zip(a["files"][k][0], b["files"][k][0]):
                for u, v in zip(x, y):
                    if u != v:
                        files.append(str(set(map(str, u)) ^ set(map(str, v)) if isinstance(u, list) else (u, v)))
            files.append(f"{len(a['files'][k][0])} vs {len(b['files'][k][0])} runs; {a['files'][k][1]} vs {b['files'][k][1]}")
    console = [(x, y) for x, y in zip(a["console"], b["console"]) if x != y][:3]
    return f"exit {a['exit']} vs {b['exit']}; files differ: {files}; console differs: {console}"


def check_cell(kind: Kind, opt: str, inputs: dict[str, Path], root: Path, capsys: Any, monkeypatch: Any) -> None:
    """One cell of the matrix (see the module docstring)."""
    p = next(x for x in options(kind.command) if x.name == opt)
    flag = flag_of(p)
    if opt in kind.trivial:
        return
    base_argv = [*kind.command, *kind.base(inputs)]
    probe = kind.probes[opt](inputs) if opt in kind.probes else generic_probe(p, base_argv)
    assert probe is not None, (f"{' '.join(kind.command)} {flag} ({kind.name}): no generic probe for its type; "
                               "add one to the kind's probes")
    base = base_observation(kind, inputs, root, capsys, monkeypatch, probe.setup)
    code, err, obs = run_observed(kind, apply_probe(base_argv, p, probe), root / "probe", probe.setup, capsys,
                                  monkeypatch, inputs)
    if code != 0:
        assert refused_naming(code, err, flag), (f"{flag} ({kind.name}): failed without one error line "
                                                 f"naming it: {err[-600:]}")
        print(f"refused: {err.strip().splitlines()[-1]}")  # shown by pytest -rP
        return
    print("applied: changed", sorted(k for k in set(obs) | set(base) if obs.get(k) != base.get(k)),
          sorted(k for k in set(obs["files"]) | set(base["files"]) if obs["files"].get(k) != base["files"].get(k)))
    assert obs != base, (f"{' '.join(kind.command)} {' '.join(probe.args) or 'without ' + flag} ({kind.name}) was "
                         "accepted and changed nothing: apply it or refuse it")

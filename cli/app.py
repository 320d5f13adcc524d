"""The `abps` typer application.

Each sub-command lives in its own module under ``cli/`` and registers itself here.
``main`` turns an :class:`etl.errors.InputError` (or a pydantic validation error)
into one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import time

import typer

from etl.errors import InputError

app = typer.Typer(
    name="abps",
    help="Clinical federated learning: cohort ETL, stacked multi-center training, ABPS partner selection.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
synth_app = typer.Typer(help="Write synthetic data sets in a real source's format.", no_args_is_help=True)
app.add_typer(synth_app, name="synth")
cache_app = typer.Typer(help="The per-user caches (ETL chartevents cache, compiled kernels).", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"abps {version('abps')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("abps (not installed: run `make install`)")
        raise typer.Exit()


@app.callback()
def _root(_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                        help="print the installed version and exit")) -> None:
    """Clinical federated learning: cohort ETL, stacked multi-center training, ABPS partner selection."""


def _flags_without_a_type() -> None:
    """Help shows no value type beside a flag: typer 0.29 prints ``<bool>`` there (``--force <bool>``),
    which reads as if the flag took a value; options that take one keep typer's ``<int>`` etc.
    (docs/decisions.md, "Command-line help")."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "_abps_flags", False):
        return

    def display_type_rich(self, ctx):
        return None if getattr(self, "is_flag", False) else shown(self, ctx)

    display_type_rich._abps_flags = True
    TyperOption.display_type_rich = display_type_rich


_flags_without_a_type()


def _register() -> None:
    """Import the command modules; each adds its commands to ``app`` / ``synth_app``."""
    import importlib

    for name in ("cli.etl_cmd", "cli.synth_cmd", "cli.synth_fedprox_cmd", "cli.train_cmd", "cli.sweep_cmd",
                 "cli.report_cmd", "cli.runs_cmd", "cli.cache_cmd", "cli.p2p_cmd"):
        importlib.import_module(name)  # a module that fails to import fails the command, never drops it
    for typer_app in (app, synth_app, cache_app):
        _summaries_as_paragraphs(typer_app)


def _summaries_as_paragraphs(typer_app: typer.Typer) -> None:
    """A command list shows each command's first docstring paragraph as one paragraph: typer keeps
    the docstring's line breaks there (rich markup mode), which cut sentences at the source's width."""
    import inspect

    for info in typer_app.registered_commands:
        text = info.help or (inspect.getdoc(info.callback) if info.callback else None)
        if info.short_help is None and text:
            info.short_help = " ".join(text.split("\n\n")[0].split())


def _first_line(text: str, limit: int = 300) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line[:limit]


def _mlflow_line(exc: BaseException) -> str:
    """The line of an MLflow error that says what failed: SQLAlchemy puts its own advice first
    ("(raised as a result of Query-invoked autoflush ...)"); a store that refuses writes is named
    as such, with what to do."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    line = next((ln for ln in lines if not ln.startswith("(raised as a result of")), lines[0] if lines else "")
    if "readonly database" in line or "read-only file system" in line.lower():
        return ("the store cannot be written (" + line.split(") ", 1)[-1][:120] + "); give another --tracking-uri "
                "(abps report: or --no-log)")
    return line[:300]


def _warning_line(message, category, filename, lineno, line=None) -> str:  # noqa: ARG001
    """``warnings.formatwarning`` while a command runs: ``warning: <first line>``, without
    Python's file, line number and source line."""
    return f"warning: {_first_line(message)}\n"


#: The signal that ended the command, if any (set by the handlers below). A signal that arrives
#: while DuckDB runs a query does not surface as the handler's exception: DuckDB interrupts the
#: query and raises its own error (``RuntimeError: Query interrupted``). Whatever exception
#: unwinds after a signal is therefore reported as that signal.
_received: dict[str, float | None] = {"signal": None, "at": None}

#: seconds after a first signal during which a repeat (Ctrl-C pressed twice, a terminal sending
#: SIGHUP then SIGTERM) is ignored, so the unwinding that removes the temporary outputs finishes
REPEAT_GRACE_S = 2.0


def _first_signal(signum: int) -> bool:
    """Record ``signum``; False for a repeat within :data:`REPEAT_GRACE_S` of the first."""
    if _received["signal"] is not None and time.monotonic() - (_received["at"] or 0.0) < REPEAT_GRACE_S:
        return False
    _received["signal"], _received["at"] = signum, time.monotonic()
    return True


def _on_sigint(signum, frame) -> None:  # noqa: ARG001
    if _first_signal(signum):
        raise KeyboardInterrupt


def _on_sigterm(signum, frame) -> None:  # noqa: ARG001
    # SIGTERM, and SIGHUP (the terminal closed): unwind normally so that temporary outputs are
    # removed (etl.io.atomic_output_dir)
    if _first_signal(signum):
        raise SystemExit(128 + signum)


def interrupt_handled() -> None:
    """Forget the signal received: for a command whose normal end is Ctrl-C (``abps ui``), which
    then exits 0 rather than 130."""
    _received["signal"] = _received["at"] = None


def _exit_interrupted() -> None:
    """Exit for the signal received: 130 (SIGINT, Ctrl-C), 143 (SIGTERM) or 129 (SIGHUP), with
    one line."""
    print("error: interrupted", file=sys.stderr)
    sys.exit(128 + int(_received["signal"] or 2))


#: the signals a command handles by unwinding (SIGHUP only where it exists and is not ignored)
_HANDLED = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


def _watch_signals(fd: int) -> None:
    """Thread body: each byte on ``fd`` (the signal wakeup pipe) is a signal that just arrived;
    interrupt the running DuckDB queries, which a signal alone does not stop while several
    threads execute them. The Python handler then runs when the query returns. Ends at EOF.
    A command that never imported the ETL's DuckDB module has no query to interrupt (and does
    not pay for importing DuckDB)."""

    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        # still being imported when the signal came: it has no query running yet
        interrupt_all = getattr(sys.modules.get("etl.sources"), "interrupt_all", None)
        if interrupt_all is not None and set(_HANDLED) & set(data):  # each byte is a signal number
            # a query that was still being prepared when the signal came starts afterwards and
            # would run on: interrupt again until the main thread has run the Python handler
            for _ in range(600):
                interrupt_all()
                if _received["signal"] is not None:
                    break
                time.sleep(0.05)


@contextlib.contextmanager
def _signal_watcher():
    """Route signals to :func:`_watch_signals` (``signal.set_wakeup_fd``) for the block."""
    import threading

    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:  # not the main thread: no watcher
        os.close(r)
        os.close(w)
        yield
        return
    t = threading.Thread(target=_watch_signals, args=(r,), name="abps-signal-watcher", daemon=True)
    t.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(w)  # EOF ends the thread
        t.join(timeout=5)
        os.close(r)


def single_value_options(path: list[str]) -> tuple[list[str], dict[str, str]]:
    """For the command that ``path`` (its leading tokens) names: the tokens after the command's
    name and ``{spelling: first spelling}`` of its options that take one value (not repeatable)."""
    import typer.main

    # duck-typed: typer may ship its own click, whose classes are not the installed click's
    cmd, args = typer.main.get_command(app), list(path)
    while args and args[0] in (getattr(cmd, "commands", None) or {}):
        cmd = cmd.commands[args.pop(0)]
    single = {}
    for p in getattr(cmd, "params", []):
        if getattr(p, "param_type_name", "") == "option" and not p.multiple and not getattr(p, "count", False):
            for name in (*p.opts, *p.secondary_opts):
                single[name] = p.opts[0]
    return args, single


def refuse_repeated_options(argv: list[str]) -> None:
    """Refuse an option that takes one value given twice (``--rounds 5 --rounds 50``): click keeps
    the last without a word, so one of the two would be accepted and ignored.

    Raises:
        InputError: naming the option.
    """
    args, single = single_value_options(argv)
    seen: set[str] = set()
    for tok in args:
        if tok == "--":
            break
        name = single.get(tok.split("=", 1)[0])
        if name is None:
            continue
        if name in seen:
            raise InputError(f"{tok.split('=', 1)[0]}: given twice (it takes one value; give it once)")
        seen.add(name)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``abps``).

    Exit codes: 0 success; 2 bad input or usage (one ``error: ...`` line on stderr, no
    traceback); 130 interrupted (Ctrl-C); 143 terminated (SIGTERM); 129 hung up (SIGHUP). Outputs are written through
    temporary paths, so an interrupted command leaves earlier outputs intact.
    """
    import warnings

    _received["signal"], _received["at"] = None, None
    formatwarning, warnings.formatwarning = warnings.formatwarning, _warning_line
    previous = {sig: signal.getsignal(sig) for sig in _HANDLED}
    signal.signal(signal.SIGTERM, _on_sigterm)
    if previous[signal.SIGINT] is signal.default_int_handler:  # an ignored SIGINT stays ignored
        signal.signal(signal.SIGINT, _on_sigint)
    if previous.get(signal.SIGHUP) is signal.SIG_DFL:  # `nohup abps ...` keeps SIGHUP ignored
        signal.signal(signal.SIGHUP, _on_sigterm)
    try:
        _register()  # the command modules' imports (a second or more): a Ctrl-C here exits 130 too
        refuse_repeated_options(sys.argv[1:] if argv is None else list(argv))
        with _signal_watcher():
            rv = app(args=argv, standalone_mode=False)
    except BaseException as exc:
        if _received["signal"] is not None or isinstance(exc, KeyboardInterrupt):
            _exit_interrupted()
        if isinstance(exc, Exception):
            _report(exc)
        raise
    finally:
        warnings.formatwarning = formatwarning
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if _received["signal"] is not None or rv == 130:  # click turns an interrupt into the return value 130
        _exit_interrupted()
    if isinstance(rv, int) and rv != 0:
        sys.exit(rv)


def _report(exc: Exception) -> None:
    """Exit 2 with one ``error:`` line for bad input or a usage error (typer's click, pydantic,
    MLflow); return for anything else (the caller re-raises it)."""
    from pydantic import ValidationError
    from typer._click.exceptions import ClickException, NoArgsIsHelpError

    if isinstance(exc, InputError):
        print(f"error: {_first_line(exc)}", file=sys.stderr)
        sys.exit(2)
    if isinstance(exc, typer.Exit):
        sys.exit(exc.exit_code)
    if isinstance(exc, NoArgsIsHelpError):
        exc.show()
        sys.exit(2)
    if isinstance(exc, ClickException):
        print(f"error: {_first_line(exc.format_message())}", file=sys.stderr)
        sys.exit(2)
    if isinstance(exc, ValidationError):
        from federation.core.config import first_error

        loc, msg = first_error(exc)
        print(f"error: invalid config {loc}: {msg}" if loc else f"error: invalid config: {msg}", file=sys.stderr)
        sys.exit(2)
    if type(exc).__module__.startswith("mlflow"):
        print(f"error: MLflow: {_mlflow_line(exc)}", file=sys.stderr)
        sys.exit(2)
    line = _path_error_line(exc)
    if line is not None:
        print(f"error: {line}", file=sys.stderr)
        sys.exit(2)


#: errno values of a path the user gave or the machine's state, not of a fault in abps: named in
#: one line (the file and the system's words) wherever a command meets them
_PATH_ERRNOS = frozenset(getattr(errno, n) for n in ("ENAMETOOLONG", "ELOOP", "ENOTDIR", "EISDIR", "EACCES",
                                                       "EPERM", "EROFS", "ENOSPC", "EDQUOT") if hasattr(errno, n))


def _path_error_line(exc: BaseException) -> str | None:
    """``FILE: reason`` for an error of a path (too long a name, a symbolic link loop, no
    permission, a full or read-only disk), else None. pathlib reports a link loop it meets while
    resolving as ``RuntimeError('Symlink loop from ...')``."""
    if isinstance(exc, OSError) and exc.errno in _PATH_ERRNOS:
        where = exc.filename if exc.filename is not None else "a file"
        return f"{where}: {(exc.strerror or os.strerror(exc.errno)).lower()}"
    if type(exc) is RuntimeError and str(exc).startswith("Symlink loop from "):
        return f"{str(exc).removeprefix('Symlink loop from ').strip(chr(39))}: a loop of symbolic links"
    return None

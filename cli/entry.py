"""The ``abps`` console script and ``python -m cli``.

Loading the command line (typer, rich, pydantic: about a tenth of a second) happens before
:func:`cli.app.main` installs its signal handlers; a Ctrl-C (SIGINT) or a SIGTERM in that time
exits 130 or 143 with the same one line as later, not Python's traceback or a silent death. Only
the interpreter's own start-up (tens of milliseconds, before any of this project's code runs) is
outside it.
"""

from __future__ import annotations

import signal
import sys


class _Terminated(BaseException):
    """A SIGTERM while the command line loads."""


def _on_sigterm(signum, frame) -> None:  # noqa: ARG001
    raise _Terminated


def main() -> None:
    """Load :mod:`cli.app` and run its ``main`` (exit codes: :func:`cli.app.main`).

    The objects alive after the imports, and again when the command ends, are moved out of the
    garbage collector's reach (``gc.freeze``): they live until the process exits, so the
    collections during the command and the interpreter's last one at the exit need not walk them
    (0.15-0.2 s less at the end of an ``abps etl``; docs/decisions.md). Only this process entry
    does it, never a library call.

    Once the command has returned, SIGINT and SIGTERM are ignored until the process exits: its exit
    code stands. A Ctrl-C that lands between the command's end and that point exits 130 with the
    same one line as during the command.
    """
    import gc

    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        from cli.app import main as run
    except (KeyboardInterrupt, _Terminated) as exc:
        print("error: interrupted", file=sys.stderr)
        sys.exit(143 if isinstance(exc, _Terminated) else 130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    gc.freeze()
    try:
        run()
    except KeyboardInterrupt:  # a Ctrl-C after cli.app.main put Python's own handler back
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        # the exit code is decided and the outputs are committed or removed: a signal in the
        # interpreter's last moments (thread joins, the last collection) is ignored rather than
        # ending the process by the signal, with no line, after a command that succeeded
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        gc.freeze()

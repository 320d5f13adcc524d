"""The ``abps`` console script and ``python -m cli``.

Loading the command line (typer, rich, pydantic: about a tenth of a second) happens before
:func:`cli.app.main` installs its signal handlers; a Ctrl-C in that time exits 130 with the same
one line as later, not Python's traceback. Only the interpreter's own start-up (tens of
milliseconds, before any of this project's code runs) is outside it.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Load :mod:`cli.app` and run its ``main`` (exit codes: :func:`cli.app.main`)."""
    try:
        from cli.app import main as run
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    run()

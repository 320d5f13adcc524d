"""The `abps` typer application.

Each sub-command lives in its own module under ``cli/`` and registers itself here.
``main`` turns an :class:`etl.errors.InputError` (or a pydantic validation error)
into one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys

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


def _register() -> None:
    """Import the command modules; each adds its commands to ``app`` / ``synth_app``."""
    import importlib

    for name in ("cli.etl_cmd", "cli.synth_cmd", "cli.synth_fedprox_cmd", "cli.train_cmd"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a command module not written yet
            if exc.name != name:
                raise


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``abps``)."""
    _register()
    try:
        app(args=argv, standalone_mode=False)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:  # pydantic / click usage errors
        from click.exceptions import Abort, ClickException, Exit
        from pydantic import ValidationError

        if isinstance(exc, Exit):
            sys.exit(exc.exit_code)
        if isinstance(exc, Abort):
            print("error: aborted", file=sys.stderr)
            sys.exit(1)
        if isinstance(exc, ClickException):
            exc.show()
            sys.exit(2)
        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first.get("loc", ()))
            print(f"error: invalid config {loc}: {first.get('msg')}", file=sys.stderr)
            sys.exit(2)
        raise

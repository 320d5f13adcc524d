"""A progress bar for the long steps of ``abps etl`` and ``abps synth mimic`` (rich, on stderr).

The CLI opens one bar with :func:`bar`; the library marks its steps with :func:`step`, which does
nothing when no bar is open (library use, tests) or stderr is not a terminal (logs stay clean).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_active: list = []  # [(Progress, task id)] while a bar is open


@contextlib.contextmanager
def bar(title: str, total: int) -> Iterator[None]:
    """Show a bar of ``total`` steps titled ``title`` for the block (only on a terminal)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        yield
        return
    p = Progress(TextColumn(title), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                 TimeElapsedColumn(), console=console, transient=True)
    with p:
        _active.append((p, p.add_task("", total=total)))
        try:
            yield
        finally:
            _active.pop()


def step(description: str, advance: int = 1) -> None:
    """Advance the open bar by ``advance`` steps and show ``description`` (what runs now)."""
    if _active:
        p, task = _active[-1]
        p.update(task, advance=advance, description=description)


def total(n: int) -> None:
    """Set the open bar's number of steps (when it is known only once the work starts)."""
    if _active:
        p, task = _active[-1]
        p.update(task, total=n)

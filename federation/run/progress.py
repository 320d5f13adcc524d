"""The progress display of a run on the terminal: one bar over its units (seeds, or a benchmark's
(seed, selector) runs) and one over the current unit's rounds."""

from __future__ import annotations

__all__ = ["RoundProgress"]


class RoundProgress:
    """A rich progress display of ``n_units`` units of ``total_rounds`` rounds each; does nothing
    when ``enabled`` is false. Used as a context manager around the run."""

    def __init__(self, enabled: bool, total_rounds: int, n_units: int, label: str, unit: str = "seeds") -> None:
        self.enabled, self.total_rounds, self.n_units, self.label, self.unit = enabled, total_rounds, n_units, label, unit
        self._p = None

    def __enter__(self) -> RoundProgress:
        if self.enabled:
            from rich.markup import escape
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                               TextColumn("{task.fields[info]}"), TimeElapsedColumn(), transient=False)
            self._p.__enter__()
            self._units = self._p.add_task(escape(f"{self.label} {self.unit}"), total=self.n_units, info="")
            self._rounds = self._p.add_task("rounds", total=self.total_rounds, info="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self._p.__exit__(None, None, None)

    def start_unit(self, name: str, total_rounds: int | None = None) -> None:
        """A new unit (``"seed 11"``, ``"seed 0 SAGE-OS"``) of ``total_rounds`` rounds (default the
        display's): its round bar starts at 0."""
        if self._p is not None:
            from rich.markup import escape

            total = self.total_rounds if total_rounds is None else total_rounds
            self._p.reset(self._rounds, total=total, description=escape(f"{name} rounds"), info="")

    def advance(self, info: str = "") -> None:
        """One round done; ``info`` (e.g. the validation AUROC so far) is shown beside the bar."""
        if self._p is not None:
            self._p.update(self._rounds, advance=1, info=info)

    def completed(self, rounds: int) -> None:
        """Show ``rounds`` rounds of the current unit done (a resumed run, or the end of a unit)."""
        if self._p is not None:
            self._p.update(self._rounds, completed=rounds)

    def end_unit(self) -> None:
        if self._p is not None:
            self._p.update(self._units, advance=1)

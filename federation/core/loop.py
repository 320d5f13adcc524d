"""The one loop driver: every round / tick loop of the project runs here.

Design notes: docs/runtime.md, "Module notes".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Row = dict[str, float]
StepHook = Callable[[int], "Row | None"]
EvalHook = Callable[[int], Row]
RecordHook = Callable[[int, Row], None]
StopHook = Callable[[int, Row], bool]
AfterHook = Callable[[int], None]


@dataclass(frozen=True)
class EvalSchedule:
    """When the driver evaluates.

    Attributes:
        every: evaluate at every ``every``-th time point (``tau % every == 0``), >= 1.
        at_start: also evaluate at ``tau = 0``, before the first step (the initial models).

    The last time point ``tau = n`` is always evaluated.

    Raises:
        ValueError: ``every < 1``.
    """

    every: int = 1
    at_start: bool = False

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"EvalSchedule.every must be >= 1, got {self.every}")

    def due(self, tau: int, n_steps: int) -> bool:
        """Whether time point ``tau`` of a run of ``n_steps`` steps is evaluated."""
        if tau == 0:
            return self.at_start
        return tau % self.every == 0 or tau == n_steps


@dataclass
class LoopOutcome:
    """What :func:`drive` returns.

    Attributes:
        steps_run: steps completed (``n_steps`` unless ``stop`` ended the run earlier).
        records: ``(tau, row)`` for every recorded time point, in order.
    """

    steps_run: int
    records: list[tuple[int, Row]] = field(default_factory=list)


def drive(n_steps: int, step: StepHook, evaluate: EvalHook, schedule: EvalSchedule = EvalSchedule(),
          on_record: RecordHook | None = None, stop: StopHook | None = None, start: int = 0,
          records: list[tuple[int, Row]] | None = None, after: AfterHook | None = None) -> LoopOutcome:
    """Run ``n_steps`` steps with evaluations, records and an optional stop rule (module docstring).

    Args:
        n_steps: rounds or ticks to run, >= 0.
        step: ``step(t) -> row | None``, advances the state by step ``t`` (0-based); the row
            (e.g. the round's bytes) is recorded at time point ``t + 1``.
        evaluate: ``evaluate(tau) -> row``, metrics of the state at time point ``tau``.
        schedule: when to evaluate.
        on_record: ``on_record(tau, row)`` for every recorded row (MLflow, progress bars); it may
            add entries to ``row`` (e.g. wall time), which the outcome then holds too.
        stop: ``stop(tau, row) -> bool`` after each recorded row; True ends the run there.
        start: resume at time point ``start`` (0 <= start <= n_steps): the state is the one after
            steps ``0 .. start - 1`` and time point ``start`` was evaluated, recorded and not
            stopped at in the earlier run, so the driver goes on with ``step(start)``.
        records: the earlier run's records up to ``start`` (the outcome's records begin with them).
        after: ``after(tau)`` once the run goes on past time point ``tau`` (after its record and
            stop rule, before ``step(tau)``; not at a resumed ``start``): where a round
            checkpoint is written (federation/run/checkpoint.py).

    Returns:
        :class:`LoopOutcome`.

    Raises:
        ValueError: ``n_steps < 0``, or ``start`` outside ``0 .. n_steps``.
    """
    if n_steps < 0:
        raise ValueError(f"n_steps must be >= 0, got {n_steps}")
    if not 0 <= start <= n_steps:
        raise ValueError(f"start must be in 0 .. {n_steps}, got {start}")
    out = LoopOutcome(steps_run=start, records=list(records or []))
    row: Row = {}
    for tau in range(start, n_steps + 1):
        if tau > start or start == 0:
            if schedule.due(tau, n_steps):
                row.update(evaluate(tau))
            if row:
                out.records.append((tau, row))
                if on_record is not None:
                    on_record(tau, row)
                if stop is not None and stop(tau, row):
                    break
            if tau < n_steps and after is not None:
                after(tau)
        if tau == n_steps:
            break
        row = dict(step(tau) or {})
        out.steps_run = tau + 1
    return out

"""Prediction tasks of ``abps etl --task``: which outcome fills the cohort's ``label`` column (one SQL
concept per task and source, swapped in by :func:`relabel`). Definitions: docs/tasks.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from etl.errors import InputError
from etl.sql import concept_sql

DEFAULT_TASK = "in-hospital-mortality"


@dataclass(frozen=True)
class Task:
    """One ``--task``.

    Attributes:
        name: the ``--task`` value.
        description: plain-words outcome (reports, docs).
        concept: the concept file name under ``etl/sql/<source>/`` (None: the stays concept's label).
        slots: numbers filled into the concept's slots (e.g. ``days``).
        columns: source -> table -> extra required columns of that table.
        types: source -> DuckDB types of those columns.
    """

    name: str
    description: str
    concept: str | None = None
    slots: dict = field(default_factory=dict)
    columns: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    types: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def sources(self) -> tuple[str, ...] | None:
        """The sources defining this task (None: every source, the default task)."""
        return tuple(self.columns) if self.concept else None


def _los(days: int) -> Task:
    return Task(f"los-{days}", f"ICU length of stay > {days} days", "task_los", {"days": days},
                columns={"mimic": {"icustays": ("los",)}, "eicu": {"patient": ("unitdischargeoffset",)}},
                types={"mimic": {"los": "DOUBLE"}, "eicu": {"unitdischargeoffset": "BIGINT"}})


TASKS: dict[str, Task] = {t.name: t for t in (
    Task(DEFAULT_TASK, "death before hospital discharge"),
    Task("icu-mortality", "death before ICU discharge", "task_icu_mortality",
         columns={"mimic": {"icustays": ("outtime",), "admissions": ("deathtime",), "patients": ("dod",)},
                  "eicu": {"patient": ("unitdischargestatus",)}},
         types={"mimic": {"outtime": "TIMESTAMP", "deathtime": "TIMESTAMP", "dod": "DATE"}, "eicu": {}}),
    _los(3),
    _los(7),
    Task("decompensation", "death within 24 h after the first 24 h in the ICU (alive and in the ICU at 24 h)",
         "task_decompensation", {"at_hours": 24, "horizon_hours": 24},
         columns={"mimic": {"icustays": ("outtime",), "admissions": ("deathtime",)},
                  "eicu": {"patient": ("unitdischargestatus", "unitdischargeoffset", "hospitaldischargeoffset")}},
         types={"mimic": {"outtime": "TIMESTAMP", "deathtime": "TIMESTAMP"},
                "eicu": {"unitdischargeoffset": "BIGINT", "hospitaldischargeoffset": "BIGINT"}}),
)}


def get_task(name: str, source: str) -> Task:
    """The task ``name`` for ``source``.

    Raises:
        InputError: unknown task, or a task the source does not define (named in the message).
    """
    if name not in TASKS:
        raise InputError(f"unknown --task '{name}' (choose from {', '.join(TASKS)})")
    task = TASKS[name]
    if task.sources is not None and source not in task.sources:
        raise InputError(f"--task {name} is not defined for --source {source} "
                         f"(defined for: {', '.join(task.sources)}); leave --task out")
    return task


def required_columns(task: str, source: str, table: str) -> tuple[str, ...]:
    """Extra columns ``table`` of ``source`` must have for ``task`` (empty for the default)."""
    return TASKS[task].columns.get(source, {}).get(table, ())


def column_types(task: str, source: str) -> dict[str, str]:
    """DuckDB types of the task's extra columns (only read when the task is asked for)."""
    return TASKS[task].types.get(source, {})


def relabel(con: duckdb.DuckDBPyConnection, source: str, task: str, scans: dict[str, str]) -> None:
    """Replace ``label`` of the temp table ``all_stays`` by the task's label (no-op by default).

    Args:
        scans: table name -> table expression (the source's checked scans; the concept picks
            the ones its header names).

    A stay the concept has no row for, or whose label it leaves NULL, gets a NULL label (then
    dropped by the source's "known label" filter, counted in the attrition table).
    """
    spec = TASKS[task]
    if spec.concept is None:
        return
    sql = concept_sql(source, spec.concept, **scans, **spec.slots)
    con.execute("CREATE OR REPLACE TEMP TABLE all_stays AS SELECT s.* REPLACE (CAST(t.label AS TINYINT) AS label) "
                f"FROM all_stays s LEFT JOIN ({sql}) t ON t.stay_id = s.stay_id")

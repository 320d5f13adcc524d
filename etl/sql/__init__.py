"""The ETL's clinical concepts as SQL files: ``etl/sql/<source>/<concept>.sql``.

One concept per file (the mimic-code layout), each with a header comment citing its source
(mimic-code concept, eICU-CRD documentation, the ABPS paper section) and naming its ``${...}``
slots. ``etl/sql/charlson.sql`` is shared by both sources. docs/etl.md lists every file.
"""

from __future__ import annotations

import string
from importlib import resources


def concept_sql(source: str, concept: str, **slots: str | float | int) -> str:
    """The text of ``etl/sql/<source>/<concept>.sql`` with its ``${name}`` slots filled.

    Args:
        source: ``mimic``, ``eicu``, or ``""`` for a concept shared by both (``charlson``).
        concept: file name without ``.sql``.
        slots: program-made SQL fragments (table expressions, VALUES rows, numbers); never
            user text.

    Raises:
        KeyError: a slot of the file is not given (a programming error).
        FileNotFoundError: no such concept file.
    """
    base = resources.files(__name__)
    path = base.joinpath(source, f"{concept}.sql") if source else base.joinpath(f"{concept}.sql")
    text = path.read_text(encoding="utf-8")
    return string.Template(text).substitute({k: str(v) for k, v in slots.items()})

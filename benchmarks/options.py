"""The option parser every benchmark's ``main`` starts from."""

from __future__ import annotations

import argparse
from typing import Any


def parser(doc: str, **defaults: Any) -> argparse.ArgumentParser:
    """An option parser described by the first line of ``doc``, with ``--out`` (the JSON file to
    write, default none) and one option per keyword: ``flower_rounds=4`` is ``--flower-rounds``,
    typed as its default (int 4)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    for key, default in defaults.items():
        ap.add_argument(f"--{key.replace('_', '-')}", type=type(default), default=default)
    ap.add_argument("--out", default=None)
    return ap

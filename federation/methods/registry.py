"""Method registry: name -> class, used by ``abps train --method NAME``.

Other packages add methods with ``register_method("abps", AbpsMethod)``; the modules listed
in :data:`PLUGINS` are imported on the first :func:`get_method` call so their methods appear
in ``abps train --method``.
"""

from __future__ import annotations

from etl.errors import InputError
from federation.methods.base import Method

METHODS: dict[str, type[Method]] = {}


def register_method(name: str, cls: type[Method]) -> type[Method]:
    """Register ``cls`` under ``name`` (lower-cased). Raises ValueError if the name is taken
    by another class."""
    key = name.lower()
    if key in METHODS and METHODS[key] is not cls:
        raise ValueError(f"method name {key!r} already registered")
    METHODS[key] = cls
    return cls


def get_method(name: str) -> type[Method]:
    """The class registered under ``name``; InputError listing the known names otherwise."""
    _load_plugins()
    key = name.lower()
    if key not in METHODS:
        raise InputError(f"unknown --method {name!r}; known: {', '.join(sorted(METHODS))}")
    return METHODS[key]


#: Modules that register methods when imported (loaded on the first lookup, if present).
PLUGINS: tuple[str, ...] = ("abps.methods", "federation.methods.decentralized", "federation.methods.bnn")


def _load_plugins() -> None:
    """Import the :data:`PLUGINS` modules that exist; each registers its methods on import."""
    import importlib

    for mod in PLUGINS:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name is None or not mod.startswith(exc.name):
                raise

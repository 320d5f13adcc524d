"""The registry: the one list of methods (``abps train --method``) and of peer selectors (SAGE).

Methods register with :func:`register` (Table 1 row name, Figure 3 family, row order); the ABPS
methods are entry-point plugins (:data:`PLUGIN_GROUP`) loaded on the first lookup. Selectors
register with :func:`register_selector`, in the SAGE paper's table order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, TypeVar, overload

from etl.errors import InputError
from federation.methods.base import Method

METHODS: dict[str, type[Method]] = {}

#: Figure 3 colour families (ABPS paper Fig. 3 caption: blue star FL, green decentralized, orange
#: ABPS+P/Q, red ABPS-X, purple goal-aware, olive local-only; grey the centralized reference).
FAMILIES: tuple[str, ...] = ("star", "decentralized", "abps", "abps-x", "goal", "local", "centralized", "other")

M = TypeVar("M", bound=type[Method])


@overload
def register(cls: M) -> M: ...
@overload
def register(*, display_name: str | None = None, family: str | None = None,
             paper_order: int | None = None) -> Callable[[M], M]: ...
def register(cls: M | None = None, *, display_name: str | None = None, family: str | None = None,
             paper_order: int | None = None) -> M | Callable[[M], M]:
    """Class decorator: register a :class:`Method` subclass under its own ``name`` (lower-cased).

    ``@register`` uses the class attributes as they are; ``@register(display_name=...,
    family=..., paper_order=...)`` sets them first (a subclass must name its own row: nothing
    is inherited from a registered parent except what the decorator leaves unset).

    Raises:
        ValueError: the class does not define ``name`` itself, the name is taken by another
            class, ``family`` is not one of :data:`FAMILIES`, or ``paper_order`` is taken.
    """

    def deco(c: M) -> M:
        if "name" not in vars(c):
            raise ValueError(f"{c.__qualname__}: a registered method defines its own `name`")
        # given here, else the class's own attribute, never a registered parent's: a subclass is a new row
        for attr, value, default in (("display_name", display_name, c.name), ("family", family, "other"),
                                     ("paper_order", paper_order, None)):
            if value is not None:
                setattr(c, attr, value)
            elif attr not in vars(c):
                setattr(c, attr, default)
        if c.family not in FAMILIES:
            raise ValueError(f"{c.name}: family {c.family!r} is not one of {', '.join(FAMILIES)}")
        key = c.name.lower()
        if key in METHODS and METHODS[key] is not c:
            raise ValueError(f"method name {key!r} already registered")
        if c.paper_order is not None and any(o.paper_order == c.paper_order for o in METHODS.values() if o is not c):
            raise ValueError(f"{c.name}: paper_order {c.paper_order} already taken")
        METHODS[key] = c
        return c

    return deco(cls) if cls is not None else deco


def get_method(name: str) -> type[Method]:
    """The class registered under ``name`` (case-insensitive); InputError listing the known names otherwise."""
    key = name.lower()
    if key not in all_methods():
        raise InputError(f"unknown --method {name!r}; known: {', '.join(method_names())}")
    return METHODS[key]


def all_methods() -> dict[str, type[Method]]:
    """Every registered method (plugins loaded), name -> class."""
    _load_plugins()
    return METHODS


def _sort_key(cls: type[Method]) -> tuple[int, int, str]:
    return (cls.paper_order is None, cls.paper_order or 0, cls.name)


def method_names() -> list[str]:
    """Registered names in the ABPS paper's Table 1 order, then the others by name."""
    return [c.name for c in sorted(all_methods().values(), key=_sort_key)]


def paper_order() -> tuple[str, ...]:
    """Table 1 row order (names of the methods with a ``paper_order``; centralized last)."""
    return tuple(c.name for c in sorted(all_methods().values(), key=_sort_key) if c.paper_order is not None)


def display_names() -> dict[str, str]:
    """name -> Table 1 row name."""
    return {k: c.display_name for k, c in all_methods().items()}


def families() -> dict[str, str]:
    """name -> Figure 3 colour family."""
    return {k: c.family for k, c in all_methods().items()}


#: Entry-point group of method plugins (pyproject.toml ``[project.entry-points."abps.methods"]``).
PLUGIN_GROUP = "abps.methods"
_plugins_loaded = False


def run_label(method: str, params: Mapping[str, object] | None = None) -> str:
    """The name of a run's row everywhere (console, ``abps runs``, MLflow run names, report): the
    method, plus every method parameter the run sets to a value its preset does not have, the goal
    first: ``--method abps --goal diversity`` reads ``abps [goal=diversity]`` (distinct from the
    goal-aware preset ``abps-div``) and ``--param kappa=1`` reads ``abps [kappa=1]``, never the
    kappa = 3 row. ``params`` maps parameter names to values (or to MLflow's text of them); a
    method this build does not know keeps only its goal in the label."""
    given = {k: v for k, v in (params or {}).items() if v is not None}
    try:
        cls = get_method(method)
        defaults = cls.Params(**(cls.default_config.get("params") or {})).model_dump(mode="json")
    except Exception:  # unknown method or a preset this build cannot resolve
        defaults = None
    if defaults is None:
        goal = _text(given.get("goal", "none"))
        return method if goal in ("none", "") else f"{method} [goal={goal}]"
    differ = [f"{k}={_text(v)}" for k, v in sorted(given.items(), key=lambda kv: (kv[0] != "goal", kv[0]))
              if _text(defaults.get(k)) != _text(v)]
    return f"{method} [{', '.join(differ)}]" if differ else method


def given_params(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters ``params`` sets, each as the method's parameter model reads it (``kappa: 2``
    and ``kappa: 2.0`` are one value, as in a sweep cell's resolved config), so that one
    configuration has one label and one config hash. Unchanged when they do not validate (the
    run's own check names the bad one)."""
    try:
        cls = get_method(method)
        read = cls.Params(**params).model_dump()
    except Exception:  # noqa: BLE001 - refused with its own message by check_method_params
        return dict(params)
    # an infinite float keeps its given spelling ("inf"): JSON has no infinity
    return {k: v if isinstance(read.get(k), float) and not math.isfinite(read[k]) else read.get(k, v)
            for k, v in params.items()}


def _text(value: object) -> str:
    """A parameter value as compared in :func:`run_label`: MLflow's text of it, lower case
    (``True`` and ``"true"``, ``None`` and ``"none"`` are one value)."""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str).lower()
    return str(value).strip().lower()


def _load_plugins() -> None:
    """Load every method plugin of :data:`PLUGIN_GROUP` once; each registers its methods on import.

    Raises:
        InputError: no plugin is declared, i.e. the package is not installed (``make install``).
    """
    global _plugins_loaded
    if _plugins_loaded:
        return
    eps = entry_points(group=PLUGIN_GROUP)
    if not eps:
        raise InputError(f"no method plugins found in entry-point group {PLUGIN_GROUP!r}: install the package "
                         "(make install, or pip install -e .)")
    for ep in eps:
        ep.load()
    _plugins_loaded = True


def goal_preset(goal: str) -> str:
    """The registered goal-aware ABPS preset of ``goal`` (family ``goal``: ABPS+P+Q+kappa=1 with the
    goal's filter, ABPS paper Sec. 6.5), e.g. ``diversity -> abps-div``.

    Raises:
        InputError: no registered preset has that goal (the message lists the goals).
    """
    presets = {str(c.default_config.get("params", {}).get("goal")): name
               for name, c in all_methods().items() if c.family == "goal"}
    g = goal.strip().lower()
    if g not in presets:
        raise InputError(f"--goal {goal!r}: choose one of {', '.join(sorted(presets))}")
    return presets[g]


# --- peer selectors ------------------------------------------------------------------------------

#: selector identifier -> class (:class:`federation.methods.selectors.Selector`), in registration
#: order = the SAGE paper's table order (LOCAL, RG, PENS, PFedDST, AQ-128, SAGE-NF, Vanilla SAGE, SAGE-OS).
SELECTORS: dict[str, Any] = {}

S = TypeVar("S", bound=type)


def register_selector(cls: S) -> S:
    """Class decorator: register a selector class under its ``name``; it is also found by its
    ``display`` name and its ``aliases`` (case-insensitive).

    Raises:
        ValueError: the name is taken by another class.
    """
    if cls.name in SELECTORS and SELECTORS[cls.name] is not cls:
        raise ValueError(f"selector name {cls.name!r} already registered")
    SELECTORS[cls.name] = cls
    return cls


def canonical_selector(name: str) -> str:
    """The identifier of a selector given by identifier, display name or alias ("AQ-128", "SAGE-OS",
    "os", "PFedDST" -> ``aq128``, ``sage_os``, ``sage_os``, ``pfeddst``).

    Raises:
        ValueError: unknown selector (the message lists the display names).
    """
    key = str(name).strip().lower()
    for ident, c in SELECTORS.items():
        if key == ident or key == c.display.lower() or key in c.aliases:
            return ident
    raise ValueError(f"unknown selector {name!r}; known: {', '.join(c.display for c in SELECTORS.values())}")


def get_selector(name: str) -> Any:
    """The selector class of ``name`` (identifier, display name or alias); ValueError if unknown."""
    return SELECTORS[canonical_selector(name)]


def selector_names() -> tuple[str, ...]:
    """Selector identifiers in the SAGE paper's table order."""
    return tuple(SELECTORS)


def selector_displays() -> tuple[str, ...]:
    """Selector display names (table labels) in the SAGE paper's table order."""
    return tuple(c.display for c in SELECTORS.values())

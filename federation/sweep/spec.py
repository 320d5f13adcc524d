"""The sweep file: :class:`SweepSpec` (methods, seeds, options, resources, executor) and
:func:`load_sweep`. See :mod:`federation.sweep` for the whole picture and docs/sweeps.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, StrictInt, field_validator, model_validator

from etl.errors import InputError
from federation.core.config import PATH_KEYS, NumbersNotFlags, first_error, from_folder, load_yaml, paths_from_file
from federation.core.limits import MAX_SEED, MAX_THREADS

__all__ = ["MethodEntry", "Resources", "SweepSpec", "load_sweep", "sweep_spec"]


class _Strict(NumbersNotFlags):
    # NumbersNotFlags: `rounds: true` / `workers: true` are refused, not read as 1
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class MethodEntry(_Strict):
    """One row of the sweep's ``methods:`` list.

    Attributes:
        method: registered method name (``abps train --method``).
        label: name of the row in MLflow and the report (default: the method name); two entries
            of the same method need different labels.
        config: optional YAML run config (``configs/<method>.yaml``), read relative to the
            sweep file's folder when not absolute.
        params: method parameters merged over the file's ``params:`` (e.g. ``{goal: diversity}``).
        overrides: any other run-config keys (``exchange``, ``engine``, ``early_stopping`` ...).
    """

    method: str
    label: str | None = None
    config: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    overrides: dict[str, Any] = Field(default_factory=dict)

    @field_validator("label")
    @classmethod
    def _named(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("an empty label (leave the key out to use the method name)")
        return v

    @property
    def name(self) -> str:
        """The label, or the lower-cased method name."""
        return self.label or self.method.strip().lower()


class Resources(_Strict):
    """Per-cell resources.

    Attributes:
        num_cpus: Ray ``num_cpus`` of each cell's task.
        threads: torch threads of each worker.
    """

    num_cpus: float = Field(1.0, gt=0.0, le=MAX_THREADS)
    threads: int = Field(1, ge=1, le=MAX_THREADS)


def check_seeds(v: list[int] | None) -> list[int] | None:
    """A seed list as every sweep file takes it: distinct integers from 0 to 2^63 - 1 (ValueError)."""
    if v is None:
        return v
    if len(set(v)) != len(v):
        raise ValueError("a seed is listed twice")
    if any(s < 0 or s > MAX_SEED for s in v):
        raise ValueError("seeds must be integers from 0 to 2^63 - 1")
    return v


class SweepSpec(_Strict):
    """A sweep file (see ``configs/table1.yaml``).

    Attributes:
        name: sweep name (parent run name; default experiment name).
        experiment: MLflow experiment (default: ``name``).
        cohort: cohort directory, relative to the sweep file (``--cohort`` overrides).
        seeds: run seeds (paper: 11 22 33 44 55).
        rounds: optional override of every cell's rounds (max rounds with early stopping).
        methods: method names or :class:`MethodEntry` mappings.
        options: dotted run-config key -> list of values; the sweep runs their cross product.
        resources: :class:`Resources`.
        checkpoints: folder of the cells' round checkpoints (default ``runs/<experiment>/checkpoints``,
            relative to the working folder; given in the file, relative to the file); on a Ray cluster a folder every node reads and writes.
        executor, workers, address: defaults of ``--executor``, ``--workers``, ``--address``
            (``executor`` was called ``engine`` before; the old key is refused with the new name,
            since ``engine`` is also the run config's model / optimizer section).
    """

    name: str = "sweep"
    experiment: str | None = None
    cohort: str | None = None
    seeds: list[StrictInt] = Field(default_factory=lambda: [11, 22, 33, 44, 55], min_length=1)
    rounds: int | None = Field(None, ge=1)
    methods: list[MethodEntry] = Field(min_length=1)
    options: dict[str, list[Any]] = Field(default_factory=dict)
    resources: Resources = Resources()
    checkpoints: str | None = None
    executor: Literal["local", "ray"] = "local"
    workers: int = Field(1, ge=1, le=MAX_THREADS)
    address: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, v: Any) -> Any:
        if isinstance(v, dict) and "engine" in v:
            raise ValueError("the sweep key `engine:` (local / ray) is now called `executor:`")
        return v

    @field_validator("methods", mode="before")
    @classmethod
    def _entries(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"method": e} if isinstance(e, str) else e for e in v]
        return v

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, v: list[int]) -> list[int]:
        return check_seeds(v)

    @field_validator("experiment", "name")
    @classmethod
    def _named(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("an empty name (leave the key out for the default)")
        return v

    @field_validator("checkpoints")
    @classmethod
    def _a_folder(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or Path(v).exists() and not Path(v).is_dir()):
            raise ValueError(f"{v!r} is not a folder")
        return v

    @field_validator("options")
    @classmethod
    def _non_empty(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for k, vals in v.items():
            if not vals:
                raise ValueError(f"option {k!r} has no values")
        return v


#: a sweep file's keys that hold a folder: a relative one is read from the file's folder, as its
#: entries' ``config:`` and a cross sweep's ``datasets:`` are
SWEEP_PATH_KEYS = (("cohort",), ("checkpoints",))


def run_paths_from_file(doc: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """``doc`` (a sweep file read from ``path``) with the run-config paths it sets
    (:data:`federation.core.config.PATH_KEYS`: an entry's ``overrides:``, an ``options:`` key's
    values) read from the file's folder, as a run config's own are. Nothing else changes; the
    lists and mappings on the way are copied."""
    out = dict(doc)
    if isinstance(out.get("methods"), list):
        out["methods"] = [{**e, "overrides": paths_from_file(e["overrides"], path, PATH_KEYS)}
                          if isinstance(e, dict) and isinstance(e.get("overrides"), dict) else e
                          for e in out["methods"]]
    if isinstance(out.get("options"), dict):
        out["options"] = {k: _option_paths(k, vals, path) for k, vals in out["options"].items()}
    return out


def _option_paths(key: str, values: Any, path: str | Path) -> Any:
    """The values of option ``key`` with the run-config paths they hold read from the folder of
    ``path``: a path itself (``realworld.availability.trace: [a.csv]``) or inside a whole section
    (``realworld: [{availability: {trace: a.csv}}]``)."""
    parts = tuple(key.split("."))
    below = [k[len(parts):] for k in PATH_KEYS if k[:len(parts)] == parts]
    if not below or not isinstance(values, list):
        return values
    if () in below:
        base = Path(path).resolve().parent
        return [str(from_folder(v, base)) if isinstance(v, str) and v.strip() else v for v in values]
    return [paths_from_file(v, path, tuple(below)) if isinstance(v, dict) else v for v in values]


def load_sweep(path: str | Path) -> tuple[SweepSpec, Path]:
    """Read and validate a sweep YAML. Returns (spec, folder of the file).

    Raises:
        InputError: missing file, bad YAML, or an invalid field (the message names the field).
    """
    doc = load_yaml(path)
    if "methods" not in doc and ("method" in doc or "benchmark" in doc):  # a run config, not a sweep
        raise InputError(f"{path}: a run config (it names `{'method' if 'method' in doc else 'benchmark'}:`, "
                         f"no `methods:`); run it with abps train --config {path}")
    if "engine" in doc and not isinstance(doc["engine"], dict):
        raise InputError(f"{path}: the sweep key `engine:` (local / ray) is now called `executor:`")
    return sweep_spec(doc, path), Path(path).resolve().parent


def sweep_spec(doc: dict[str, Any], path: str | Path) -> SweepSpec:
    """The validated :class:`SweepSpec` of ``doc`` read from the file ``path``: its paths read from
    the file's folder (:data:`SWEEP_PATH_KEYS`, :func:`run_paths_from_file`), its labels distinct.

    Raises:
        InputError: an invalid field or a label given twice, naming the file and the field.
    """
    from pydantic import ValidationError

    try:
        spec = SweepSpec.model_validate(paths_from_file(run_paths_from_file(doc, path), path, SWEEP_PATH_KEYS))
    except ValidationError as exc:
        loc, msg = first_error(exc)
        raise InputError(f"{path}: invalid sweep field {loc}: {msg}" if loc else f"{path}: {msg}") from None
    labels = [e.name for e in spec.methods]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise InputError(f"{path}: methods: label {dup[0]!r} appears twice (give entries distinct `label:`)")
    return spec

"""Run configuration (pydantic): engine, exchange transforms, early stopping, method params.

A run config is assembled from three layers, later ones overriding earlier ones:
the defaults below, the method class's ``default_config`` (e.g. FedAvg-X turns on a 2-layer
head, bf16 and momentum), and a YAML file (``configs/<method>.yaml`` or ``--config``); the
CLI's ``--rounds`` overrides last. Unknown keys are errors (``extra="forbid"``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import typing
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from etl.errors import InputError
from federation.core.checks import count_non_finite


class NumbersNotFlags(BaseModel):
    """Base of the config models: a YAML true / false where a number goes is refused."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_flag_for_a_number(cls, v: Any, info: Any) -> Any:
        """``rounds: true`` is refused: pydantic would read a YAML true / false where a number goes
        as 1 / 0, a value nobody wrote."""
        if isinstance(v, bool) and info.field_name in cls.model_fields:
            ann = cls.model_fields[info.field_name].annotation
            kinds = set(typing.get_args(ann)) or {ann}
            if bool not in kinds and kinds & {int, float}:
                raise ValueError("a number, not true / false")
        return v


class _Strict(NumbersNotFlags):
    # allow_inf_nan=False: a NaN or infinite number in a config (lr: .inf) is refused up front
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


_Width = Annotated[int, Field(ge=1)]
_Beta = Annotated[float, Field(ge=0.0, lt=1.0)]


class EngineConfig(_Strict):
    """Local model and optimizer (ABPS paper Sec. 6.3 defaults).

    Attributes:
        hidden: widths of the MLP's two hidden layers.
        dropout: dropout probability after each hidden layer (training only).
        lr: Adam learning rate.
        weight_decay: Adam weight decay.
        betas: Adam (beta1, beta2).
        eps: Adam epsilon.
        batch_size: rows per local mini-batch.
        local_epochs: passes over each center's train split per round.
        reset_optimizer_each_round: a fresh Adam state every round (the Flower peer benchmark's
            workload) instead of one kept across rounds.
    """

    hidden: tuple[_Width, _Width] = (128, 64)
    dropout: float = Field(0.2, ge=0.0, lt=1.0)
    lr: float = Field(1e-3, gt=0.0)
    weight_decay: float = Field(1e-5, ge=0.0)
    betas: tuple[_Beta, _Beta] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0.0)
    batch_size: int = Field(128, ge=1)
    local_epochs: int = Field(2, ge=1)
    reset_optimizer_each_round: bool = False


class ExchangeConfig(_Strict):
    """Transforms around the mixing product (ABPS paper Sec. 6.4).

    ``head_layers``: 0 = exchange every layer; 1 = last layer personalized (kept local);
    2 = last two layers personalized. ``bf16_wire``: values received from peers are rounded
    to bfloat16. ``server_momentum``: EMA momentum beta on the exchanged block (0 = off;
    see :func:`federation.engine.mixing.apply_momentum`). ``variance_correction``: rescale each mixed
    layer to the mean variance of its inputs (Tian et al. 2024, Algorithm 3;
    :func:`federation.core.variance.variance_correct`).
    """

    head_layers: Literal[0, 1, 2] = 0
    bf16_wire: bool = False
    server_momentum: float = Field(0.0, ge=0.0, lt=1.0)
    variance_correction: bool = False


class EarlyStoppingConfig(_Strict):
    """Validation-AUROC early stopping: stop after ``patience`` rounds without a new best
    mean val AUROC, at most ``max_rounds`` rounds, restore the best round's parameters.
    ``enabled``: on or off (off: exactly ``rounds`` rounds)."""

    enabled: bool = False
    patience: int = Field(10, ge=1)
    max_rounds: int = Field(100, ge=1)


PREPROCESSING_MODES: tuple[str, ...] = ("auto", "per-center", "federated", "shrinkage", "pooled")
"""Numeric feature encodings of :class:`DataConfig` (see federation/data/tensors.py)."""


class EvaluationConfig(_Strict):
    """When a mean across centers is a headline: at least ``min_centers`` centers and
    ``min_center_share`` of them (rounded up), but never more than half of the federation (rounded
    up), must be evaluable (AUROC: both classes in the center's test split). Below that the run's
    mean AUROC is undefined (NaN, shown as "undefined (k of n centers)"); the per-center figures
    stay."""

    min_centers: int = Field(5, ge=1)
    min_center_share: float = Field(0.1, ge=0.0, le=1.0)

    def required(self, n_centers: int) -> int:
        """Evaluable centers a mean over ``n_centers`` needs: ``min(ceil(n / 2), max(min_centers,
        ceil(min_center_share * n)))``, at least 1."""
        wanted = max(self.min_centers, math.ceil(self.min_center_share * n_centers - 1e-9))
        return max(1, min(math.ceil(n_centers / 2), wanted))


class DataConfig(_Strict):
    """Numeric feature encoding (imputation value, mean, std) of the runtime (federation/data/tensors.py).

    ``preprocessing``:

    * ``per-center``: each center's own train-split median / mean / std (ABPS paper Sec. 6.1);
    * ``federated``: one federation-wide median / mean / std merged from per-center aggregates a
      real federation can share (row and value counts, sums, sums of squares, a fixed-range
      histogram as the mergeable quantile sketch); the bytes go into the ledger as metadata;
    * ``shrinkage``: per center and feature, ``lambda = n / (n + shrinkage_rows)`` of the center's
      own statistic plus ``1 - lambda`` of the federation's (same aggregates as ``federated``);
    * ``pooled``: exact statistics of the pooled train split (the Centralized reference only);
    * ``auto`` (default): ``per-center`` when the median center has at least
      ``min_center_rows`` train rows, else ``federated`` (docs/decisions.md).

    ``shrinkage_rows``: the rows at which a center's own statistic and the federation's weigh
    equally (``shrinkage``). ``histogram_bins``: bins of the mergeable quantile sketch.

    ``small_center``: what a ``per-center`` encoding does when a center has fewer than
    ``min_center_rows`` train rows: ``warn`` (a UserWarning naming how many) or ``refuse``
    (an InputError).
    """

    preprocessing: Literal["auto", "per-center", "federated", "shrinkage", "pooled"] = "auto"
    min_center_rows: int = Field(30, ge=1)
    shrinkage_rows: float = Field(50.0, gt=0.0)
    histogram_bins: int = Field(256, ge=8, le=65536)
    small_center: Literal["warn", "refuse"] = "warn"

    @model_validator(mode="after")
    def _used(self) -> DataConfig:
        # auto resolves to per-center or federated on the cohort, so it reads what either reads
        unused(self, "data", "preprocessing", {
            "auto": ("min_center_rows", "small_center", "histogram_bins"),
            "per-center": ("min_center_rows", "small_center"), "federated": ("histogram_bins",),
            "shrinkage": ("shrinkage_rows", "histogram_bins"), "pooled": ()})
        return self


class LabelFlipDrift(NumbersNotFlags):
    """The ``drift:`` block of a run config: chosen centers flip their labels from a round on
    (semantics in :mod:`federation.data.drift_scenario`).

    Attributes:
        round: first round (1-based) with flipped labels.
        centers: center_ids that flip (give this or ``count``).
        count: number of centers that flip: those with the most training rows, ties by center_id
            (give this or ``centers``).
        splits: which splits of those centers flip (some of train, val, test).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    round: int = Field(..., ge=1)
    centers: tuple[str, ...] = ()
    count: int = Field(0, ge=0)
    splits: tuple[str, ...] = ("train", "val")

    @model_validator(mode="after")
    def _one_choice(self) -> LabelFlipDrift:
        if bool(self.centers) == bool(self.count):
            raise ValueError("drift: give exactly one of `centers` (center_ids) or `count` (> 0)")
        bad = sorted(set(self.splits) - {"train", "val", "test"})
        if bad or not self.splits:
            raise ValueError(f"drift.splits: expected some of train, val, test, got {list(self.splits)}")
        return self


class Spread(_Strict):
    """A per-center quantity drawn once per run: ``low`` .. ``high``, uniform on a ``linear`` or
    ``log`` scale (``low == high``: every center gets that value). Used by
    :class:`ProfilesConfig` (federation/run/clock.py draws the values).

    Attributes:
        low: smallest value drawn (> 0).
        high: largest value drawn (>= low).
    """

    low: float = Field(..., gt=0.0)
    high: float = Field(..., gt=0.0)
    scale: Literal["linear", "log"] = Field("log", description="uniform on a linear or a log scale")

    @model_validator(mode="after")
    def _ordered(self) -> Spread:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


_SWITCH = object()


def unused(model: BaseModel, section: str, switch: str, uses: dict[Any, tuple[str, ...]], value: Any = _SWITCH,
           shown: Callable[[Any], str] = repr) -> None:
    """Refuse a field of ``model`` set away from its default that its ``switch`` value does not use
    (ValueError naming ``section.field``): ``availability: {kind: always, rate: 0.3}`` would run
    every center every round and record a rate that did nothing. A default value is no choice (and
    a dumped config, which lists every field, reads back). ``uses``: switch value -> fields it reads.

    Args:
        section: the fields' section in the config file (``""``: top level).
        value: what selects the fields when it is not the field ``switch`` itself: a key of ``uses``
            derived from it (whether a threshold is set), or a list of keys that run side by side (the
            selectors a SAGE run compares): a field is used when any of them reads it.
        shown: how the message writes a key of ``uses`` (``str`` for a derived key such as ``set``).
    """
    if value is _SWITCH:
        value = getattr(model, switch)
    keys = list(value) if isinstance(value, (list, tuple)) else [value]
    every = {f for fs in uses.values() for f in fs}
    read = {f for k in keys for f in uses.get(k, ())}
    fields = type(model).model_fields
    idle = sorted(f for f in every - read
                  if getattr(model, f) != fields[f].get_default(call_default_factory=True))
    if idle:
        where = f"{section}." if section else ""
        users = [k for k, fs in uses.items() if idle[0] in fs]
        now = f"[{', '.join(map(shown, keys))}]" if isinstance(value, (list, tuple)) else shown(value)
        raise ValueError(f"{where}{idle[0]} is used only with {switch} {' or '.join(map(shown, users))}, "
                         f"not {now}: drop it or change {where}{switch}")


class AvailabilityConfig(_Strict):
    """Which centers are up in a round (federation/run/availability.py; docs/realworld.md).

    ``kind``: ``always`` (every center, every round); ``bernoulli`` (each center independently
    with probability ``rate`` per round); ``daily`` (up while the local hour, UTC hour of the
    round's virtual start + the center's ``utc_offsets``, lies in ``work_hours`` [start, end));
    ``trace`` (a CSV ``center,start,end`` of up-intervals in virtual hours, ``trace_period_hours``
    repeats it; centers the file does not list follow ``trace_unlisted``).

    Attributes:
        kind: ``always`` | ``bernoulli`` | ``daily`` | ``trace`` (each described above).
        rate: ``bernoulli``: probability that a center is up in a round.
        work_hours: ``daily``: local hours [start, end) a center is up (wraps midnight if start > end).
        utc_offsets: ``daily``: ``spread`` (uniform in [-12, 12) h), ``utc``, or one offset per center.
        trace: ``trace``: path of the CSV ``center,start,end`` (virtual hours).
        trace_period_hours: ``trace``: repeat the trace with this period (None: once).
        trace_unlisted: ``trace``: whether centers the file does not list are ``available`` or ``unavailable``.
    """

    kind: Literal["always", "bernoulli", "daily", "trace"] = "always"
    rate: float = Field(1.0, ge=0.0, le=1.0)
    work_hours: tuple[float, float] = (8.0, 15.2)
    utc_offsets: Literal["spread", "utc"] | tuple[float, ...] = "spread"
    trace: str | None = None
    trace_period_hours: float | None = Field(None, gt=0.0)
    trace_unlisted: Literal["available", "unavailable"] = "unavailable"
    seed: int = Field(0, description="seed of the bernoulli draws (the run seed does not change who is up)")

    @model_validator(mode="after")
    def _complete(self) -> AvailabilityConfig:
        unused(self, "availability", "kind", {"always": (), "bernoulli": ("rate", "seed"),
                                              "daily": ("work_hours", "utc_offsets", "seed"),
                                              "trace": ("trace", "trace_period_hours", "trace_unlisted")})
        if self.kind == "daily" and self.utc_offsets != "spread" and self.seed != 0:
            raise ValueError("availability.seed draws the utc_offsets 'spread' only; with given offsets it is "
                             "not used: drop it")
        if self.kind == "trace" and not self.trace:
            raise ValueError("availability.kind 'trace' needs availability.trace (a CSV path)")
        if not all(0.0 <= h <= 24.0 for h in self.work_hours):
            raise ValueError(f"availability.work_hours must lie in [0, 24], got {list(self.work_hours)}")
        return self


class ProfilesConfig(_Strict):
    """Per-center compute and link profiles (federation/run/clock.py). ``None`` = infinitely fast.

    ``rows_per_s``: training rows processed per second; ``uplink`` / ``downlink``: bytes per
    second; ``latency_s``: seconds per round that exchanges. ``file``: a CSV
    ``center,rows_per_s,uplink,downlink,latency_s`` overriding the listed centers. ``seed``: the
    draw (hardware does not change with the run seed).
    """

    rows_per_s: Spread | None = None
    uplink: Spread | None = None
    downlink: Spread | None = None
    latency_s: Spread | None = None
    file: str | None = None
    seed: int = 0

    @model_validator(mode="after")
    def _seed_used(self) -> ProfilesConfig:
        spreads = (self.rows_per_s, self.uplink, self.downlink, self.latency_s)
        if self.seed != 0 and not any(sp is not None and sp.low < sp.high for sp in spreads):
            raise ValueError("profiles.seed draws the spreads (low < high); none is given, so it is not used: "
                             "drop it")
        return self


class DeadlineConfig(_Strict):
    """Straggler policy of the server-based methods (those whose plan has server links).

    ``none``: the server waits for every available center. ``fixed``: updates that arrive after
    ``seconds`` are dropped and the round lasts at most ``seconds``. ``over_selection``: the
    round closes when the fastest ``keep_fraction`` of the available centers have reported
    (Bonawitz et al. 2019); the rest are dropped.
    """

    policy: Literal["none", "fixed", "over_selection"] = Field("none", description="none | fixed | over_selection (above)")
    seconds: float = Field(60.0, gt=0.0)
    keep_fraction: float = Field(0.8, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _used(self) -> DeadlineConfig:
        unused(self, "deadline", "policy", {"none": (), "fixed": ("seconds",), "over_selection": ("keep_fraction",)})
        return self


class RealWorldConfig(_Strict):
    """The ``realworld:`` block: availability, per-center profiles, the virtual clock
    and the deadline policy. Absent (None) = today's federation: every center up every round,
    infinitely fast, results identical. ``round_period_s``: a round starts at least this many
    virtual seconds after the previous one started (needed > 0 for time-based availability, so
    that an empty round still moves the clock)."""

    availability: AvailabilityConfig = AvailabilityConfig()
    profiles: ProfilesConfig = ProfilesConfig()
    deadline: DeadlineConfig = DeadlineConfig()
    round_period_s: float = Field(0.0, ge=0.0)

    @model_validator(mode="after")
    def _clock_moves(self) -> RealWorldConfig:
        if self.availability.kind in ("daily", "trace") and self.round_period_s <= 0:
            raise ValueError(f"realworld.round_period_s must be > 0 with availability.kind "
                             f"'{self.availability.kind}' (a round nobody joins must still move the clock)")
        return self


class TargetsConfig(_Strict):
    """Bytes to target (ABPS paper Sec. 7, "scope of the accuracy claim"): the first round and the
    cumulative bytes (model + probe + metadata) at which a seed's mean validation AUROC reaches each
    target (federation/core/targets.py). A measurement setting: it changes no trained parameter and
    stays out of the config hash.

    Attributes:
        auroc: absolute mean-validation-AUROC targets, each in (0, 1]; every run records them per
            seed in results.json (``bytes_to_target``) and MLflow (``rounds_to_auroc_<t>``,
            ``bytes_to_auroc_<t>``).
        below_fedavg: targets this far below the experiment's FedAvg level (the best FedAvg label's
            seed-mean final validation AUROC), each in [0, 1); ``abps report`` resolves them across
            the experiment's runs from their per-round curves. The default is the paper's 0.750 /
            0.770 / 0.785 placed relative to its FedAvg 0.813.
    """

    auroc: tuple[float, ...] = ()
    below_fedavg: tuple[float, ...] = (0.063, 0.043, 0.028)

    @field_validator("auroc")
    @classmethod
    def _in_unit(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        bad = [t for t in v if not 0.0 < t <= 1.0]
        if bad:
            raise ValueError(f"targets.auroc: each target must lie in (0, 1], got {bad[0]}")
        if len({f"{t:.3f}" for t in v}) < len(set(v)):
            raise ValueError("targets.auroc: two targets agree to three decimals (their MLflow names would clash)")
        return tuple(sorted(set(v)))

    @field_validator("below_fedavg")
    @classmethod
    def _offsets(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        bad = [d for d in v if not 0.0 <= d < 1.0]
        if bad:
            raise ValueError(f"targets.below_fedavg: each offset must lie in [0, 1), got {bad[0]}")
        return tuple(sorted(set(v), reverse=True))


#: method parameters whose +infinity means "off" (:class:`abps.privacy.MetadataDpParams`)
INF_MEANS_OFF = frozenset({"metadata_dp_epsilon"})


class CheckpointConfig(_Strict):
    """Round checkpoints of ``abps train`` (``<output>.ckpt``, federation/run/checkpoint.py) and of
    sweep cells (the sweep's ``checkpoints:`` folder; the SAGE and gossip configs have the same
    ``checkpoint:`` section): one is written after round r when ``every_rounds`` divides r, or when
    ``every_minutes`` have passed since the last one (0 turns either trigger off; both 0: none). How
    a run is run, not what it computes: left out of the config hash and of the checkpoint's config
    check. Defaults: at most 2 % of a run's time (docs/decisions.md, "Round checkpoints")."""

    every_rounds: int = Field(25, ge=0, description="write a checkpoint every this many rounds (0: off)")
    every_minutes: float = Field(10.0, ge=0, description="also write one when this many minutes passed since the last (0: off)")


class RunConfig(_Strict):
    """Everything one ``abps train`` run needs besides the cohort and the seed."""

    method: str = Field(..., description="registered method name (abps train --method)")
    rounds: int = Field(50, ge=1, description="federated rounds (without early stopping)")
    reference_rounds: int = Field(50, ge=1, description="FedAvg rounds in the bandwidth denominator")
    engine: EngineConfig = EngineConfig()
    exchange: ExchangeConfig = ExchangeConfig()
    early_stopping: EarlyStoppingConfig = EarlyStoppingConfig()
    params: dict[str, Any] = Field(default_factory=dict, description="method-specific, validated by the method")
    min_train: int = Field(1, ge=1, description="centers with fewer train rows are dropped")
    data: DataConfig = DataConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    drift: LabelFlipDrift | None = Field(None, description="label-flip drift scenario (federation.data.drift_scenario)")
    realworld: RealWorldConfig | None = Field(None, description="availability, profiles, virtual clock")
    targets: TargetsConfig = TargetsConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()

    @field_validator("method")
    @classmethod
    def _lower(cls, v: str) -> str:
        return v.strip().lower()

    @field_validator("params")
    @classmethod
    def _finite_params(cls, v: dict[str, Any]) -> dict[str, Any]:
        # method parameters are validated by each method; a NaN / infinity is refused for all of them
        # except where infinity has a meaning: epsilon = inf is the DP mechanism off (abps.privacy);
        # YAML's `.inf` is stored as the string "inf" that `=inf` gives, so a dumped config validates again
        v = {k: "inf" if k in INF_MEANS_OFF and isinstance(x, float) and x == float("inf") else x
             for k, x in v.items()}
        bad = [k for k, x in v.items() if count_non_finite(x)]
        if bad:
            raise ValueError(f"method parameter {bad[0]!r} must be a finite number")
        return v

    @property
    def max_rounds(self) -> int:
        """Rounds the runner may run: early_stopping.max_rounds when enabled, else rounds."""
        return self.early_stopping.max_rounds if self.early_stopping.enabled else self.rounds

    @model_validator(mode="after")
    def _drift_within_the_run(self) -> RunConfig:
        if self.drift is not None and self.drift.round > self.max_rounds:
            raise ValueError(f"drift.round {self.drift.round} is past the run's last round ({self.max_rounds}): "
                             "the labels would never flip")
        return self


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; values of ``over`` win, nested dicts merge."""
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class _DuplicateKey(Exception):
    """``args``: (key, 1-based line of its second occurrence)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader refusing a key repeated in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):  # the safe loader's own error says so
                break
            if key in seen:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping.

    Raises:
        InputError: one line naming the file: missing, not UTF-8, not valid YAML, a key repeated
            in one mapping, empty (no document: a file cut to nothing is not read as "all
            defaults"), or not a mapping.
    """
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p}: a folder, not a config file")
    if not p.is_file():
        raise InputError(f"{p}: config file not found" + (" (a symbolic link to nothing, or a loop of them)"
                                                           if p.is_symlink() else ""))
    try:
        doc = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except _DuplicateKey as exc:
        raise InputError(f"{p}: key '{exc.args[0]}' appears twice in one mapping (line {exc.args[1]}); "
                         "keep one") from None
    except UnicodeDecodeError:
        raise InputError(f"{p}: not a UTF-8 text file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        what = getattr(exc, "problem", None) or exc.__class__.__name__
        raise InputError(f"{p}: not valid YAML ({what}{where})") from None
    if doc is None:
        raise InputError(f"{p}: empty file (a config holds a YAML mapping)")
    if not isinstance(doc, dict):
        raise InputError(f"{p}: top level must be a mapping")
    return doc


#: run-config keys that hold a file or folder path: a relative one is read from the config file's
#: folder (clinical: the availability trace and the profiles CSV; SAGE: ``data_root``; gossip:
#: ``data.root``). Output paths are not among them: runs go under the folder ``abps`` runs in.
PATH_KEYS = (("realworld", "availability", "trace"), ("realworld", "profiles", "file"), ("data_root",),
             ("data", "root"))


def from_folder(value: str | Path, base: str | Path) -> Path:
    """A path written in a file in folder ``base``: ``~`` expanded, and a relative one read from
    ``base`` (the rule of every path a config or sweep file names, whatever the working folder)."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else Path(base) / p


def paths_from_file(doc: dict[str, Any], path: str | Path, keys: tuple[tuple[str, ...], ...]) -> dict[str, Any]:
    """``doc`` (read from the file ``path``) with the non-empty string at each dotted key of
    ``keys`` made absolute by :func:`from_folder` against the file's folder; a key that is absent
    or not a string is left as it is (its validation names it). The nested mappings on the way are
    copied, never changed in place."""
    base = Path(path).resolve().parent
    out = dict(doc)
    for key in keys:
        node = out
        for k in key[:-1]:
            if not isinstance(node.get(k), dict):
                break
            node[k] = node = dict(node[k])
        else:
            v = node.get(key[-1])
            if isinstance(v, str) and v.strip():
                node[key[-1]] = str(from_folder(v, base))
    return out


def load_run_config(path: str | Path) -> dict[str, Any]:
    """:func:`load_yaml` of a run config, with its :data:`PATH_KEYS` read from the file's folder
    (:func:`paths_from_file`), so that a run reads the same files whichever folder it is started from.

    Raises:
        InputError: as :func:`load_yaml`.
    """
    return paths_from_file(load_yaml(path), path, PATH_KEYS)


def first_error(exc: ValidationError) -> tuple[str, str]:
    """``(location, message)`` of the first error of a pydantic ValidationError: the dotted key
    (``engine.lr``; ``""`` for a check of the whole model) and pydantic's message without its
    ``Value error, `` prefix (the text our validators raise reads as is)."""
    first = exc.errors()[0]
    loc = ".".join(str(x) for x in first.get("loc", ()))
    msg = re.sub(r"^(Value error|Assertion failed), ", "", str(first.get("msg", "")))
    return loc, msg


def check_config_file(path: str | Path, build: Callable[[], Any]) -> Any:
    """``build()`` (a validation of the config read from ``path``), with its errors as one line
    naming the file and the key: ``<path>: key 'lr': Input should be a valid number``.

    Raises:
        InputError: ``build`` raised a pydantic ValidationError or an InputError.
    """
    try:
        return build()
    except ValidationError as exc:
        loc, msg = first_error(exc)
        raise InputError(f"{path}: key '{loc}': {msg}" if loc else f"{path}: {msg}") from None
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


def build_config(method: str, method_defaults: dict[str, Any], file_cfg: dict[str, Any] | None,
                 rounds: int | None = None) -> RunConfig:
    """Layer defaults < method defaults < file < CLI ``rounds`` into a validated RunConfig.

    Raises pydantic.ValidationError on a bad value or unknown key; InputError when the file
    names another method than ``method``.
    """
    raw: dict[str, Any] = deep_merge({"method": method}, method_defaults)
    if file_cfg:
        fm = str(file_cfg.get("method", method)).lower()
        if fm != method.lower():
            raise InputError(f"config names method {fm!r} but --method is {method!r}")
        raw = deep_merge(raw, file_cfg)
        stopping = raw.get("early_stopping")
        stopping = stopping if isinstance(stopping, dict) else {}  # another type is refused by the validation below
        if rounds is None and "rounds" in file_cfg and stopping.get("enabled") is True \
                and stopping.get("max_rounds", file_cfg["rounds"]) != file_cfg["rounds"]:
            raise InputError(f"rounds: {file_cfg['rounds']} is not used while early_stopping is enabled "
                             f"(early_stopping.max_rounds {stopping.get('max_rounds')} bounds the run); give one of them")
    if rounds is not None:
        raw["rounds"] = rounds
        if isinstance(raw.get("early_stopping"), dict) and raw["early_stopping"].get("enabled"):
            raw["early_stopping"] = {**raw["early_stopping"], "max_rounds": rounds}
    return RunConfig.model_validate(raw)


def canonical_json(obj: Any) -> str:
    """Canonical JSON text: sorted keys, no whitespace, tuples as lists, NaN refused.

    Raises ValueError for NaN / infinity (they have no canonical JSON form)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=True)


def config_hash(cfg: RunConfig, cohort: str) -> str:
    """SHA-256 (16 hex digits) of ``canonical_json({"config": cfg, "cohort": cohort})``, without the
    measurement setting ``targets`` and the ``checkpoint`` section (how often a run saves itself):
    neither changes a trained parameter, so runs that differ only there are the same configuration.

    Args:
        cfg: fully resolved run config (defaults, method defaults, file, overrides, rounds).
        cohort: the cohort id (:func:`cohort_id`).
    """
    doc = {"config": cfg.model_dump(mode="json", exclude={"targets", "checkpoint"}), "cohort": cohort}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()[:16]

"""The method interface the round loop (:mod:`federation.run.runner`) calls: :class:`Method` (every hook
declared, with its default), :class:`Context` (what a hook sees) and :class:`RoundPlan` (what a round
exchanges). The protocol in full: docs/runtime.md, "The method protocol in full".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, cast

import torch
from pydantic import BaseModel, ConfigDict

from etl.errors import InputError
from federation.core.config import NumbersNotFlags, RunConfig
from federation.core.ledger import Ledger
from federation.data.tensors import FederatedData
from federation.engine.build import build_engine
from federation.engine.mixing import mix_params
from federation.engine.mlp import Batch, StackedParams
from federation.engine.protocol import Engine


class NoParams(NumbersNotFlags):
    """A method without parameters of its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass
class RoundPlan:
    """What a method decides for one round.

    Attributes:
        w: ``[n, n]`` row-stochastic mixing matrix (float32/float64), or None for no exchange.
        adjacency: ``[n, n]`` bool symmetric peer edges that carried a model (ledger), or None.
        server_links: number of center-server edges that carried a model (star topologies).
        probe_bytes: probe traffic this round (e.g. anchor predictions).
        metadata_bytes: metadata traffic this round (e.g. ABPS v_i vectors).
    """

    w: torch.Tensor | None
    adjacency: torch.Tensor | None = None
    server_links: int = 0
    probe_bytes: int = 0
    metadata_bytes: int = 0


@dataclass
class Context:
    """Run context handed to every hook (see the module docstring)."""

    cfg: RunConfig
    data: FederatedData
    engine: Engine
    seed: int
    ledger: Ledger
    exchanged: tuple[str, ...]
    head: tuple[str, ...]
    bf16: bool
    params: StackedParams = field(default_factory=dict)
    round_start: StackedParams = field(default_factory=dict)
    pre_exchange: StackedParams = field(default_factory=dict)
    rng: torch.Generator = field(default_factory=torch.Generator)
    #: ``[n]`` bool centers available this round (federation/run/realworld.py); None = all (no realworld block)
    available: torch.Tensor | None = None

    @property
    def n(self) -> int:
        """Number of centers."""
        return self.data.n_centers

    @property
    def meta(self) -> torch.Tensor:
        """``[n, 15]`` metadata vectors (centers.parquet META_COLUMNS)."""
        return self.data.meta

    @property
    def meta_base(self) -> torch.Tensor:
        """``[n, 3]`` base metadata vectors (pos rate, ln n_train, year / 2030)."""
        return self.data.meta_base

    @property
    def n_train(self) -> torch.Tensor:
        """``[n]`` train rows per center."""
        return self.data.n_train

    @torch.no_grad()
    def evaluate(self, split: str = "val", params: StackedParams | None = None) -> torch.Tensor:
        """``[n]`` float64 per-center AUROC of ``params`` (default: the live ``ctx.params``) on
        each center's own ``split``; NaN for a one-class center."""
        p = params if params is not None else self.params
        return self.data.split_metric(self.engine.predict(p, split), split)  # accuracy on image clients

    @torch.no_grad()
    def evaluate_mixtures(
        self, wc: torch.Tensor, tc: torch.Tensor, split: str = "val", params: StackedParams | None = None,
        chunk: int | None = None,
    ) -> torch.Tensor:
        """The metric (AUROC; accuracy on image clients) of many candidate mixtures in one batched
        computation (the engine's :meth:`federation.engine.protocol.Engine.evaluate_mixtures`).

        Row r builds the model whose exchanged block is ``sum_j wc[r, j] wire(theta_j)``
        (the bf16 wire transform as in the exchange; center tc[r]'s own copy stays fp32)
        and whose head (if personalized) is center ``tc[r]``'s own, and scores it on
        ``tc[r]``'s ``split``. ``theta`` defaults to ``ctx.pre_exchange``: the models as
        sent this round (after local training, before mixing); server momentum and
        ``after_mix`` are not applied.

        Args:
            wc: ``[m, n]`` non-negative rows summing to 1 (dense, or sparse COO).
            tc: ``[m]`` int64 target centers.
            split: "val" or "test".
            chunk: rows per batched forward (default: the engine's).

        Returns:
            ``[m]`` float64 metric (NaN where tc[r]'s split holds one class).
        """
        theta = params if params is not None else self.pre_exchange
        return self.engine.evaluate_mixtures(theta, wc, tc, split, self.exchanged, self.bf16, chunk)


#: the type of a method's own parameter model (``Method[FedProxParams]`` types ``self.p``)
P = TypeVar("P", bound=BaseModel)


class Method(ABC, Generic[P]):
    """Base class of a federated method (see the module docstring for the protocol)."""

    name: ClassVar[str] = "method"
    display_name: ClassVar[str] = "method"
    family: ClassVar[str] = "other"
    paper_order: ClassVar[int | None] = None
    Params: ClassVar[type[BaseModel]] = NoParams
    default_config: ClassVar[dict[str, Any]] = {}
    pooled: ClassVar[bool] = False
    #: payloads of the exchanged block's size that one model transfer carries (ledger bytes)
    payloads_per_link: ClassVar[int] = 1
    #: what :meth:`scores` returns: ``"logit"`` or ``"probability"`` (calibration figures, federation/core/evaluation.py)
    score_kind: ClassVar[str] = "logit"
    #: attributes :meth:`state_dict` leaves out: the method's parameters and anything rebuilt the same
    #: by :meth:`setup` from the config and data (a subclass adds its own static attributes)
    static_state: ClassVar[tuple[str, ...]] = ("p",)
    #: expected seconds per round at n = 230 centers, 1 torch thread (docs/benchmarks.md "Table 1"); only
    #: the ratios matter: a sweep hands out its cells longest first (federation/sweep/schedule.py)
    seconds_per_round: ClassVar[float] = 0.55
    #: the plan has a server (a star: ``server_links`` > 0 whenever it mixes); the real-world deadline
    #: policy applies to such methods only (the round loop checks every plan against it)
    has_server: ClassVar[bool] = False
    #: the plan mixes models (a matrix W); the ``exchange:`` settings apply to such methods only
    exchanges: ClassVar[bool] = True

    def __init__(self, params: P | None = None) -> None:
        self.p: P = params if params is not None else cast(P, self.Params())

    @classmethod
    def check_config(cls, cfg: RunConfig) -> None:
        """Refuse run-config settings this method would not apply (before any run starts): a
        pooled encoding on a per-center method, a drift scenario on a pooled one, non-default
        ``exchange:`` settings on a method that mixes nothing, a deadline policy on a method
        without a server. A subclass adds its own refusals and calls this one.

        Raises:
            InputError: one line naming the method and the setting.
        """
        m = cfg.method
        if cfg.data.preprocessing == "pooled" and not cls.pooled:
            raise InputError(f"{m}: data.preprocessing 'pooled' fits statistics on the union of all "
                             f"centers' rows; only the centralized reference may use it")
        if cfg.drift is not None and cls.pooled:
            raise InputError(f"{m}: the drift scenario needs per-center labels (not a pooled model)")
        if not cls.exchanges:
            given = sorted(cfg.exchange.model_dump(exclude_defaults=True))
            if given:
                raise InputError(f"{m}: exchange.{given[0]} is not used (this method exchanges no model); "
                                 "leave the exchange: settings out")
        if cfg.realworld is not None and cfg.realworld.deadline.policy != "none" and not cls.has_server:
            raise InputError(f"{m}: realworld.deadline.policy {cfg.realworld.deadline.policy!r} is not used "
                             "(a deadline cuts a server's round; this method has no server); use policy none")

    def make_engine(self, data: FederatedData, cfg: RunConfig, seed: int) -> Engine:
        """The stacked trainer of ``data`` (all centers, or the pooled union for a ``pooled``
        method): ``init_params()``, ``train_round(params, state, r, local_loss)``, ``predict``
        (:func:`federation.engine.build.build_engine`)."""
        return build_engine(data, cfg, seed)

    def setup(self, ctx: Context) -> None:
        """Called once before round 0."""

    def local_loss(self, ctx: Context, params: StackedParams, batch: Batch) -> torch.Tensor:
        """Extra per-center loss ``[a]`` for the active centers (override to use)."""
        raise TypeError(f"{self.name} defines no local loss")

    @abstractmethod
    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        """Mixing matrix and ledger edges of this round (every method defines it)."""

    def aggregate(self, ctx: Context, w: torch.Tensor, params: StackedParams) -> StackedParams:
        """The exchanged block after mixing with ``w [n, n]`` (row-stochastic): ``{k: W @
        wire(params[k])}`` for k in ``ctx.exchanged`` (:func:`federation.engine.mixing.mix_params`).
        Returns only the replaced entries; the runner copies them into ``params``."""
        return mix_params(w, params, ctx.exchanged, ctx.bf16)

    def scores(self, ctx: Context, params: StackedParams, split: str, round_idx: int) -> torch.Tensor:
        """``[n, rows]`` per-row scores of every center's ``split`` (any monotone map of the
        predicted risk; AUROC only ranks them). Default: the engine's logits."""
        return ctx.engine.predict(params, split)

    def after_mix(self, ctx: Context, round_idx: int, prev: StackedParams, mixed: StackedParams) -> StackedParams:
        """Post-process the mixed exchanged block (default: unchanged)."""
        return mixed

    def after_exchange(self, ctx: Context, round_idx: int, plan: RoundPlan) -> dict[str, float]:
        """Per-round extra metrics (default: none)."""
        return {}

    def final_metrics(self, ctx: Context) -> dict[str, Any]:
        """End-of-run summary, called once after the last round (aggregates keyed by center_id only):
        stored as ``method_summary`` in the seed's results.json entry, its numeric entries logged as
        final MLflow metrics (default: none)."""
        return {}

    def artifacts(self, ctx: Context) -> dict[str, Any]:
        """``{file name: JSON-able object}`` logged as MLflow artifacts of the seed's run, called once
        after the last round (default: none)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Everything the next round reads that a round changes (Beta beliefs, drift windows,
        Shapley credit, trust, random generators...), for a round checkpoint
        (federation/run/checkpoint.py). Default: every instance attribute but
        :attr:`static_state`, as it stands (the checkpoint pickles it whole, generators included);
        a method whose state lives elsewhere overrides this and :meth:`load_state_dict`."""
        return {k: v for k, v in vars(self).items() if k not in self.static_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output after :meth:`setup` (the run resumes at the next round)."""
        vars(self).update(state)

    @classmethod
    def has_local_loss(cls) -> bool:
        """True when the class overrides :meth:`local_loss`."""
        return cls.local_loss is not Method.local_loss

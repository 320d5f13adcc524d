"""The clinical round: local training (stacked) -> plan -> exchange -> after_exchange -> metrics,
as the step and evaluation hooks of the one loop driver :func:`federation.core.loop.drive`.

:func:`run_one` runs one (method, seed) on a :class:`FederatedData`; :func:`run_training`
runs several seeds with MLflow tracking and writes ``results.json``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from etl.errors import InputError
from etl.io import check_writable
from federation.core.checks import check_finite, check_finite_params
from federation.core.config import RunConfig, config_hash, first_error
from federation.core.evaluation import ClinicalEvaluation, evaluate_final, log_clinical, publishable_per_center
from federation.core.ledger import Ledger
from federation.core.loop import EvalSchedule, drive
from federation.core.metrics import summarize
from federation.core.seeding import mix_seed
from federation.core.targets import curve_of, reach_all
from federation.core.variance import variance_correct
from federation.data.drift_scenario import apply_drift, drifting_copy
from federation.data.load import federation_id, load_federation
from federation.data.tensors import FederatedData
from federation.engine import kernels
from federation.engine.mixing import apply_momentum, check_row_stochastic
from federation.engine.mlp import AdamState, StackedParams, check_model_fits
from federation.methods import Context, Method, get_method
from federation.methods.registry import run_label
from federation.run import checkpoint
from federation.run.checkpoint import global_streams, restore_global_streams
from federation.run.progress import RoundProgress
from federation.run.realworld import RealWorld
from federation.run.results import write_results
from federation.run.tracking import (
    COHORT_NAME_TAG,
    COHORT_TAG,
    HASH_TAG,
    KIND_RUN,
    KIND_TAG,
    KIND_TRAIN,
    LABEL_TAG,
    METHOD_TAG,
    METRIC_TAG,
    SEED_TAG,
    Tracker,
    engine_tags,
)

RoundCallback = Callable[[int, dict[str, float]], None]
#: ``checkpoint(tau, snapshot)`` after round ``tau`` when the run goes on; ``snapshot()`` returns the
#: round state for :mod:`federation.run.checkpoint` (called only when a checkpoint is written)
CheckpointCallback = Callable[[int, Callable[[], dict[str, Any]]], None]


@dataclass
class RunResult:
    """Outcome of one (method, seed) run. AUROC values are test-split means across centers
    (std across centers) at the final round, or at the best val round with early stopping."""

    method: str
    seed: int
    rounds_run: int
    best_round: int
    final_auroc_mean: float
    final_auroc_std: float
    final_val_auroc_mean: float
    n_excluded_test: int
    n_scored_test: int   # centers whose test AUROC is defined (both classes)
    min_scored_test: int  # how many the mean needs (RunConfig.evaluation); fewer -> mean undefined
    total_bytes: int
    model_bytes: int
    probe_bytes: int
    metadata_bytes: int
    rel_bandwidth: float
    history: list[dict[str, float]] = field(default_factory=list)
    per_center: dict[str, dict[str, float]] = field(default_factory=dict)
    params: StackedParams | None = None
    artifacts: dict[str, Any] = field(default_factory=dict)
    method_summary: dict[str, Any] = field(default_factory=dict)
    clinical: ClinicalEvaluation | None = None
    curve: dict[str, list[float]] = field(default_factory=dict)
    bytes_to_target: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The results.json entry of this seed (no history, per-center detail, parameters or
        method artifacts; ``method_summary`` holds the method's ``final_metrics``, e.g. ABPS's
        per-seed isolation figures and the DP budget spent by its metadata releases; ``clinical`` the
        clinical figures' across-center summary, federation.core.evaluation; ``curve`` the per-round
        mean validation AUROC and cumulative bytes, ``bytes_to_target`` where it reaches each
        ``targets.auroc``, federation.core.targets)."""
        skip = ("history", "per_center", "params", "artifacts", "clinical")
        out = {k: v for k, v in asdict(self).items() if k not in skip}
        if self.clinical is not None:
            out["clinical"] = self.clinical.summary()
        return out


def _clone(p: StackedParams) -> StackedParams:
    return {k: v.clone() for k, v in p.items()}


def _evaluate(method: Method, ctx: Context, params: StackedParams, split: str, round_idx: int,
              where: tuple = (None, None, None)) -> torch.Tensor:
    """``[n]`` per-center AUROC of the method's scores (:meth:`Method.scores`) on ``split``;
    ``where`` = (method, seed, round) for the error raised when a real row's score is not
    finite (:func:`federation.core.checks.check_finite`)."""
    s = ctx.data.splits[split]
    scores = method.scores(ctx, params, split, round_idx)
    check_finite(f"{split} scores", scores[s.mask], *where)
    return ctx.data.split_metric(scores, split)  # AUROC; accuracy on an image federation (federation.data.images)


def run_one(
    cfg: RunConfig, data: FederatedData, seed: int, on_round: RoundCallback | None = None, keep_params: bool = False,
    checkpoint: CheckpointCallback | None = None, resume: dict[str, Any] | None = None,
) -> RunResult:
    """Run one method for one seed.

    Args:
        cfg: validated run config (``cfg.method`` must be registered).
        data: the federation.
        seed: run seed (parameters, batch order, dropout, method draws).
        on_round: called after every round with (round number, metrics dict).
        keep_params: store the final stacked parameters ``[n, ...]`` in ``result.params``.
        checkpoint: offered the round state after every round the run goes on from
            (:data:`CheckpointCallback`).
        resume: a round state ``checkpoint`` was offered (same cfg, data and seed): the run goes on
            from that round; ``on_round`` sees only the rounds after it.

    Returns:
        :class:`RunResult`. Same cfg, data and seed -> identical result on CPU, resumed or not.
    """
    cls = get_method(cfg.method)
    cls.check_config(cfg)
    data = data.with_preprocessing(cfg.data)  # the run's numeric encoding (no-op when already in use)
    method: Method = cls(cls.Params.model_validate(cfg.params))
    data = drifting_copy(data, cfg.drift)  # the drift scenario flips labels in a per-run copy
    engine = method.make_engine(data, cfg, seed)
    train_engine = method.make_engine(data.pooled(), cfg, seed) if cls.pooled else engine
    ex, hd, sizes = engine.layout(cfg.exchange.head_layers)
    ledger = Ledger(data.n_centers, sum(sizes.values()), cfg.reference_rounds)
    ctx = Context(cfg=cfg, data=data, engine=engine, seed=seed, ledger=ledger, exchanged=ex, head=hd,
                  bf16=cfg.exchange.bf16_wire, rng=torch.Generator().manual_seed(mix_seed(seed, 0x3E7)))
    train_params = train_engine.init_params()
    state = AdamState.zeros_like(train_params)

    def eval_params() -> StackedParams:
        if cls.pooled:
            return {k: v.expand(data.n_centers, *v.shape[1:]) for k, v in train_params.items()}
        return train_params

    ctx.params = eval_params()
    method.setup(ctx)
    local_loss = (lambda p, b: method.local_loss(ctx, p, b)) if cls.has_local_loss() else None
    payload = sum(sizes[k] for k in ex) * cls.payloads_per_link
    bpp = 2 if cfg.exchange.bf16_wire else 4
    momentum: StackedParams | None = None
    rb: Any = None  # the last round's ledger record
    extras: dict[str, Any] = {}
    es = cfg.early_stopping
    best = (-math.inf, -1, None)  # (val mean, round, params)
    rw = _real_world(cfg, cls, data, seed, payload * bpp)  # None: every center up, infinitely fast
    last: dict[str, torch.Tensor] = {}

    def step(r: int) -> None:
        """Round r up to the ledger record and the method's extras (federation.core.loop)."""
        nonlocal state, momentum, rb, extras
        apply_drift(data, cfg.drift, r)
        ctx.round_start = _clone(eval_params())
        if cfg.engine.reset_optimizer_each_round:
            state = AdamState.zeros_like(train_params)
        if rw is not None:  # availability mask on the center axis (federation/run/realworld.py)
            ctx.available = rw.begin_round(r, train_params, state, momentum)
        train_engine.train_round(train_params, state, r, local_loss)
        if rw is not None:
            rw.after_training(train_params, state)
        where = (cfg.method, seed, r + 1)  # non-finite values stop the run (federation.core.checks)
        check_finite_params("parameters after local training", train_params, *where)
        ctx.params = eval_params()
        ctx.pre_exchange = _clone(ctx.params)
        plan = method.plan_round(ctx, r)
        if plan.w is not None and (not cls.exchanges or (plan.server_links > 0) != cls.has_server):
            raise RuntimeError(f"{cfg.method}: its plan does not match its class (exchanges={cls.exchanges}, "
                               f"has_server={cls.has_server}, server_links={plan.server_links})")
        plan = rw.plan(plan) if rw is not None else plan
        if plan.w is not None and not cls.pooled:
            if tuple(plan.w.shape) != (data.n_centers, data.n_centers):
                raise ValueError(f"{cfg.method}: mixing matrix must be [n, n] = [{data.n_centers}, "
                                 f"{data.n_centers}], got {list(plan.w.shape)}")
            check_finite("mixing matrix W", plan.w, *where)
            check_row_stochastic(plan.w)
            mixed = method.aggregate(ctx, plan.w, train_params)
            if cfg.exchange.variance_correction:
                mixed = variance_correct(plan.w, train_params, mixed)
            prev = {k: ctx.round_start[k] for k in mixed}
            mixed = method.after_mix(ctx, r, prev, mixed)
            if cfg.exchange.server_momentum > 0:
                mixed, momentum = apply_momentum(prev, mixed, momentum, cfg.exchange.server_momentum)
            for k, v in mixed.items():
                train_params[k].copy_(v)
        if rw is not None:
            rw.end_exchange(train_params, ctx.round_start, momentum)
        meta_bytes = plan.metadata_bytes + (data.encoding_bytes if r == 0 else 0)  # + encoding aggregates
        rb = ledger.record(r, plan.adjacency, plan.server_links if plan.w is not None else 0,
                           payload, bpp, plan.probe_bytes, meta_bytes)
        extras = method.after_exchange(ctx, r, plan)
        extras = {**extras, **rw.metrics()} if rw is not None else extras
        # a NaN extra means "undefined this round" (e.g. a mean over no observed partner): it is
        # left out of the round's metrics, never logged; an infinity stops the run
        extras = {k: v for k, v in extras.items() if not (isinstance(v, float) and math.isnan(v))}
        for k, v in extras.items():
            check_finite(f"method output {k!r}", v, *where)

    def evaluate(tau: int) -> dict[str, float]:
        """The metrics after round tau - 1: val / test AUROC, bytes, the method's extras."""
        where = (cfg.method, seed, tau)
        params_now = eval_params()
        check_finite_params("parameters after the exchange", params_now, *where)
        last["val"], last["test"] = (_evaluate(method, ctx, params_now, s, tau - 1, where) for s in ("val", "test"))
        sv, st = summarize(last["val"]), summarize(last["test"])
        return {**round_metrics(sv, st, rb, ledger), **{k: float(v) for k, v in extras.items()}}

    def snapshot(tau: int) -> dict[str, Any]:
        """Everything round tau reads (federation/run/checkpoint.py); rounds' float records exact."""
        return {"round": tau, "records": list(records), "params": train_params,
                "adam": (state.m, state.v, state.t), "momentum": momentum, "best": best,
                "ledger": list(ledger.rounds), "rng": ctx.rng, "method": method.state_dict(),
                "engine": train_engine.state_dict(), "realworld": rw.state_dict() if rw is not None else None,
                "global": global_streams()}

    def restore(snap: dict[str, Any]) -> int:
        """Set the run to ``snap`` (after :meth:`Method.setup`); returns the round to go on from."""
        nonlocal state, momentum, best
        start = int(snap["round"])
        for r in range(start):  # the drift scenario's label flips so far, on this run's copy of the data
            apply_drift(data, cfg.drift, r)
        for k, v in snap["params"].items():
            train_params[k].copy_(v)
        state = AdamState(*snap["adam"])
        momentum, best = snap["momentum"], snap["best"]
        ledger.rounds[:] = snap["ledger"]
        ctx.rng = snap["rng"]
        method.load_state_dict(snap["method"])
        train_engine.load_state_dict(snap["engine"], state)
        if rw is not None:
            rw.load_state_dict(snap["realworld"])
        restore_global_streams(snap["global"])
        ctx.params = eval_params()
        records[:] = snap["records"]
        return start

    records: list[tuple[int, dict[str, float]]] = []

    def record(tau: int, metrics: dict[str, float]) -> None:
        records.append((tau, metrics))
        if on_round is not None:
            on_round(tau, metrics)

    def stop(tau: int, metrics: dict[str, float]) -> bool:
        """Early stopping on the mean val AUROC (cfg.early_stopping)."""
        nonlocal best
        halt, best = early_stop_step(es, best, tau, metrics["val_auroc_mean"],
                                     lambda: (_clone(train_params), last["val"].clone(), last["test"].clone()))
        return halt

    start = restore(resume) if resume is not None else 0
    after = (lambda tau: checkpoint(tau, lambda: snapshot(tau))) if checkpoint is not None else None
    outcome = drive(cfg.max_rounds, step, evaluate, EvalSchedule(every=1), on_record=record, stop=stop,
                    start=start, records=list(records), after=after)
    history = [{"round": float(tau), **m} for tau, m in outcome.records]
    rounds_run = outcome.steps_run
    last_val, last_test = last.get("val"), last.get("test")
    return finalize_run(
        cfg, data, seed, ledger, history, rounds_run, best, train_params, last_val, last_test,
        keep=(lambda: {k: v.clone() for k, v in eval_params().items()}) if keep_params else None,
        artifacts=lambda: _method_artifacts(method, ctx),
        method_summary=lambda: dict(method.final_metrics(ctx)),
        clinical=(lambda r: evaluate_final(data, method.scores(ctx, eval_params(), "test", r),
                                           method.score_kind, seed)) if data.clinical else None,
    )


def _real_world(cfg: RunConfig, cls: type[Method], data: FederatedData, seed: int,
                payload_bytes: int) -> RealWorld | None:
    """The run's :class:`federation.run.realworld.RealWorld` (None without a ``realworld:`` block).

    Raises:
        InputError: a ``realworld:`` block on a pooled method (the centralized reference has no
            centers to take down).
    """
    if cfg.realworld is None:
        return None
    if cls.pooled:
        raise InputError(f"{cfg.method}: the realworld block needs centers (not a pooled model)")
    return RealWorld(cfg.realworld, data, seed, payload_bytes, cfg.engine.local_epochs)


def round_metrics(sv: Any, st: Any, rb: Any, ledger: Ledger) -> dict[str, float]:
    """The metrics every method logs per round (MLflow keys shared by all runs of an experiment,
    so the compare view lines them up): val / test AUROC summaries (:func:`summarize`), the
    round's ledger record ``rb`` and the ledger's cumulative bytes."""
    return {
        "val_auroc_mean": sv.mean, "val_auroc_std": sv.std, "test_auroc_mean": st.mean,
        "test_auroc_std": st.std, "val_excluded": float(sv.n_excluded), "test_excluded": float(st.n_excluded),
        "round_bytes": float(rb.model_bytes), "cum_bytes": float(ledger.model_bytes),
        "cum_probe_bytes": float(ledger.probe_bytes), "cum_metadata_bytes": float(ledger.metadata_bytes),
        "rel_bandwidth": ledger.relative_bandwidth, "edges": float(rb.edges),
    }


def check_method_params(cfg: RunConfig) -> None:
    """Validate ``cfg.params`` against the method's parameter model, and the rest of ``cfg``
    against what the method applies (:meth:`Method.check_config`).

    Raises:
        InputError: one line naming the method, the first bad parameter and ``--param``, or the
            setting the method would not use.
    """
    cls = get_method(cfg.method)
    try:
        cls.Params(**cfg.params)
    except ValidationError as exc:
        loc, msg = first_error(exc)
        raise InputError(f"{cfg.method}: invalid parameter {loc or 'set'} (--param or the config's params:): "
                         f"{msg}") from None
    cls.check_config(cfg)


def early_stop_step(es: Any, best: tuple, tau: int, val_mean: float,
                    snapshot: Callable[[], Any]) -> tuple[bool, tuple]:
    """One round of early stopping on the mean validation AUROC (``cfg.early_stopping``).

    Args:
        es: the run's ``EarlyStoppingConfig`` (``enabled``, ``patience`` in rounds).
        best: ``(best mean val AUROC, its round index, snapshot)``; ``(-inf, -1, None)`` at the start.
        tau: the round just finished (1-based); val_mean: its mean validation AUROC.
        snapshot: called only on a new best, returns what :func:`finalize_run` restores.

    Returns:
        ``(stop, best)``: stop once ``patience`` rounds passed without a new best.
    """
    if not es.enabled:
        return False, best
    r = tau - 1
    if val_mean > best[0]:
        return False, (val_mean, r, snapshot())
    return r - best[1] >= es.patience, best


def finalize_run(
    cfg: RunConfig, data: FederatedData, seed: int, ledger: Ledger, history: list[dict[str, float]],
    rounds_run: int, best: tuple, params: StackedParams, last_val: torch.Tensor, last_test: torch.Tensor,
    keep: Callable[[], StackedParams] | None = None, artifacts: Callable[[], dict[str, Any]] | None = None,
    method_summary: Callable[[], dict[str, Any]] | None = None,
    clinical: Callable[[int], ClinicalEvaluation] | None = None,
) -> RunResult:
    """End of a run (shared by every round loop): restore the best round when early stopping is
    on, summarize the last val / test AUROC ``[n]`` and build the :class:`RunResult`.

    Args:
        best: ``(best mean val AUROC, best round index, (params, val, test) snapshot or None)``.
        params: the live stacked parameters (restored in place).
        keep: called after the restore to store the final parameters in the result.
        artifacts: called for the method's MLflow artifacts.
        method_summary: called for the method's end-of-run summary (a method's optional
            ``final_metrics(ctx)`` hook): goes into results.json per seed; its float entries are
            logged as final MLflow metrics.
        clinical: called after the restore with the 0-based index of the reported round; returns
            the clinical figures of the test split (federation/core/evaluation.py), whose per-center
            values join ``per_center``.
    """
    best_round = rounds_run
    if cfg.early_stopping.enabled and best[2] is not None:
        restored, last_val, last_test = best[2]
        for k in params:
            params[k].copy_(restored[k])
        best_round = best[1] + 1
    sv, st = summarize(last_val), summarize(last_test)
    need = cfg.evaluation.required(data.n_centers)
    scored = data.n_centers - st.n_excluded
    if scored < need:   # a mean over too few centers is no headline: undefined, per-center figures kept
        st = type(st)(math.nan, math.nan, st.n_excluded)
    if data.n_centers - sv.n_excluded < need:
        sv = type(sv)(math.nan, math.nan, sv.n_excluded)
    s_tr, s_va, s_te = (data.splits[s].n for s in ("train", "val", "test"))
    per_center = {
        cid: {"val_auroc": float(last_val[i]), "test_auroc": float(last_test[i]), "n_train": int(s_tr[i]),
              "n_val": int(s_va[i]), "n_test": int(s_te[i])}
        for i, cid in enumerate(data.center_ids)
    }
    clin = clinical(best_round - 1) if clinical is not None and best_round > 0 else None
    for row in clin.per_center if clin is not None else ():
        per_center[row["center_id"]].update({k: v for k, v in row.items()
                                             if k not in ("center_id", "n_test", "auroc")})
    return RunResult(
        method=cfg.method, seed=seed, rounds_run=rounds_run, best_round=best_round,
        final_auroc_mean=st.mean, final_auroc_std=st.std, final_val_auroc_mean=sv.mean,
        n_excluded_test=st.n_excluded, n_scored_test=scored, min_scored_test=need, total_bytes=ledger.total_bytes, model_bytes=ledger.model_bytes,
        probe_bytes=ledger.probe_bytes, metadata_bytes=ledger.metadata_bytes,
        rel_bandwidth=ledger.relative_bandwidth, history=history, per_center=per_center,
        params=keep() if keep is not None else None,
        artifacts=artifacts() if artifacts is not None else {},
        method_summary=method_summary() if method_summary is not None else {},
        clinical=clin, curve=(curve := curve_of(history)), bytes_to_target=reach_all(curve, cfg.targets.auroc),
    )


def _method_artifacts(method: Method, ctx: Context) -> dict[str, Any]:
    """The method's ``artifacts(ctx)`` hook as a dict."""
    return dict(method.artifacts(ctx))


def results_document(cfg: RunConfig, cohort: str, results: list[RunResult]) -> dict[str, Any]:
    """results.json content: config, per-seed summaries, and mean / std across seeds."""
    def agg(key: str) -> dict[str, float]:
        # seeds whose value is NaN (e.g. no center with both classes in its test split) are left
        # out of the mean and counted
        vals = [float(getattr(r, key)) for r in results]
        ok = [v for v in vals if math.isfinite(v)]
        return {"mean": statistics.fmean(ok) if ok else None,
                "std": (statistics.pstdev(ok) if len(ok) > 1 else 0.0) if ok else None,
                "n_seeds_undefined": len(vals) - len(ok)}

    return {
        "method": cfg.method,
        "label": run_label(cfg.method, cfg.params),
        "cohort": cohort,
        "config": cfg.model_dump(mode="json"),
        "seeds": {str(r.seed): r.summary() for r in results},
        "summary": {k: agg(k) for k in ("final_auroc_mean", "final_auroc_std", "rel_bandwidth", "total_bytes",
                                        "rounds_run")},
    }


def run_training(
    cfg: RunConfig,
    cohort_dir: str | Path,
    seeds: list[int],
    output: str | Path | None = None,
    tracking_uri: str | None = None,
    experiment: str = "abps",
    progress: bool = True,
    track: bool = True,
    overwrite: bool = True,
    resume: bool = False,
) -> dict[str, Any]:
    """Run ``cfg`` for every seed on the cohort, log to MLflow, write ``output`` (results.json).

    One MLflow parent run per invocation, one nested child run per (method, seed) with the
    full config as params, per-round metrics, and the artifacts ``per_center.json`` (final
    per-center metrics keyed by center_id), ``config.json``; the parent gets
    ``results.json``. Nothing row-level is logged.

    ``overwrite=False`` refuses an ``output`` that exists (``abps train`` without ``--force``).

    With an ``output``, round checkpoints go to ``<output>.ckpt`` (``cfg.checkpoint`` cadence,
    :mod:`federation.run.checkpoint`; removed once results.json is written). ``resume=True`` goes on
    from that checkpoint: finished seeds are kept, the current seed goes on after its last
    checkpointed round, in the same MLflow runs (same run ids; rounds MLflow already holds are not
    logged again).

    Raises:
        InputError: bad cohort directory, unknown method, or ``output`` is a directory, one of the
            cohort's files, or (with ``overwrite=False``) an existing file; with ``resume``: no
            output, no checkpoint, or one of another run (config, cohort, seeds, code version,
            MLflow store or experiment).
    """
    cls = get_method(cfg.method)
    check_method_params(cfg)  # bad method parameters fail before any MLflow run starts
    if output is not None:
        out = Path(output).resolve()
        if out.is_dir():
            raise InputError(f"--output {output}: is a directory (give a file such as results.json)")
        if out in {(Path(cohort_dir) / f).resolve() for f in ("cohort.parquet", "centers.parquet")}:
            raise InputError(f"--output {output}: would overwrite the cohort's own files")
        if not overwrite and out.exists():
            raise InputError(f"{output} exists; give --force to replace it, or another --output")
        check_writable(out, "--output")  # before the work, not after it
    data = load_federation(cohort_dir, min_train=cfg.min_train, preprocessing=cfg.data)
    _real_world(cfg, cls, data, seeds[0] if seeds else 0, 0)  # bad trace / profile files fail before MLflow starts
    if isinstance(data, FederatedData):  # a model larger than the machine fails before MLflow starts too
        check_model_fits(data.d, cfg.engine.hidden, data.n_centers)
    cid = federation_id(cohort_dir)
    chash = config_hash(cfg, cid)  # runs of one method with different configs are told apart (abps runs)
    results: list[RunResult] = []
    ck_path = checkpoint.checkpoint_path(output) if output is not None else None
    ck_stamp = checkpoint.stamp(cfg, cid, seeds)
    saved = checkpoint.resume_from(ck_path, ck_stamp) if resume else None  # before any MLflow run starts
    tracker = Tracker(tracking_uri, experiment) if track else None
    mlflow_ids = checkpoint.check_resume_store(saved.get("mlflow"), tracker) if saved is not None else {}
    cadence = checkpoint.Cadence(cfg.checkpoint)
    writes = ck_path is not None and cadence.enabled

    def write_checkpoint(current: dict[str, Any] | None) -> None:
        if writes:
            checkpoint.save(ck_path, {"stamp": ck_stamp, "mlflow": mlflow_ids, "done": results, "current": current})
    label = run_label(cfg.method, cfg.params)
    bar = RoundProgress(enabled=progress, total_rounds=cfg.max_rounds, n_units=len(seeds), label=label)
    metric = "AUROC" if data.metric_name == "auroc" else data.metric_name
    parent_params = {"method": cfg.method, "seeds": " ".join(map(str, seeds)), "n_centers": data.n_centers,
                     "d_features": data.d, "torch_threads": torch.get_num_threads()}  # (abps train --threads)
    common = {METHOD_TAG: cfg.method, LABEL_TAG: label, COHORT_TAG: cid, METRIC_TAG: data.metric_name,
              COHORT_NAME_TAG: Path(cohort_dir).resolve().name}
    done = {r.seed: r for r in saved["done"]} if saved is not None else {}
    current = saved["current"] if saved is not None else None
    with bar, (tracker.resume(mlflow_ids["parent"]) if tracker and "parent" in mlflow_ids else
               tracker.parent(f"{label} seeds {' '.join(map(str, seeds))}", parent_params,
                              {KIND_TAG: KIND_TRAIN, **common})
               if tracker else _null()) as parent_id:
        if tracker:
            mlflow_ids["parent"] = parent_id
        for seed in seeds:
            bar.start_unit(f"seed {seed}")
            if seed in done:  # finished before the resume: its MLflow run is complete
                results.append(done[seed])
                bar.end_unit()
                continue
            going_on = current if current is not None and current["seed"] == seed else None
            with (tracker.resume(going_on["child"]) if tracker and going_on is not None else
                  tracker.child(f"{label} seed {seed}", {"seed": seed, "cohort_id": cid},
                                {KIND_TAG: KIND_RUN, SEED_TAG: str(seed), HASH_TAG: chash, **common})
                  if tracker else _null()) as child_id:
                logged = -1
                if tracker and going_on is None:
                    tracker.log_dict_params(cfg.model_dump(mode="json"))
                elif tracker:  # rounds after the checkpoint the stopped run had logged already
                    logged = max((m.step for m in tracker.client.get_metric_history(child_id, "cum_bytes")),
                                 default=-1)
                    bar.completed(int(going_on["state"]["round"]))

                def on_round(step: int, m: dict[str, float]) -> None:
                    if tracker and step > logged:
                        tracker.log_metrics(m, step)
                    bar.advance(f"val {metric} {m['val_auroc_mean']:.3f}  bw {m['rel_bandwidth']:.2f}x")

                def on_checkpoint(tau: int, snap: Callable[[], dict[str, Any]], seed: int = seed,
                                  child: str | None = child_id) -> None:
                    if writes and cadence.due(tau):
                        write_checkpoint({"seed": seed, "child": child, "state": snap()})

                res = run_one(cfg, data, seed, on_round, checkpoint=on_checkpoint,
                              resume=going_on["state"] if going_on is not None else None)
                results.append(res)
                if tracker:
                    tracker.log_final(res.summary())
                    tracker.set_tags(engine_tags(kernels.build_info()))
                    log_clinical(tracker, res.clinical, res.rounds_run)
                    tracker.log_json(publishable_per_center(res.per_center), "per_center.json")
                    for name, obj in res.artifacts.items():
                        tracker.log_json(obj, name)
                    tracker.log_json(cfg.model_dump(mode="json"), "config.json")
            bar.end_unit()
            write_checkpoint(None)  # the seed is done: a resume keeps its result
        doc = results_document(cfg, str(cohort_dir), results)
        doc["n_centers"] = data.n_centers
        doc["metric"] = data.metric_name  # "final_auroc_*" hold accuracy on an image federation
        doc["dropped_centers"] = dict(data.dropped)  # counts only (federation.data.tensors.FederatedData.dropped)
        if tracker:
            tracker.log_json(doc, "results.json")
    if output is not None:
        # without overwrite: created only if absent at commit time (another run may have written it meanwhile)
        write_results(output, doc, exclusive=not overwrite)
    if ck_path is not None:
        ck_path.unlink(missing_ok=True)  # the run is complete
    return doc


def dropped_message(dropped: dict[str, int], n_kept: int) -> str | None:
    """The console line for the centers :meth:`FederatedData.from_cohort` left out (counts only),
    e.g. ``note: 32 of 95 centers (37 stays, 8 deaths) left out: fewer than 1 train row(s)``;
    None when none was."""
    k = int(dropped.get("centers", 0))
    if not k:
        return None
    m = int(dropped.get("min_train", 1))
    why = "no train rows" if m <= 1 else f"fewer than {m} train rows"
    return (f"note: {k} of {k + n_kept} centers ({dropped.get('stays', 0)} stays, {dropped.get('deaths', 0)} "
            f"deaths) left out: {why}")


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None



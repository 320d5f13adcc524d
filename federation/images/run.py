"""The SAGE benchmark (``abps train --config configs/sage-*.yaml``): every configured selector on one
shared partition, graph and initialisation per seed (Sec. V-A), scored on the shared test set and the
clients' local splits, logged to MLflow and results.json. A round is the clients' local epoch, then the
selector's round, :class:`federation.methods.sage_selector.SageRound`, as the method ``sage`` runs it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from etl.errors import InputError
from etl.images import ImageDataset
from federation.core.graphs import neighbour_table
from federation.core.image_metrics import accuracy, confusion_matrices, macro_f1
from federation.core.ledger import Ledger
from federation.core.loop import EvalSchedule, drive
from federation.data.image_shards import (
    ClientShards,
    load_image_dataset,
    make_graph,
    make_shards,
    probe_bytes_per_anchor,
    subsample,
)
from federation.engine.image_model import ModelSpec, StackedModel, model_spec_for
from federation.methods.registry import get_selector, selector_names
from federation.methods.sage_rule import evidence_saving
from federation.methods.sage_selector import SageRound, SageStep
from federation.methods.selectors import SageConfig, Selector, SelectorStats, parse_config
from federation.run.checkpoint import (
    UnitCheckpoints,
    benchmark_stamp,
    data_id,
    global_streams,
    logged_steps,
    restore_global_streams,
)
from federation.run.progress import RoundProgress
from federation.run.results import results_file, write_results
from federation.run.tracking import BENCHMARK_TAG, SELECTOR_TAG, Tracker

#: ``checkpoint(tau, snapshot)`` after round ``tau`` when the run goes on (:func:`run_selector`)
CheckpointHook = Callable[[int, Callable[[], dict[str, Any]]], None]


def load_dataset(cfg: SageConfig) -> tuple[ImageDataset, ModelSpec]:
    """The configured data set and its model spec (Fashion-MNIST default, CIFAR-10 from data_root)."""
    return load_image_dataset(cfg.dataset, cfg.data_root), model_spec_for(cfg.dataset)


# --- evaluation ---------------------------------------------------------------------------

def evaluate(model: StackedModel, shards: ClientShards, precision: str = "fp32") -> dict[str, float]:
    """Global accuracy / macro-F1 (shared test set, mean over clients) and client / worst-client
    accuracy on the local evaluation splits (Tables I-II).

    ``precision="int8"`` runs the shared test set through :func:`federation.images.int8.predict_shared_int8`
    (quantized encoder convolutions; >= 99.5 % agreement with fp32 is tested); the local splits stay fp32.
    """
    if precision == "int8":
        from federation.images.int8 import predict_shared_int8  # torch.ao quantization: loaded only when asked

        pred = predict_shared_int8({n: v for n, v in model.params.items() if not n.startswith("decoder.")},
                                   shards.x_test)
    else:
        pred = model.predict_shared_inputs(shards.x_test)
    acc = accuracy(shards.y_test, pred)
    f1 = macro_f1(confusion_matrices(shards.y_test, pred, shards.n_classes))
    k, width = shards.eval_index.shape
    rows = shards.eval_index
    emask = torch.arange(width)[None, :] < shards.n_eval[:, None]
    epred = model.predict_pairs(shards.x_train, torch.arange(k), rows)
    cacc = accuracy(shards.y_train[rows], epred, emask)
    has = ~torch.isnan(cacc)
    return {"global_acc": float(acc.mean()), "macro_f1": float(f1.mean()),
            "client_acc": float(cacc[has].mean()) if bool(has.any()) else float("nan"),
            "worst_client_acc": float(cacc[has].min()) if bool(has.any()) else float("nan")}


# --- tracking -----------------------------------------------------------------------------

def make_tracker(tracking_uri: str | None, experiment: str | None):
    """A ``federation.run.tracking.Tracker`` (None = the default store ``sqlite:///mlflow/mlflow.db``);
    ``tracking_uri="none"`` disables MLflow and returns None."""
    if tracking_uri is not None and tracking_uri.strip().lower() in ("", "none"):
        return None
    return Tracker(tracking_uri, experiment or "sage")


# --- the round loop -----------------------------------------------------------------------

def run_selector(selector: str, cfg: SageConfig, shards: ClientShards, spec: ModelSpec,
                 cand: Tensor, cand_valid: Tensor, degree: Tensor, seed: int,
                 tracker=None, checkpoint: CheckpointHook | None = None, resume: dict[str, Any] | None = None,
                 logged: int = -1) -> dict[str, Any]:
    """Train K clients for ``cfg.rounds`` rounds under one selector; returns its history and summary.

    Same seed -> same result: the initialisation, batch orders and anchor draws depend only on
    ``seed`` (shared across selectors), the selector's random draws on (seed, selector).

    Args:
        checkpoint: ``checkpoint(tau, snapshot)`` after every round the run goes on from;
            ``snapshot()`` is the round state (parameters, Adam moments, random streams, selector
            and its stop state, ledger, totals, clocks, metrics so far; federation/run/checkpoint.py).
        resume: a state ``snapshot()`` returned (same config, data, seed and selector): the run
            goes on after its round, with the uninterrupted run's figures (the ``seconds_*``
            wall times aside).
        logged: rounds up to this one are in MLflow already (a resumed run): not logged again.
    """
    k = shards.n_clients
    model = StackedModel(spec, k, seed, lr=cfg.lr, recon_weight=cfg.recon_weight)
    m_max = cfg.schedule[-1]
    g_data = torch.Generator().manual_seed(seed)
    g_sel = torch.Generator().manual_seed(seed * 1000 + selector_names().index(selector) + 1)
    cls = get_selector(selector)
    sage_round = SageRound(cls(cfg, cand, cand_valid, degree, shards.n_train, g_sel), cand, cand_valid, degree,
                           torch.tensor(cfg.schedule, dtype=torch.long),
                           probe_bytes_per_anchor(shards.x_train, shards.n_classes))
    # Traffic through the runtime's ledger (one bandwidth definition with the clinical runs): the
    # model-bearing block omega on each undirected edge that carried one, plus probe bytes.
    shared_params = sum(model.params[n][0].numel() for n in model.shared_names)
    ledger = Ledger(k, sum(p[0].numel() for p in model.params.values()), reference_rounds=cfg.rounds)
    stats = SelectorStats()
    stop_labels = [f"stop_at_{m}" for m in cfg.schedule]
    clock = {"train": 0.0, "probe_mix": 0.0, "eval": 0.0, "start": 0.0, "mixed": 0.0}

    def step(t: int) -> dict[str, float]:
        """Round t: local epoch(s), then the selector's round (anchors, probe, decide, mix), ledger."""
        clock["start"] = t0 = time.perf_counter()
        loss = 0.0
        for _ in range(cfg.local_epochs):
            loss = model.local_epoch(shards.x_train, shards.y_train, shards.train_index, shards.n_train,
                                     cfg.batch_size, g_data)
        t1 = time.perf_counter()
        st = sage_round(t, model, shards, model, g_data)
        model.mix_shared(st.w)
        clock["mixed"] = time.perf_counter()
        clock["train"] += t1 - t0
        clock["probe_mix"] += clock["mixed"] - t1
        row = _round_metrics(cls, st, degree, m_max, stats, stop_labels, k)
        rb = ledger.record(t, st.adjacency, 0, shared_params, 4, probe_bytes=st.probe_bytes)
        row.update(model_bytes=float(rb.model_bytes), probe_bytes=float(rb.probe_bytes),
                   edges=float(rb.edges))
        row["train_loss"] = loss
        return row

    records: list[tuple[int, dict[str, float]]] = []

    def record(tau: int, row: dict[str, float]) -> None:
        now = time.perf_counter()
        clock["eval"] += now - clock["mixed"]
        row["seconds_round"] = now - clock["start"]
        records.append((tau, row))
        if tracker is not None and tau > logged:
            tracker.log_metrics(row, step=tau)

    def snapshot(tau: int) -> dict[str, Any]:
        """Everything round tau reads (federation/run/checkpoint.py)."""
        return {"round": tau, "records": list(records), "params": model.params,
                "adam": (model.opt.m, model.opt.v, model.opt.steps), "g_data": g_data.get_state(),
                "rule": dict(vars(sage_round.rule)), "ledger": list(ledger.rounds), "stats": stats,
                "clock": dict(clock), "global": global_streams()}

    start = 0
    if resume is not None:
        start = int(resume["round"])
        with torch.no_grad():
            for n, v in resume["params"].items():
                model.params[n].copy_(v)
            for buf, v in zip((model.opt.m, model.opt.v, model.opt.steps), resume["adam"]):
                buf.copy_(v)
        g_data.set_state(resume["g_data"])
        vars(sage_round.rule).update(resume["rule"])
        ledger.rounds[:] = resume["ledger"]
        stats = resume["stats"]
        clock.update(resume["clock"])
        restore_global_streams(resume["global"])
        records[:] = resume["records"]
    after = (lambda tau: checkpoint(tau, lambda: snapshot(tau))) if checkpoint is not None else None
    history = [row for _, row in drive(cfg.rounds, step, lambda tau: evaluate(model, shards, cfg.eval_precision),
                                       EvalSchedule(every=cfg.eval_every), on_record=record, start=start,
                                       records=list(records), after=after).records]
    t_train, t_probe, t_eval = clock["train"], clock["probe_mix"], clock["eval"]
    summary = _summary(cls, stats, history, cfg.schedule, m_max, k, cfg.rounds)
    summary.update(seconds_train=t_train, seconds_probe_mix=t_probe, seconds_eval=t_eval,
                   model_bytes=ledger.model_bytes, probe_bytes=ledger.probe_bytes,
                   total_bytes=ledger.total_bytes, rel_bandwidth=ledger.relative_bandwidth)
    return {"history": history, "summary": summary}


def _round_metrics(cls: type[Selector], st: SageStep, degree: Tensor, m_max: int, stats: SelectorStats,
                   stop_labels: list[str], k: int) -> dict:
    dec = st.decision
    n_ex = int((dec.peers >= 0).sum())
    row: dict[str, float] = {"comm_oh": n_ex / k, "model_exchanges": float(n_ex)}
    stats.exchanges += n_ex
    if cls.evidence:
        row["budget_consumed"] = 1.0 - evidence_saving(dec.anchors_used, degree, m_max)
        row["probe_evaluations"] = st.probe_evaluations
        stats.d_m += row["probe_evaluations"]
        stats.d_sum += float(degree.to(torch.float64).sum())
        stats.decisions += k
    if cls.anchor_rule:
        row["rg_fallback_rate"] = float(dec.gossip.to(torch.float64).mean())
        row["cost_rg_rate"] = float(dec.cost_gossip.to(torch.float64).mean())
        row["certified_rate"] = float(dec.certified.to(torch.float64).mean())
        row["no_anchor_rate"] = float(dec.no_anchor.to(torch.float64).mean())
        stats.gossip += int(dec.gossip.sum())
        stats.cost_gossip += int(dec.cost_gossip.sum())
        stats.certified += int(dec.certified.sum())
        stats.no_anchor += int(dec.no_anchor.sum())
        for i, lab in enumerate(stop_labels):
            c = int((dec.stop_stage == i).sum())
            row[lab] = c / k
            stats.stop_counts[lab] = stats.stop_counts.get(lab, 0) + c
    return row


def _summary(cls: type[Selector], stats: SelectorStats, history: list[dict], schedule: list[int],
             m_max: int, k: int, rounds: int) -> dict[str, Any]:
    last = next((h for h in reversed(history) if "global_acc" in h), {})
    out: dict[str, Any] = {
        "selector": cls.display,
        "global_acc": last.get("global_acc"), "macro_f1": last.get("macro_f1"),
        "client_acc": last.get("client_acc"), "worst_client_acc": last.get("worst_client_acc"),
        "comm_oh": stats.exchanges / (k * rounds),
    }
    if stats.decisions:
        out["budget_consumed"] = stats.d_m / (m_max * stats.d_sum) if stats.d_sum else 0.0
        out["saving"] = 1.0 - out["budget_consumed"]
    if cls.anchor_rule:
        n = stats.decisions
        out["stop_distribution"] = {lab: stats.stop_counts.get(lab, 0) / n for lab in
                                    [f"stop_at_{m}" for m in schedule]}
        out["stop_distribution"]["no_anchor"] = stats.no_anchor / n
        out["rg_fallback_rate"] = stats.gossip / n
        out["cost_rg_rate"] = stats.cost_gossip / n
        out["certified_rate"] = stats.certified / n
    return out


#: SageConfig fields that say how a run is run, not what it computes (not logged as its settings)
_RUN_ONLY = {"benchmark", "name", "seeds", "selectors", "num_threads", "checkpoint", "data_root"}


def config_name(cfg: SageConfig) -> str:
    """``sage-{dataset}-{graph}-{alpha}`` unless the config names itself."""
    return cfg.name or f"sage-{cfg.dataset}-{cfg.graph}-{cfg.alpha_dir:g}"


def cli_run(config: dict, rounds: int | None = None, seeds: list[int] | None = None,
            output: str | Path | None = None, tracking_uri: str | None = None,
            experiment: str | None = None, resume: bool = False, progress: bool = False) -> dict:
    """Run one SAGE configuration: every configured selector, every seed.

    With an ``output``, round checkpoints go to ``<results.json>.ckpt`` (the config's ``checkpoint``
    cadence; :class:`federation.run.checkpoint.UnitCheckpoints`, removed once results.json is
    written). ``resume=True`` goes on from that checkpoint: finished (seed, selector) runs are kept,
    the one under way goes on after its last checkpointed round in the same MLflow runs.

    Args:
        config: the YAML preset as a dict (``benchmark: sage``; see :class:`SageConfig`).
        rounds: override of ``rounds`` (quick runs).
        seeds: override of ``seeds``.
        output: a ``*.json`` file path, or a folder that receives ``results.json`` (written
            atomically); None = do not write.
        tracking_uri: MLflow tracking URI; None = the default store ``sqlite:///mlflow/mlflow.db``,
            ``"none"`` = no MLflow.
        experiment: MLflow experiment name (default "sage").
        resume: go on from the checkpoint beside ``output``.
        progress: show a progress bar over the (seed, selector) runs and the current one's rounds.
    Returns:
        {"config": ..., "graph": {...}, "runs": {seed: {selector: {"summary", "history"}}},
         "table": [summary rows]}. Resumed or not, the same figures (the ``seconds_*`` wall times aside).
    Raises:
        InputError: bad config option, missing data folder; with ``resume``: no checkpoint, or one
            of another run (config, data set, seeds, code version, MLflow store or experiment).
    """
    cfg = parse_config(config, rounds, seeds)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    ds_full, spec = load_dataset(cfg)
    for key, n, have in (("train_samples", cfg.train_samples, len(ds_full.y_train)),
                         ("test_samples", cfg.test_samples, len(ds_full.y_test))):
        if n is not None and n > have:  # a subset larger than the set is not the set: refused, not capped
            raise InputError(f"sage config: option '{key}': {n} is more than the {have} "
                             f"{key.split('_')[0].replace('train', 'training')} images of {cfg.dataset}")
    tracker = make_tracker(tracking_uri, experiment)
    name = config_name(cfg)
    target = results_file(output) if output is not None else None
    dump = cfg.model_dump(exclude={"checkpoint"})
    ck = UnitCheckpoints(target, benchmark_stamp(dump, data_id(ds_full.x_train, ds_full.y_train, ds_full.x_test,
                                                                ds_full.y_test) if target else "", cfg.seeds),
                         cfg.checkpoint, resume, tracker)
    result: dict[str, Any] = {"config": dump, "name": name, "runs": {}, "table": [], "graphs": {}}
    bar = RoundProgress(progress, cfg.rounds, len(cfg.seeds) * len(cfg.selectors), name, unit="runs")
    with bar:
        _run_seeds(cfg, ds_full, spec, tracker, ck, name, result, bar)
    if target is not None:
        write_results(target, result, indent=1)
    ck.remove()
    return result


def _run_seeds(cfg: SageConfig, ds_full: Any, spec: ModelSpec, tracker: Tracker | None, ck: UnitCheckpoints,
               name: str, result: dict[str, Any], bar: RoundProgress) -> None:
    """:func:`cli_run`'s seeds and selectors, into ``result``."""
    for seed in cfg.seeds:
        ds = subsample(ds_full, cfg.train_samples, cfg.test_samples, seed)
        shards = make_shards(ds, cfg.n_clients, cfg.alpha_dir, seed)
        g = make_graph(cfg.graph, cfg.n_clients, seed, cfg.er_p, cfg.ba_m)
        cand, cand_valid, degree = neighbour_table(g)
        result["graphs"][str(seed)] = {"mean_degree": float(degree.to(torch.float64).mean()),
                                       "min_degree": int(degree.min()), "max_degree": int(degree.max()),
                                       "edges": g.number_of_edges()}
        runs: dict[str, Any] = {}
        # every setting that changes what is computed (the report pools a configuration's runs only
        # when these agree); how it is run (threads, checkpoints, data folder) is left out
        params = {"config": name, "seed": seed, **{k: json.dumps(v) if isinstance(v, (dict, list)) else v
                                                   for k, v in cfg.model_dump(exclude=_RUN_ONLY).items()}}
        seed_done = f"{seed}" in ck.done  # every selector of the seed and its parent run finished
        parent = (ck.run(tracker, f"parent/{seed}", lambda: tracker.parent(f"{name}-seed{seed}", params))
                  if tracker and not seed_done else contextlib.nullcontext())
        with parent:
            for s in cfg.selectors:
                unit = f"{seed}/{s}"
                bar.start_unit(f"seed {seed} {get_selector(s).display}")
                if unit in ck.done:  # finished before the resume: its MLflow run is complete
                    out = ck.done[unit]
                else:
                    out = _tracked_selector(s, cfg, shards, spec, cand, cand_valid, degree, seed, tracker, ck,
                                            unit, name, params, bar)
                    ck.finish(unit, out)
                bar.end_unit()
                runs[s] = out
                result["table"].append({"seed": seed, **out["summary"]})
            if tracker and not seed_done:
                tracker.log_json(result["table"], "table.json")
        if not seed_done:
            ck.finish(f"{seed}", True)
        result["runs"][str(seed)] = runs


def _tracked_selector(s: str, cfg: SageConfig, shards: ClientShards, spec: ModelSpec, cand: Tensor,
                      cand_valid: Tensor, degree: Tensor, seed: int, tracker: Tracker | None,
                      ck: UnitCheckpoints, unit: str, name: str, params: dict[str, Any],
                      bar: RoundProgress) -> dict[str, Any]:
    """:func:`run_selector` in its MLflow child run (reopened when the unit goes on from a checkpoint),
    offering ``ck`` its round checkpoints; each round and the final metrics logged once."""
    display = get_selector(s).display
    going_on = ck.going_on(unit)
    child = (ck.run(tracker, f"child/{unit}", lambda: tracker.child(
        f"{name}-{display}-seed{seed}", {**params, "selector": display}, {BENCHMARK_TAG: "sage", SELECTOR_TAG: display}))
        if tracker else contextlib.nullcontext())
    with child as child_id:
        logged = logged_steps(tracker, child_id, "comm_oh") if tracker and going_on is not None else -1
        if going_on is not None:
            bar.completed(int(going_on["round"]))

        def after_round(tau: int, snap: Any) -> None:   # tau rounds done, the run goes on
            ck.offer(unit, tau, snap)
            bar.completed(tau)

        out = run_selector(s, cfg, shards, spec, cand, cand_valid, degree, seed, tracker,
                           checkpoint=after_round, resume=going_on, logged=logged)
        bar.completed(cfg.rounds)
        if tracker:
            have = set(tracker.client.get_run(child_id).data.metrics) if going_on is not None else set()
            final = {f"final_{key}": v for key, v in out["summary"].items()
                     if isinstance(v, (int, float)) and v is not None and f"final_{key}" not in have}
            tracker.log_metrics(final, step=cfg.rounds)
            tracker.log_json(out["summary"], "summary.json")
    return out

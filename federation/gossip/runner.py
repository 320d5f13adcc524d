"""Config-driven runs of the gossip benchmark (``benchmark: vv``, configs/vv-*.yaml) with MLflow
tracking: every (grid cell, arm, seed) is one simulation and one child run. The config's sections:
docs/gossip.md, "Module notes".
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import torch
from pydantic import ValidationError

from etl.errors import InputError
from etl.images import FASHION_MNIST_DIR, load_idx_dataset
from federation.core.config import CheckpointConfig, first_error
from federation.core.limits import MAX_THREADS
from federation.gossip.simulation import GossipConfig, GossipResult, idle_fields, simulate
from federation.run.checkpoint import UnitCheckpoints, benchmark_stamp, data_id, logged_steps
from federation.run.progress import RoundProgress
from federation.run.results import results_file, write_results
from federation.run.tracking import ARM_TAG, BENCHMARK_TAG, GRID_CELL_TAG, Tracker

_TOP_KEYS = {"benchmark", "name", "description", "data", "simulation", "grid", "arms", "seeds", "tracking", "output",
             "threads", "checkpoint"}


def _config_error(exc: ValidationError, where: str) -> InputError:
    loc, msg = first_error(exc)
    return InputError(f"vv config {where}.{loc}: {msg}" if loc else f"vv config {where}: {msg}")


def expand_runs(config: dict, rounds: int | None = None) -> list[tuple[dict, str, GossipConfig]]:
    """Expand a ``benchmark: vv`` config into its simulations.

    Args:
        config: the parsed YAML mapping.
        rounds: optional override of ``simulation.ticks`` for every run (refused when the grid
            or an arm sets ``ticks``).
    Returns:
        list of (grid cell overrides, arm name, validated GossipConfig), grid-major order. A
        ``simulation:`` field that the run's topology / partition / transfer_threshold does not read
        is left out of that run when another run reads it.
    Raises:
        InputError: wrong benchmark, unknown section, bad grid/arm entry (an arm that sets a key the
            grid varies), invalid option or one no run reads (the message names the option).
    """
    if config.get("benchmark") != "vv":
        raise InputError(f"vv config: benchmark must be 'vv', got {config.get('benchmark')!r}")
    unknown = set(config) - _TOP_KEYS
    if unknown:
        raise InputError(f"vv config: unknown section(s) {sorted(unknown)}")
    checkpoint_config(config)
    threads = config.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads <= MAX_THREADS):
        raise InputError(f"vv config threads: an integer from 0 (torch's default) to {MAX_THREADS}, got {threads!r}")
    for section, known in (("tracking", ("enabled", "experiment", "uri")), ("data", ("name", "root"))):
        sub = config.get(section)
        if sub is not None and not isinstance(sub, dict):
            raise InputError(f"vv config {section}: a mapping ({', '.join(known)})")
        extra = sorted(set(sub or {}) - set(known), key=str)
        if extra:  # a misspelt key would be ignored: refused
            raise InputError(f"vv config {section}: unknown key {extra[0]!r} (known: {', '.join(known)})")
    tracking = config.get("tracking") or {}
    if not isinstance(tracking.get("enabled", True), bool):
        raise InputError("vv config tracking.enabled: true or false")
    if not tracking.get("enabled", True) and tracking.get("uri") is not None:
        raise InputError("vv config tracking.uri: tracking is off (tracking.enabled: false); "
                         "drop tracking.uri or turn tracking on")
    base = dict(config.get("simulation") or {})
    grid = config.get("grid") or {}
    if not isinstance(grid, dict) or any(not isinstance(v, list) or not v for v in grid.values()):
        raise InputError("vv config: grid must map option names to non-empty lists")
    if "arms" in config and not config["arms"]:
        raise InputError("vv config: `arms` is empty (list at least one arm, or leave it out for plain vs corrected)")
    arms = config.get("arms") or [{"name": "plain", "averaging": "plain"},
                                  {"name": "variance_corrected", "averaging": "variance_corrected"}]
    names = [a.get("name") if isinstance(a, dict) else None for a in arms]
    if any(not n for n in names) or len(set(names)) != len(names):
        raise InputError("vv config: every arm needs a unique name")
    for arm in arms:  # the grid's values are the cells' labels: an arm that set one would run another
        varied = sorted(set(arm) & set(grid), key=str)
        if varied:
            raise InputError(f"vv config arm {arm['name']}: {varied[0]} is varied by grid.{varied[0]} "
                             f"{grid[varied[0]]}: drop it from the arm or from the grid")
    if rounds is not None:
        if rounds < 1:
            raise InputError(f"vv config: rounds (ticks) must be >= 1, got {rounds}")
        if "ticks" in grid:
            raise InputError(f"--rounds {rounds}: grid.ticks {grid['ticks']} sets the ticks of every run; "
                             "drop --rounds or grid.ticks")
        fixed = next((a["name"] for a in arms if "ticks" in a), None)
        if fixed is not None:
            raise InputError(f"--rounds {rounds}: arm {fixed} sets its own ticks; drop --rounds or the arm's ticks")
        base["ticks"] = int(rounds)
    keys = list(grid)
    plan = []
    for values in itertools.product(*(grid[k] for k in keys)):
        cell = dict(zip(keys, values))
        for arm in arms:
            merged = {**base, **cell, **{k: v for k, v in arm.items() if k != "name"}}
            if isinstance(merged.get("t_acquisition"), list):
                merged["t_acquisition"] = tuple(merged["t_acquisition"])
            plan.append((cell, arm, merged))
    # a simulation: field that some runs read and others do not (alpha over a grid of iid and
    # dirichlet partitions) is applied where it is read; one that no run reads is refused below
    idle = [idle_fields(merged) & (set(base) - set(cell) - set(arm)) for cell, arm, merged in plan]
    for key in set().union(*idle):
        if not all(key in i for i in idle):
            for (_, _, merged), i in zip(plan, idle):
                if key in i:
                    del merged[key]
    out = []
    for cell, arm, merged in plan:
        try:
            cfg = GossipConfig(**merged)
        except ValidationError as exc:
            where = f"arm {arm['name']}" + (f" (grid cell {_cell_label(cell)})" if cell else "")
            raise _config_error(exc, where) from None
        out.append((cell, arm["name"], cfg))
    return out


#: the gossip benchmark's checkpoint cadence unless the config says otherwise: a tick is short and a
#: checkpoint holds every node's parameters, momentum and buffer (about 250 MB at 50 LeNet-5 nodes),
#: so only the time trigger is on (docs/decisions.md, "Round checkpoints")
VV_CHECKPOINT = {"every_rounds": 0, "every_minutes": 10.0}


def checkpoint_config(config: dict) -> CheckpointConfig:
    """The config's ``checkpoint:`` section (round checkpoints of ``abps train``; a tick is a
    round), over :data:`VV_CHECKPOINT`.

    Raises:
        InputError: an unknown key or a bad value (naming ``checkpoint.<key>``).
    """
    section = config.get("checkpoint") or {}
    if not isinstance(section, dict):
        raise InputError("vv config checkpoint: must be a mapping (every_rounds, every_minutes)")
    try:
        return CheckpointConfig(**{**VV_CHECKPOINT, **section})
    except ValidationError as exc:
        raise _config_error(exc, "checkpoint") from None


def _cell_label(cell: dict) -> str:
    def fmt(v: Any) -> str:
        return "-".join(str(x) for x in v) if isinstance(v, (list, tuple)) else str(v)
    return ",".join(f"{k}={fmt(v)}" for k, v in cell.items()) or "base"


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def cli_run(config: dict, rounds: int | None = None, seeds: list[int] | None = None, output: str | None = None,
            tracking_uri: str | None = None, experiment: str | None = None, resume: bool = False,
            progress: bool = False) -> dict:
    """Run every (grid cell, arm, seed) of a ``benchmark: vv`` config; log to MLflow; write results JSON.

    Entry point of ``abps train --config configs/vv-*.yaml`` (the CLI dispatches here when the
    YAML says ``benchmark: vv``). Round checkpoints (a tick is a round) go to ``<results.json>.ckpt``
    at the config's ``checkpoint:`` cadence (:class:`federation.run.checkpoint.UnitCheckpoints`);
    ``resume=True`` keeps the finished simulations and goes on with the one under way from its
    last checkpointed tick, in the same MLflow runs.

    Args:
        config: parsed YAML (module docstring).
        rounds: override of the tick count (``simulation.ticks``).
        seeds: override of ``seeds`` (default [0]).
        output: results folder (default: config ``output`` or ``runs/<name>``); the JSON is
            ``<output>/results.json`` (or ``output`` itself when it ends in ``.json``).
        tracking_uri: MLflow URI (default: config ``tracking.uri``, else the project store
            ``sqlite:///mlflow/mlflow.db``); tracking is skipped when config ``tracking.enabled``
            is false.
        experiment: MLflow experiment (default: config ``tracking.experiment`` or "vv").
        resume: go on from the checkpoint beside the results JSON.
        progress: show a progress bar over the (cell, arm, seed) runs and the current one's ticks.
    Returns:
        the results document: {"benchmark", "name", "output", "runs": [...], "comparison": [...]};
        each run holds its cell, arm, seed, config, summary and curves. Resumed or not, the same
        figures (the ``wall_s`` / ``train_s`` seconds aside).
    Raises:
        InputError: invalid config (see :func:`expand_runs`) or unreadable data; with ``resume``: no
            checkpoint, or one of another run (config, data set, seeds, code version, MLflow store).
    """
    runs = expand_runs(config, rounds)
    if not (config.get("tracking") or {}).get("enabled", True) and tracking_uri:
        raise InputError("--tracking-uri: this vv config turns tracking off (tracking: {enabled: false}); "
                         "drop the option or turn tracking on")
    name = str(config.get("name") or "vv")
    seeds = list(seeds) if seeds else list(config.get("seeds") or [0])
    data_cfg = config.get("data") or {}
    data = load_idx_dataset(data_cfg.get("root", FASHION_MNIST_DIR), data_cfg.get("name", "fashion-mnist"))
    for cell, _, cfg in runs:  # before any MLflow run: each node trains on images of its own
        if cfg.n_nodes > len(data.y_train):
            where = f" (grid cell {_cell_label(cell)})" if cell else ""
            raise InputError(f"simulation.n_nodes {cfg.n_nodes}{where}: more nodes than the {len(data.y_train)} "
                             f"training images of {data.name} (each node needs at least one)")
    track_cfg = config.get("tracking") or {}
    json_path = results_file(output or config.get("output") or f"runs/{name}")
    if config.get("threads"):
        torch.set_num_threads(int(config["threads"]))

    tracker = None
    if track_cfg.get("enabled", True):
        tracker = Tracker(tracking_uri or track_cfg.get("uri"), experiment or track_cfg.get("experiment") or "vv")
    resolved = {"name": name, "data": data_cfg, "threads": config.get("threads"),
                "runs": {f"{a}|{_cell_label(c)}": g.model_dump() for c, a, g in runs}}
    ck = UnitCheckpoints(json_path, benchmark_stamp(resolved, data_id(data.x_train, data.y_train, data.x_test,
                                                                      data.y_test), seeds),
                         checkpoint_config(config), resume, tracker)

    results: list[dict] = []
    bar = RoundProgress(progress, 0, len(runs) * len(seeds), name, unit="runs")

    def run_one(cell: dict, arm: str, cfg: GossipConfig, seed: int) -> None:
        label = f"{arm}|{_cell_label(cell)}|seed{seed}"
        bar.start_unit(label, cfg.ticks)
        if label in ck.done:  # finished before the resume: its MLflow run is complete
            results.append(ck.done[label])
            bar.end_unit()
            return
        going_on = ck.going_on(label)

        def offer(t: int, snap: Any) -> None:   # t ticks done, the run goes on
            ck.offer(label, t, snap)
            bar.completed(t)

        params = {**cfg.model_dump(), "seed": seed, "arm": arm, "data": data.name}
        if tracker is None:
            res = simulate(cfg, data, seed, checkpoint=offer, resume=going_on)
        else:
            tags = {ARM_TAG: arm, GRID_CELL_TAG: _cell_label(cell), BENCHMARK_TAG: "vv"}
            with ck.run(tracker, f"child/{label}", lambda: tracker.child(label, params, tags)) as rid:
                logged = logged_steps(tracker, rid, "acc_mean") if going_on is not None else -1

                def on_eval(t: int, m: dict) -> None:
                    if t > logged:  # ticks the stopped run logged after its last checkpoint: not again
                        tracker.log_metrics(m, step=t)

                res = simulate(cfg, data, seed, on_eval=on_eval, checkpoint=offer, resume=going_on)
                have = set(tracker.client.get_run(rid).data.metrics) if going_on is not None else set()
                final = {k: float(v) for k, v in res.summary().items() if v is not None}
                # a final metric shares its key with no round metric; one the stopped run logged stays as it is
                tracker.log_metrics({k: v for k, v in final.items() if k not in have}, step=cfg.ticks)
                tracker.log_json(_clean({"summary": res.summary(), **res.curves()}), "curves.json")
        results.append(_clean({"cell": cell, "arm": arm, "seed": seed, "config": cfg.model_dump(),
                               "summary": res.summary(), "curves": res.curves()}))
        ck.finish(label, results[-1])
        bar.completed(cfg.ticks)
        bar.end_unit()

    def run_all() -> None:
        for (cell, arm, cfg), seed in itertools.product(runs, seeds):
            run_one(cell, arm, cfg, seed)

    with bar:
        if tracker is None:
            run_all()
        else:
            with ck.run(tracker, "parent", lambda: tracker.parent(
                    name, {"benchmark": "vv", "n_runs": len(runs) * len(seeds), "seeds": json.dumps(seeds),
                           "data": data.name}, {BENCHMARK_TAG: "vv"})):
                run_all()

    doc = {"benchmark": "vv", "name": name, "data": data.name, "output": str(json_path),
           "runs": results, "comparison": compare(results)}
    write_results(json_path, doc, indent=1)
    ck.remove()
    return doc


def compare(results: list[dict]) -> list[dict]:
    """Per grid cell and arm: mean over seeds of plateau delay, first / most reaching ticks.

    A reaching time that a seed never attained is counted as missing (the count of seeds that
    reached it is reported beside the mean).
    """
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        groups.setdefault((_cell_label(r["cell"]), r["arm"]), []).append(r["summary"])
    rows = []
    for (cell, arm), sums in groups.items():
        row: dict[str, Any] = {"cell": cell, "arm": arm, "n_seeds": len(sums)}
        for key in ("plateau_delay", "first_reach", "most_reach", "final_mean_accuracy"):
            vals = [s[key] for s in sums if s.get(key) is not None]
            row[key] = sum(vals) / len(vals) if vals else None
            row[f"{key}_n"] = len(vals)
        rows.append(row)
    return rows


__all__ = ["cli_run", "compare", "expand_runs", "GossipResult"]

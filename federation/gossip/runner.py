"""Config-driven runs of the gossip benchmark (``benchmark: vv``, configs/vv-*.yaml) with MLflow
tracking: every (grid cell, arm, seed) is one simulation and one child run. The config's sections:
docs/gossip.md, "Module notes".
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from etl.errors import InputError
from etl.images import FASHION_MNIST_DIR, load_idx_dataset
from federation.gossip.simulation import GossipConfig, GossipResult, simulate
from federation.run.results import write_results
from federation.run.tracking import ARM_TAG, BENCHMARK_TAG, GRID_CELL_TAG, Tracker

_TOP_KEYS = {"benchmark", "name", "description", "data", "simulation", "grid", "arms", "seeds", "tracking", "output",
             "threads"}


def _config_error(exc: ValidationError, where: str) -> InputError:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ()))
    return InputError(f"vv config {where}.{loc}: {first.get('msg')}")


def expand_runs(config: dict, rounds: int | None = None) -> list[tuple[dict, str, GossipConfig]]:
    """Expand a ``benchmark: vv`` config into its simulations.

    Args:
        config: the parsed YAML mapping.
        rounds: optional override of ``simulation.ticks`` for every run.
    Returns:
        list of (grid cell overrides, arm name, validated GossipConfig), grid-major order.
    Raises:
        InputError: wrong benchmark, unknown section, bad grid/arm entry or invalid option (the
            message names the option).
    """
    if config.get("benchmark") != "vv":
        raise InputError(f"vv config: benchmark must be 'vv', got {config.get('benchmark')!r}")
    unknown = set(config) - _TOP_KEYS
    if unknown:
        raise InputError(f"vv config: unknown section(s) {sorted(unknown)}")
    base = dict(config.get("simulation") or {})
    if rounds is not None:
        if rounds < 1:
            raise InputError(f"vv config: rounds (ticks) must be >= 1, got {rounds}")
        base["ticks"] = int(rounds)
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
    keys = list(grid)
    out = []
    for values in itertools.product(*(grid[k] for k in keys)):
        cell = dict(zip(keys, values))
        for arm in arms:
            merged = {**base, **cell, **{k: v for k, v in arm.items() if k != "name"}}
            if isinstance(merged.get("t_acquisition"), list):
                merged["t_acquisition"] = tuple(merged["t_acquisition"])
            try:
                cfg = GossipConfig(**merged)
            except ValidationError as exc:
                raise _config_error(exc, f"arm {arm['name']}") from None
            out.append((cell, arm["name"], cfg))
    return out


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
            tracking_uri: str | None = None, experiment: str | None = None) -> dict:
    """Run every (grid cell, arm, seed) of a ``benchmark: vv`` config; log to MLflow; write results JSON.

    Entry point of ``abps train --config configs/vv-*.yaml`` (the CLI dispatches here when the
    YAML says ``benchmark: vv``).

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
    Returns:
        the results document: {"benchmark", "name", "output", "runs": [...], "comparison": [...]};
        each run holds its cell, arm, seed, config, summary and curves.
    Raises:
        InputError: invalid config (see :func:`expand_runs`) or unreadable data.
    """
    runs = expand_runs(config, rounds)
    name = str(config.get("name") or "vv")
    seeds = list(seeds) if seeds else list(config.get("seeds") or [0])
    data_cfg = config.get("data") or {}
    data = load_idx_dataset(data_cfg.get("root", FASHION_MNIST_DIR), data_cfg.get("name", "fashion-mnist"))
    track_cfg = config.get("tracking") or {}
    out = Path(output or config.get("output") or f"runs/{name}")
    json_path = out if out.suffix == ".json" else out / "results.json"
    if config.get("threads"):
        torch.set_num_threads(int(config["threads"]))

    tracker = None
    if track_cfg.get("enabled", True):
        tracker = Tracker(tracking_uri or track_cfg.get("uri"), experiment or track_cfg.get("experiment") or "vv")

    results: list[dict] = []

    def run_one(cell: dict, arm: str, cfg: GossipConfig, seed: int) -> None:
        label = f"{arm}|{_cell_label(cell)}|seed{seed}"
        params = {**cfg.model_dump(), "seed": seed, "arm": arm, "data": data.name}
        if tracker is None:
            res = simulate(cfg, data, seed)
        else:
            with tracker.child(label, params, {ARM_TAG: arm, GRID_CELL_TAG: _cell_label(cell), BENCHMARK_TAG: "vv"}):
                res = simulate(cfg, data, seed, on_eval=lambda t, m: tracker.log_metrics(m, step=t))
                final = {k: float(v) for k, v in res.summary().items() if v is not None}
                tracker.log_metrics(final, step=cfg.ticks)
                tracker.log_json(_clean({"summary": res.summary(), **res.curves()}), "curves.json")
        results.append(_clean({"cell": cell, "arm": arm, "seed": seed, "config": cfg.model_dump(),
                               "summary": res.summary(), "curves": res.curves()}))

    def run_all() -> None:
        for (cell, arm, cfg), seed in itertools.product(runs, seeds):
            run_one(cell, arm, cfg, seed)

    if tracker is None:
        run_all()
    else:
        with tracker.parent(name, {"benchmark": "vv", "n_runs": len(runs) * len(seeds), "seeds": json.dumps(seeds),
                                   "data": data.name}, {BENCHMARK_TAG: "vv"}):
            run_all()

    doc = {"benchmark": "vv", "name": name, "data": data.name, "output": str(json_path),
           "runs": results, "comparison": compare(results)}
    write_results(json_path, doc, indent=1)
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

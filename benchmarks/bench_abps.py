"""Seconds per ABPS round (kappa 3, exact Shapley) against a FedAvg round at n = 230.
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from typing import Any

import numpy as np
import torch

from benchmarks.options import parser

#: target: an ABPS round (kappa 3, exact Shapley) within 1.5x a FedAvg round at n = 230
TARGET_RATIO = 1.5


def _time_method(name: str, data, rounds: int, seed: int) -> dict[str, Any]:
    from federation.core.config import build_config
    from federation.methods import get_method
    from federation.methods.registry import METHODS
    from federation.run.runner import run_one

    base_cls = get_method(name)
    hook_s: dict[str, list[float]] = {"plan_round": [], "after_exchange": []}

    class Timed(base_cls):  # type: ignore[misc, valid-type]
        def plan_round(self, ctx, round_idx):
            t0 = time.perf_counter()
            out = super().plan_round(ctx, round_idx)
            hook_s["plan_round"].append(time.perf_counter() - t0)
            return out

        def after_exchange(self, ctx, round_idx, plan):
            t0 = time.perf_counter()
            out = super().after_exchange(ctx, round_idx, plan)
            hook_s["after_exchange"].append(time.perf_counter() - t0)
            return out

    key = f"{name}-bench-timed"
    METHODS[key] = Timed
    stamps: list[float] = []
    cpu: list[float] = []
    try:
        cfg = build_config(name, base_cls.default_config, None, rounds=rounds)
        cfg = cfg.model_copy(update={"method": key})
        t_start, c_start = time.perf_counter(), time.process_time()
        res = run_one(cfg, data, seed, on_round=lambda r, m: (stamps.append(time.perf_counter()),
                                                               cpu.append(time.process_time())))
    finally:
        METHODS.pop(key, None)
    per_round = np.diff([t_start, *stamps]).tolist()
    steady = per_round[1:] if len(per_round) > 1 else per_round
    cpu_round = np.diff([c_start, *cpu]).tolist()
    out: dict[str, Any] = {
        "seconds_per_round": statistics.fmean(steady),
        "cpu_seconds_per_round": statistics.fmean(cpu_round[1:] if len(cpu_round) > 1 else cpu_round),
        "first_round_s": per_round[0],
        "rounds_s": per_round,
        "final_val_auroc_mean": res.final_val_auroc_mean,
    }
    for k, v in hook_s.items():
        if v:
            out[f"{k}_s"] = statistics.fmean(v[1:] if len(v) > 1 else v)
    if res.history and "coalitions_evaluated" in res.history[-1]:
        out["coalitions_per_round"] = statistics.fmean(h["coalitions_evaluated"] for h in res.history)
        out["mean_partners"] = statistics.fmean(h["mean_partners"] for h in res.history)
    return out


def _merge(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """One method's figures over interleaved passes: per-round and per-hook seconds are the
    median of the passes' means; the rest from the first pass, plus every pass's rounds."""
    out = dict(passes[0])
    for key in ("seconds_per_round", "cpu_seconds_per_round", "plan_round_s", "after_exchange_s"):
        if key in out:
            out[key] = statistics.median(p[key] for p in passes)
    out["rounds_s"] = [p["rounds_s"] for p in passes]
    return out


def _time_matching(n: int, reps: int = 50) -> float:
    from abps.beliefs import BetaBeliefs
    from abps.matching import propose_reject

    g = torch.Generator().manual_seed(0)
    b = BetaBeliefs.prior(n)
    b.update(torch.rand(n, n, generator=g, dtype=torch.float64), torch.rand(n, n, generator=g) < 0.05)
    ucb = b.ucb(10, 2.0)
    cand = ~torch.eye(n, dtype=torch.bool)
    t0 = time.perf_counter()
    for r in range(reps):
        propose_reject(ucb, cand, 3, 0.5, 0.1, np.random.default_rng(r))
    return (time.perf_counter() - t0) / reps


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns (and prints) the result document."""
    ap = parser(__doc__, centers=230, rounds=3, threads=1, seed=11, passes=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)

    from federation.data.synthetic import generate_fedprox_cohort
    from federation.data.tensors import FederatedData
    from federation.engine import kernels

    cohort, centers = generate_fedprox_cohort(a.centers, seed=0)
    data = FederatedData.from_frames(cohort, centers)
    # interleaved passes (FedAvg, ABPS, FedAvg, ABPS) so both see the same machine load
    runs: dict[str, list[dict[str, Any]]] = {"fedavg": [], "abps": []}
    for _ in range(a.passes):
        for name in runs:
            runs[name].append(_time_method(name, data, a.rounds, a.seed))
    fedavg, abps = (_merge(runs[k]) for k in ("fedavg", "abps"))
    doc = {
        "benchmark": "abps round vs fedavg round",
        "centers": data.n_centers,
        "features": data.d,
        "train_rows": int(data.n_train.sum()),
        "rounds": a.rounds,
        "threads": a.threads,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "fedavg": fedavg,
        "abps": abps,
        "load_1min_after": os.getloadavg()[0],
        "abps_over_fedavg": abps["seconds_per_round"] / fedavg["seconds_per_round"],
        "abps_over_fedavg_cpu": abps["cpu_seconds_per_round"] / fedavg["cpu_seconds_per_round"],
        "target_abps_over_fedavg": TARGET_RATIO,
        "matching_only_s": _time_matching(data.n_centers),
        "engine_kernels": kernels.available(),
    }
    text = json.dumps(doc, indent=2)
    print(text)
    ok = "met" if doc["abps_over_fedavg"] <= TARGET_RATIO else "MISSED"
    print(f"FedAvg {fedavg['seconds_per_round']:.3f} s/round, ABPS {abps['seconds_per_round']:.3f} s/round "
          f"(Shapley credit {abps.get('after_exchange_s', float('nan')):.3f} s): ratio {doc['abps_over_fedavg']:.2f}x "
          f"(CPU time {doc['abps_over_fedavg_cpu']:.2f}x), target <= {TARGET_RATIO}x: {ok}; "
          f"n = {data.n_centers}, {a.threads} thread(s), load {doc['load_1min_after']:.1f} on {os.cpu_count()} CPUs; "
          f"engine step: {'fused C++ kernels' if doc['engine_kernels'] else 'eager PyTorch'}",
          flush=True)
    if a.out:
        from etl.io import atomic_write_text

        atomic_write_text(a.out, text + "\n")
    return doc


if __name__ == "__main__":
    main()

"""Memory is flat over a long run: resident memory after round 200 within 5 % of round 20.
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
from typing import Any

import torch


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _measure(method: str, data: Any, rounds: int, early: int, seed: int) -> dict[str, Any]:
    from federation.core.config import build_config
    from federation.methods import get_method
    from federation.run.runner import run_one

    cls = get_method(method)
    cfg = build_config(method, cls.default_config, {"engine": {"local_epochs": 1}}, rounds)
    marks: dict[int, float] = {}

    def on_round(step: int, _metrics: dict[str, float]) -> None:
        if step in (early, rounds):
            gc.collect()
            marks[step] = _rss_mb()

    res = run_one(cfg, data, seed, on_round)
    ratio = marks[rounds] / marks[early]
    return {"rounds_run": res.rounds_run, f"rss_mb_round_{early}": round(marks[early], 1),
            f"rss_mb_round_{rounds}": round(marks[rounds], 1), "ratio": round(ratio, 4)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns (and prints) the result document. Raises RuntimeError when a
    method's memory grows by more than the tolerance between the two marks."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--centers", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--early", type=int, default=20)
    ap.add_argument("--methods", nargs="+", default=["fedavg", "abps"])
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if not 1 <= a.early < a.rounds:
        raise SystemExit("--early must be >= 1 and below --rounds")
    torch.set_num_threads(a.threads)

    from federation.data.synthetic import generate_fedprox_cohort
    from federation.data.tensors import FederatedData

    cohort, centers = generate_fedprox_cohort(a.centers, seed=0)
    data = FederatedData.from_frames(cohort, centers)
    methods = {m: _measure(m, data, a.rounds, a.early, a.seed) for m in a.methods}
    for r in methods.values():
        r["flat"] = r["ratio"] <= 1.0 + a.tolerance
    doc = {"benchmark": "resident memory over rounds", "centers": data.n_centers, "rounds": a.rounds,
           "early_round": a.early, "tolerance": a.tolerance, "threads": a.threads, "torch": torch.__version__,
           "machine": platform.processor() or platform.machine(), "methods": methods}
    text = json.dumps(doc, indent=2)
    print(text)
    if a.out:
        from etl.io import atomic_write_text

        atomic_write_text(a.out, text + "\n")
    grown = [m for m, r in methods.items() if not r["flat"]]
    if grown:
        raise RuntimeError(f"memory grew by more than {a.tolerance:.0%} from round {a.early} to {a.rounds}: "
                           + ", ".join(f"{m} x{methods[m]['ratio']:.3f}" for m in grown))
    return doc


if __name__ == "__main__":
    main()

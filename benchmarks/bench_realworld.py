"""Real-world conditions at scale: n FedProx-Synthetic centers at 30 % availability (daily
cycle, configs/realworld-daily30.yaml) with heterogeneous links (configs/realworld-hetero-links.yaml):
seconds per round and peak RSS against the 16 GB budget.
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_scale import _current_rss_gb, _rss_gb
from benchmarks.options import parser

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TARGET_PEAK_GB = 16.0


def realworld_block() -> dict[str, Any]:
    """The ``realworld:`` block of the benchmark: daily 30 % availability and 1-100 Mbit/s links."""
    from federation.core.config import deep_merge, load_yaml

    daily = load_yaml(CONFIGS / "realworld-daily30.yaml")
    links = load_yaml(CONFIGS / "realworld-hetero-links.yaml")
    return deep_merge(daily, links)


def _worker(method: str, n: int, rounds: int, seed: int, threads: int) -> dict[str, Any]:
    import gc

    import torch

    torch.set_num_threads(threads)
    from federation.core.config import build_config
    from federation.data.synthetic import generate_fedprox_cohort
    from federation.data.tensors import FederatedData
    from federation.methods import get_method
    from federation.run.runner import run_one

    t0 = time.perf_counter()
    cohort, centers = generate_fedprox_cohort(n, seed=0)
    data = FederatedData.from_frames(cohort, centers)
    del cohort, centers
    gc.collect()
    build_s = time.perf_counter() - t0
    rss_data = _current_rss_gb()
    cfg = build_config(method, get_method(method).default_config, realworld_block(), rounds=rounds)
    stamps: list[float] = []
    cpu: list[float] = []
    t1, c1 = time.perf_counter(), time.process_time()
    res = run_one(cfg, data, seed, on_round=lambda r, m: (stamps.append(time.perf_counter()),
                                                           cpu.append(time.process_time())))
    walls = [b - a for a, b in zip([t1, *stamps], stamps)]
    cpus = [b - a for a, b in zip([c1, *cpu], cpu)]
    h = res.history
    return {
        "method": method, "centers": data.n_centers, "rounds": len(walls), "build_s": build_s,
        "first_round_s": walls[0], "s_per_round": statistics.fmean(walls[1:] or walls),
        "cpu_s_per_round": statistics.fmean(cpus[1:] or cpus), "rss_after_data_gb": rss_data,
        "peak_rss_gb": _rss_gb(), "available_share_mean": statistics.fmean(x["available_share"] for x in h),
        "virtual_hours": h[-1]["virtual_hours"], "round_seconds_mean": statistics.fmean(x["round_seconds"] for x in h),
        "final_val_auroc_mean": res.final_val_auroc_mean,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints (and returns) the JSON document."""
    ap = parser(__doc__, centers=1000, rounds=50, methods="fedavg,abps", seed=11, threads=1)
    a = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    results = []
    for m in [x for x in a.methods.split(",") if x]:
        with ctx.Pool(1) as pool:
            r = pool.apply(_worker, (m, a.centers, a.rounds, a.seed, a.threads))
        results.append(r)
        print(f"{m:8s} n = {r['centers']}: {r['s_per_round']:.2f} s/round wall, {r['cpu_s_per_round']:.2f} CPU s/round, "
              f"peak RSS {r['peak_rss_gb']:.2f} GB, available {r['available_share_mean']:.3f}, "
              f"{r['virtual_hours']:.1f} virtual h", flush=True)
    doc = {"benchmark": "realworld: 30 % daily availability + 1-100 Mbit/s links", "centers": a.centers,
           "rounds": a.rounds, "threads": a.threads, "cpus": os.cpu_count(), "load": os.getloadavg()[0],
           "target_peak_gb": TARGET_PEAK_GB, "results": results}
    text = json.dumps(doc, indent=2)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)
    return doc


if __name__ == "__main__":
    main()

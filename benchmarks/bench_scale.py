"""Scale: FedAvg and ABPS on 10,000 FedProx-Synthetic centers (issue 14): seconds per round, peak RSS.

Usage::

    python -m benchmarks.bench_scale [--centers 10000] [--rounds 5] [--methods fedavg,abps]
        [--threads 1] [--out FILE.json]

Each method runs in a fresh child process (so that its peak RSS, ``ru_maxrss``, is its own): the
child draws the cohort (``generate_fedprox_cohort(n, seed=0)``: FedProx-Synthetic(1, 1), mean 300
stays per center, lognormal sizes), builds :class:`federation.data.FederatedData`, and runs
:func:`federation.runner.run_one` for ``--rounds`` rounds with the method's default config. Reported
per method: cohort build seconds, seconds per round (first round separately; mean of the others),
peak RSS in GB and the RSS after the data was built, against the issue's target of 16 GB peak.

At this size every ``[n, n]`` object matters: FedAvg's rank-one ``W`` is mixed once and broadcast,
ABPS's ``W`` (kappa + 1 non-zeros per row) and its coalition rows are mixed by gathering
(``federation.mixing.mix``, ``Context.evaluate_mixtures``), and the engine splits a step into
segments of at most ``StackedEngine.max_segment`` centers.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import time
from typing import Any

#: issue 14 target: peak resident memory of a 10,000-center run
TARGET_PEAK_GB = 16.0


def _rss_gb() -> float:
    """Peak RSS so far in GiB: ``ru_maxrss`` (KiB on Linux), never below the current RSS (the
    kernel's high-water mark can trail the live figure by a few pages)."""
    return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0**2, _current_rss_gb())


def _current_rss_gb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 1024.0**3


def _worker(method: str, n: int, rounds: int, seed: int, threads: int) -> dict[str, Any]:
    """One method in this (child) process; returns its figures."""
    import gc

    import torch

    torch.set_num_threads(threads)
    from federation.config import build_config
    from federation.data import FederatedData
    from federation.methods import get_method
    from federation.runner import run_one
    from federation.synthetic import generate_fedprox_cohort

    import polars as pl
    import psutil

    t0 = time.perf_counter()
    cohort, centers = generate_fedprox_cohort(n, seed=0)
    # the stacked splits are padded to the largest center: refuse a run this machine cannot hold
    widest = cohort.group_by(["center_id", "split"]).len().group_by("split").agg(pl.col("len").max())
    need = _memory_estimate_gb(n, int(widest["len"].sum()))
    avail = psutil.virtual_memory().available / 1024.0**3
    if need > avail:
        return {"method": method, "centers": n, "skipped": f"needs about {need:.1f} GB (padded splits "
                f"{widest['len'].sum()} rows wide, parameters and Adam state), {avail:.1f} GB available"}
    data = FederatedData.from_frames(cohort, centers)
    del cohort, centers
    gc.collect()
    build_s = time.perf_counter() - t0
    rss_data = _current_rss_gb()
    cls = get_method(method)
    cfg = build_config(method, cls.default_config, None, rounds=rounds)
    stamps: list[float] = []
    cpu: list[float] = []
    t1 = time.perf_counter()
    c1 = time.process_time()
    res = run_one(cfg, data, seed, on_round=lambda r, m: (stamps.append(time.perf_counter()),
                                                           cpu.append(time.process_time())))
    walls = [b - a for a, b in zip([t1, *stamps], stamps)]
    cpus = [b - a for a, b in zip([c1, *cpu], cpu)]
    steady = walls[1:] if len(walls) > 1 else walls
    return {
        "method": method, "centers": data.n_centers, "train_rows": int(data.n_train.sum()),
        "max_train_rows": int(data.n_train.max()), "build_s": build_s, "rounds": len(walls),
        "first_round_s": walls[0], "s_per_round": statistics.fmean(steady), "rounds_s": walls,
        "cpu_s_per_round": statistics.fmean(cpus[1:] if len(cpus) > 1 else cpus),
        "rss_after_data_gb": rss_data, "peak_rss_gb": _rss_gb(),
        "final_val_auroc_mean": res.final_val_auroc_mean,
    }


def _memory_estimate_gb(n: int, padded_rows: int, d: int = 64, n_params: int = 16_600) -> float:
    """Rough peak of a run: the padded splits (x float32 plus y and mask) twice (built from
    NumPy copies) and about 14 copies of the stacked parameters (parameters, Adam moments,
    round-start and pre-exchange copies, mixed block, sorted training copies), in GB."""
    data = n * padded_rows * (4 * d + 5) * 2
    return (data + 14 * n * n_params * 4) / 1024.0**3


def run_child(method: str, n: int, rounds: int, seed: int, threads: int) -> dict[str, Any]:
    """:func:`_worker` in a fresh ``spawn`` child process (its own peak RSS)."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_worker, (method, n, rounds, seed, threads))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints (and returns) the JSON document."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--centers", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--methods", default="fedavg,abps")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    load0 = os.getloadavg()[0]
    results = [run_child(m, a.centers, a.rounds, a.seed, a.threads) for m in a.methods.split(",") if m]
    doc: dict[str, Any] = {
        "benchmark": "scale: FedProx-Synthetic centers, seconds per round and peak RSS",
        "centers": a.centers, "rounds": a.rounds, "threads": a.threads, "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(), "load_1min_before": load0,
        "load_1min_after": os.getloadavg()[0], "target_peak_rss_gb": TARGET_PEAK_GB, "results": results,
    }
    text = json.dumps(doc, indent=2)
    print(text)
    for r in results:
        if "skipped" in r:
            print(f"{r['method']:8s} n = {r['centers']}: skipped: {r['skipped']}", flush=True)
            continue
        ok = "met" if r["peak_rss_gb"] <= TARGET_PEAK_GB else "MISSED"
        print(f"{r['method']:8s} n = {r['centers']}: {r['s_per_round']:.2f} s/round (first {r['first_round_s']:.2f} s, "
              f"cpu {r['cpu_s_per_round']:.2f} s), peak RSS {r['peak_rss_gb']:.2f} GB "
              f"(target <= {TARGET_PEAK_GB:.0f} GB: {ok}), data {r['rss_after_data_gb']:.2f} GB, "
              f"build {r['build_s']:.1f} s; load {load0:.1f} -> {doc['load_1min_after']:.1f}", flush=True)
    if a.out:
        from etl.io import atomic_write_text

        atomic_write_text(a.out, text + "\n")
    return doc


if __name__ == "__main__":
    main()

"""Scale: FedAvg and ABPS on 10,000 FedProx-Synthetic centers: seconds per round, peak RSS.
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import time
from typing import Any

from benchmarks.options import parser

#: target: peak resident memory of a 10,000-center run
TARGET_PEAK_GB = 16.0


def _rss_gb() -> float:
    """Peak RSS so far in GiB: ``ru_maxrss`` (KiB on Linux), never below the current RSS (the
    kernel's high-water mark can trail the live figure by a few pages)."""
    return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0**2, _current_rss_gb())


def _current_rss_gb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 1024.0**3


def _watchdog(limit_gb: float, floor_gb: float) -> None:
    """Exit this process (code 3) as soon as its RSS passes ``limit_gb`` or the machine's
    available memory falls below ``floor_gb``: a run too large for a shared machine stops
    itself instead of pushing the others into swap or the OOM killer."""
    import threading

    import psutil

    def watch() -> None:
        proc = psutil.Process()
        while True:
            rss, avail = proc.memory_info().rss / 1024.0**3, psutil.virtual_memory().available / 1024.0**3
            if rss > limit_gb or avail < floor_gb:
                print(f"[bench_scale] watchdog: RSS {rss:.1f} GB, available {avail:.1f} GB: stopping", flush=True)
                os._exit(3)
            time.sleep(0.25)

    threading.Thread(target=watch, daemon=True).start()


def _worker(methods: list[str], n: int, rounds: int, seed: int, threads: int, clinical: bool = True,
            limit_gb: float | None = None, floor_gb: float = 1.5) -> list[dict[str, Any]]:
    """The methods one after the other in this (child) process, on one cohort build; returns
    their figures. ``peak_rss_gb`` is the process's high-water mark when a method ends, so for
    every method after the first it is an upper bound of that method's own peak. With
    ``limit_gb``, a watchdog ends the process past that RSS or below ``floor_gb`` available
    (:func:`_watchdog`)."""
    import gc

    import torch

    torch.set_num_threads(threads)
    if limit_gb is not None:
        _watchdog(limit_gb, floor_gb)
    import psutil

    import federation.run.runner as runner
    from federation.core.config import build_config
    from federation.data.synthetic import generate_fedprox_cohort
    from federation.data.tensors import FederatedData
    from federation.methods import get_method

    t0 = time.perf_counter()
    cohort, centers = generate_fedprox_cohort(n, seed=0)
    need = _memory_estimate_gb(n, cohort.height)
    avail = psutil.virtual_memory().available / 1024.0**3
    if need > avail:
        return [{"method": m, "centers": n, "skipped": f"needs about {need:.1f} GB, {avail:.1f} GB available"}
                for m in methods]
    data = FederatedData.from_frames(cohort, centers)
    del cohort, centers
    gc.collect()
    build_s = time.perf_counter() - t0
    rss_data, peak_data = _current_rss_gb(), _rss_gb()
    if not clinical:  # the end-of-run clinical report (bootstrap CIs) is no part of a round
        runner.evaluate_final = lambda *a, **k: None  # type: ignore[assignment]
    out = []
    for method in methods:
        cls = get_method(method)
        cfg = build_config(method, cls.default_config, None, rounds=rounds)
        stamps: list[float] = []
        cpu: list[float] = []
        t1 = time.perf_counter()
        c1 = time.process_time()
        res = runner.run_one(cfg, data, seed, on_round=lambda r, m: (stamps.append(time.perf_counter()),
                                                                      cpu.append(time.process_time())))
        end_s = time.perf_counter() - stamps[-1]
        walls = [b - a for a, b in zip([t1, *stamps], stamps)]
        cpus = [b - a for a, b in zip([c1, *cpu], cpu)]
        steady = walls[1:] if len(walls) > 1 else walls
        out.append({
            "method": method, "centers": data.n_centers, "train_rows": int(data.n_train.sum()),
            "max_train_rows": int(data.n_train.max()), "build_s": build_s, "rounds": len(walls),
            "first_round_s": walls[0], "s_per_round": statistics.fmean(steady), "rounds_s": walls,
            "cpu_s_per_round": statistics.fmean(cpus[1:] if len(cpus) > 1 else cpus),
            "end_of_run_s": end_s, "clinical_report": clinical,
            "rss_after_data_gb": rss_data, "peak_rss_build_gb": peak_data, "peak_rss_gb": _rss_gb(),
            "final_val_auroc_mean": res.final_val_auroc_mean,
        })
        del res
        gc.collect()
    return out


def _memory_estimate_gb(n: int, rows: int, d: int = 64, k: int = 8, n_params: int = 16_600,
                        widest: int = 2_600) -> float:
    """Rough peak of a run, in GB: the packed rows (features float32, raw values float64, a few
    copies while building), the padded labels, masks and subgroup codes (``widest`` rows per
    center, ~37 bytes a cell over the three splits), about 14 copies of the stacked parameters
    (parameters, Adam moments, round-start and pre-exchange copies, mixed block, ...) and ABPS's
    dense ``[n, n]`` float64 state (beliefs, scores; about 8 such matrices)."""
    data = rows * (4 * d + 8 * k) * 3 + n * widest * 37
    return (data + 14 * n * n_params * 4 + 8 * 8 * n * n) / 1024.0**3


def run_child(methods: list[str], n: int, rounds: int, seed: int, threads: int, clinical: bool = True
              ) -> list[dict[str, Any]]:
    """:func:`_worker` in a fresh ``spawn`` child process (its own peak RSS)."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_worker, (methods, n, rounds, seed, threads, clinical, TARGET_PEAK_GB))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints (and returns) the JSON document."""
    ap = parser(__doc__, centers=10_000, rounds=5, methods="fedavg,abps", threads=1, seed=11)
    ap.add_argument("--one-process", action="store_true",
                    help="build the cohort once and run the methods one after the other in one child "
                         "(the later methods' peak RSS is then an upper bound)")
    ap.add_argument("--no-clinical", action="store_true",
                    help="leave out the end-of-run clinical report (bootstrap CIs), which is no part of a round")
    a = ap.parse_args(argv)
    load0 = os.getloadavg()[0]
    methods = [m for m in a.methods.split(",") if m]
    clinical = not a.no_clinical
    if a.one_process:
        results = run_child(methods, a.centers, a.rounds, a.seed, a.threads, clinical)
    else:
        results = [r for m in methods for r in run_child([m], a.centers, a.rounds, a.seed, a.threads, clinical)]
    doc: dict[str, Any] = {
        "benchmark": "scale: FedProx-Synthetic centers, seconds per round and peak RSS",
        "centers": a.centers, "rounds": a.rounds, "threads": a.threads, "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(), "load_1min_before": load0,
        "load_1min_after": os.getloadavg()[0], "target_peak_rss_gb": TARGET_PEAK_GB, "results": results,
        "one_process": a.one_process, "clinical_report": clinical,
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
              f"(target <= {TARGET_PEAK_GB:.0f} GB: {ok}; ratio {r['peak_rss_gb'] / TARGET_PEAK_GB:.2f}), "
              f"data {r['rss_after_data_gb']:.2f} GB (build peak {r['peak_rss_build_gb']:.2f} GB), "
              f"build {r['build_s']:.1f} s, end of run {r['end_of_run_s']:.1f} s; load {load0:.1f} -> {doc['load_1min_after']:.1f}", flush=True)
    if a.out:
        from etl.io import atomic_write_text

        atomic_write_text(a.out, text + "\n")
    return doc


if __name__ == "__main__":
    main()

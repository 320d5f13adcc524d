"""Gossip simulation speed: seconds per training tick, stacked (grouped conv / vmap) vs a per-node loop.

A "training tick" is a tick at which every node trains once on a batch of 64 (the synchronous
baseline, T_acquisition = 10, Sec. III-A of Tian et al. 2404.04616): one SGD step of all N
LeNet-5 models. Also timed: a whole simulated round (train + send + average + no evaluation)
through :func:`federation.gossip.simulate`.

``python -m benchmarks.bench_gossip [--nodes 50 1000] [--repeats 3] [--threads 2]``; prints the
speed-up with its target (>= 3x), the FLOP floor of a tick at this machine's measured GEMM rate
(the most any formulation can gain over the loop) and writes
``bench_out/gossip.json``. N = 1000 needs about 10 GB of memory (flat parameters, momentum,
buffers and gradients of 1000 x 431,080 float32) and is skipped when less is available.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import psutil
import torch
import torch.nn.functional as F

from benchmarks.options import machine_note, matmul_peak_gflops, sync
from etl.images import ImageDataset
from etl.io import atomic_write_text
from federation.gossip.model import (
    LENET5_LAYOUT,
    forward_single,
    init_stacked,
    lenet5_train_flops_per_image,
    stacked_gradients,
)
from federation.gossip.simulation import GossipConfig, simulate

#: the stacked training tick at least this many times faster than the per-node loop.
TARGET_SPEEDUP = 3.0
BYTES_PER_NODE = 431_080 * 4 * 6  # flat, momentum, buffer, gradient, gathered copies


def _time(fn, repeats: int, device: str = "cpu") -> float:
    fn()  # warm-up
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / repeats


def bench_step(n: int, repeats: int, loop: bool, device: str = "cpu") -> dict:
    """Seconds for one training step of n nodes on ``device``: stacked engines and (optionally) a
    per-node loop. The inputs are drawn on the CPU, so every device sees the same numbers."""
    gen = torch.Generator().manual_seed(0)
    flat = init_stacked(n, gen).to(device)
    x = torch.rand(n, 64, 1, 28, 28, generator=gen).to(device)
    y = torch.randint(0, 10, (n, 64), generator=gen).to(device)
    out = {"n_nodes": n, "tick_gflop": lenet5_train_flops_per_image() * x.shape[1] * n / 1e9}
    for engine in ("grouped", "vmap"):
        out[f"step_s_{engine}"] = _time(lambda: stacked_gradients(flat, x, y, engine), repeats, device)
    if loop:
        views = LENET5_LAYOUT.views(flat)

        def per_node():  # plain PyTorch per node: dense planar convolutions, one autograd pass each
            for i in range(n):
                p = {k: v[i].detach().requires_grad_(True) for k, v in views.items()}
                loss = F.cross_entropy(forward_single(p, x[i]), y[i])
                torch.autograd.grad(loss, list(p.values()))
        out["step_s_loop"] = _time(per_node, max(1, repeats // 2), device)
        out["speedup_grouped_vs_loop"] = out["step_s_loop"] / out["step_s_grouped"]
    return out


def bench_round(n: int, degree: int) -> dict:
    """Seconds per simulated tick (train + send + average), 3 synchronous rounds, no evaluation."""
    rng = np.random.default_rng(0)
    data = ImageDataset(rng.integers(0, 256, (6000, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 6000),
                        rng.integers(0, 256, (10, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 10), 10, "random")
    out = {}
    for averaging in ("plain", "variance_corrected"):
        cfg = GossipConfig(n_nodes=n, degree=degree, ticks=30, eval_every=10_000, test_subset=10,
                           averaging=averaging)
        r = simulate(cfg, data, seed=0)
        out[f"tick_s_{averaging}"] = r.wall_s / cfg.ticks
        out[f"round_s_{averaging}"] = r.wall_s / 3
        out[f"train_share_{averaging}"] = r.train_s / r.wall_s
    return out


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; print and write ``bench_out/gossip.json``; return the results."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[50])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv if argv is not None else [])
    torch.set_num_threads(args.threads)
    peak = matmul_peak_gflops()
    results = []
    for n in args.nodes:
        need = n * BYTES_PER_NODE
        if need > psutil.virtual_memory().available * 0.8:
            print(f"N={n}: skipped, needs about {need / 2**30:.1f} GiB")
            results.append({"n_nodes": n, "skipped": "memory"})
            continue
        row = bench_step(n, args.repeats, loop=n <= 100)
        row.update(bench_round(n, 8))
        row["threads"] = args.threads
        row["peak_gflops"] = peak
        row["floor_s"] = row["tick_gflop"] / peak
        row["load_average_1min"] = os.getloadavg()[0]
        print(json.dumps(row))
        if "speedup_grouped_vs_loop" in row:
            print(f"N={n}: stacked training tick {row['step_s_grouped']:.2f} s, per-node loop "
                  f"{row['step_s_loop']:.2f} s: {row['speedup_grouped_vs_loop']:.2f}x "
                  f"(target >= {TARGET_SPEEDUP:.0f}x, reached {row['speedup_grouped_vs_loop'] / TARGET_SPEEDUP:.2f} of it; "
                  f"{machine_note(args.threads, row['load_average_1min'])})")
            print(f"N={n}: FLOP floor of a training tick {row['tick_gflop']:.1f} GFLOP at this machine's fp32 GEMM "
                  f"peak ({peak:.0f} GFLOP/s, same run) = {row['floor_s']:.2f} s; the loop takes "
                  f"{row['step_s_loop'] / row['floor_s']:.1f}x the floor, the stacked tick "
                  f"{row['step_s_grouped'] / row['floor_s']:.1f}x; no formulation can beat the loop by more "
                  f"than {row['step_s_loop'] / row['floor_s']:.1f}x here")
        results.append(row)
    atomic_write_text("bench_out/gossip.json", json.dumps(results, indent=1))
    return {"results": results}


if __name__ == "__main__":
    main(sys.argv[1:])

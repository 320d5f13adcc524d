"""The stacked image engines on an accelerator: the gossip training tick against the per-node loop,
and a SAGE local epoch and full evaluation of K clients, each beside its FLOP floor at the device's
fp32 GEMM rate measured in the same run, and each compared with the same computation on the CPU.

``python -m benchmarks.run device [-- --device cuda --nodes 50 1000 --clients 50 --repeats 5]``.
Without the device it prints that nothing was measured. The images are synthetic arrays of
Fashion-MNIST's shape (60,000 training and 10,000 test images, 6,000 per class; times do not depend
on the pixel values), split as the SAGE presets split them (Dirichlet alpha 0.1, seed 0). TF32 is
off for convolutions and matrix products, so the device computes in the CPU's fp32 and the floor
is a floor. Writes ``bench_out/device.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
import torch

from benchmarks.bench_gossip import bench_step
from benchmarks.options import matmul_peak_gflops, sync
from etl.images import ImageDataset
from etl.io import atomic_write_text
from federation.data.image_shards import make_shards
from federation.engine.image_model import FMNIST_SPEC, StackedModel, predict_flops_per_image, train_flops_per_image
from federation.gossip.model import init_stacked, lenet5_train_flops_per_image, stacked_gradients


def fmnist_shaped(seed: int = 0) -> ImageDataset:
    """Random uint8 images with Fashion-MNIST's sizes and class counts (6,000 / 1,000 per class)."""
    rng = np.random.default_rng(seed)
    y_train, y_test = rng.permutation(np.repeat(np.arange(10), 6000)), rng.permutation(np.repeat(np.arange(10), 1000))
    return ImageDataset(rng.integers(0, 256, (60_000, 1, 28, 28), dtype=np.uint8), y_train,
                        rng.integers(0, 256, (10_000, 1, 28, 28), dtype=np.uint8), y_test, 10, "fmnist-shaped")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |a|, both on the CPU."""
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).abs().max() / a.abs().max().clamp(min=1e-30))


def gossip(device: str, nodes: list[int], repeats: int, peak: float) -> list[dict[str, Any]]:
    """The training tick of each N in ``nodes`` (stacked grouped, vmap, per-node loop) on ``device``,
    and the largest relative gradient difference from the CPU for 8 nodes."""
    gen = torch.Generator().manual_seed(1)
    flat, x, y = init_stacked(8, gen), torch.rand(8, 64, 1, 28, 28, generator=gen), torch.randint(0, 10, (8, 64), generator=gen)
    g_cpu, _ = stacked_gradients(flat, x, y)
    g_dev, _ = stacked_gradients(flat.to(device), x.to(device), y.to(device))
    rows = []
    for n in nodes:
        row = bench_step(n, repeats, loop=True, device=device)
        row["floor_s"] = lenet5_train_flops_per_image() * 64 * n / 1e9 / peak
        row["max_rel_grad_diff_vs_cpu"] = _rel(g_cpu, g_dev)
        rows.append(row)
        print(f"gossip N={n} on {device}: stacked tick {row['step_s_grouped'] * 1e3:.2f} ms, per-node loop "
              f"{row['step_s_loop'] * 1e3:.1f} ms: {row['speedup_grouped_vs_loop']:.1f}x the loop; FLOP floor "
              f"{row['floor_s'] * 1e3:.2f} ms (stacked at {row['step_s_grouped'] / row['floor_s']:.1f}x it); "
              f"gradients vs CPU: max rel diff {row['max_rel_grad_diff_vs_cpu']:.1e}", flush=True)
    return rows


def sage(device: str, clients: int, repeats: int, peak: float) -> dict[str, Any]:
    """One SAGE local epoch of ``clients`` clients (the round's training) and all their predictors on
    the 10,000 test images, on ``device``; the first epoch is also run on the CPU and compared."""
    shards = make_shards(fmnist_shaped(), clients, 0.1, 0)
    x_dev, y_dev, x_test = shards.x_train.to(device), shards.y_train.to(device), shards.x_test.to(device)

    def epoch(model: StackedModel, x: torch.Tensor, y: torch.Tensor, r: int) -> None:
        model.local_epoch(x, y, shards.train_index, shards.n_train, 64, torch.Generator().manual_seed(r))

    dev = StackedModel(FMNIST_SPEC, clients, 0, device=device)
    epoch(dev, x_dev, y_dev, 0)
    cpu = StackedModel(FMNIST_SPEC, clients, 0)
    epoch(cpu, shards.x_train, shards.y_train, 0)
    rel = max(_rel(cpu.params[k], dev.params[k]) for k in cpu.params)
    sync(device)
    t0 = time.perf_counter()
    for r in range(1, repeats + 1):
        epoch(dev, x_dev, y_dev, r)
    sync(device)
    train_s = (time.perf_counter() - t0) / repeats
    times = {}
    for chunk in (32, 1000, 10_000):
        dev.predict_shared_inputs(x_test[:chunk], chunk=chunk)
        sync(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            dev.predict_shared_inputs(x_test, chunk=chunk)
        sync(device)
        times[chunk] = (time.perf_counter() - t0) / repeats
    best = min(times, key=times.get)
    train_gflop = train_flops_per_image(FMNIST_SPEC) * int(shards.n_train.sum()) / 1e9
    eval_gflop = predict_flops_per_image(FMNIST_SPEC) * clients * len(shards.y_test) / 1e9
    out = {"clients": clients, "train_images": int(shards.n_train.sum()), "max_client_train": int(shards.n_train.max()),
           "local_epoch_s": train_s, "train_gflop": train_gflop, "train_floor_s": train_gflop / peak,
           "eval_s_by_chunk": {str(k): v for k, v in times.items()}, "eval_gflop": eval_gflop,
           "eval_floor_s": eval_gflop / peak, "max_rel_param_diff_vs_cpu_after_one_epoch": rel}
    print(f"SAGE K={clients} on {device}: local epoch {train_s:.3f} s (floor {out['train_floor_s'] * 1e3:.1f} ms, "
          f"{train_gflop:.0f} GFLOP; {out['max_client_train']} images on the largest client); all predictors on "
          f"10,000 test images {times[best]:.3f} s in chunks of {best} (floor {out['eval_floor_s'] * 1e3:.1f} ms); "
          f"parameters after one epoch vs CPU: max rel diff {rel:.1e}", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the measurements on ``--device`` (default cuda); print them and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="a torch device: cuda, cuda:1, cpu")
    ap.add_argument("--nodes", type=int, nargs="+", default=[50, 1000], help="gossip network sizes N")
    ap.add_argument("--clients", type=int, default=50, help="SAGE clients K")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="bench_out/device.json")
    a = ap.parse_args(argv if argv is not None else [])
    try:
        device = torch.device(a.device)
    except RuntimeError:
        ap.error(f"--device: {a.device!r} is not a torch device")
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"device: no CUDA device on this machine; nothing measured (--device {a.device})")
        return {}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = matmul_peak_gflops(size=8192 if device.type == "cuda" else 2048, repeats=5, device=str(device))
    print(f"device {name}: fp32 GEMM {peak / 1e3:.1f} TFLOP/s (TF32 off), torch {torch.__version__}", flush=True)
    res = {"device": name, "torch": torch.__version__, "peak_gflops": peak,
           "gossip": gossip(str(device), a.nodes, a.repeats, peak),
           "sage": sage(str(device), a.clients, a.repeats, peak)}
    atomic_write_text(a.out, json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])

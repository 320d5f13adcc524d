"""The option parser every benchmark's ``main`` starts from."""

from __future__ import annotations

import argparse
from typing import Any


def parser(doc: str, **defaults: Any) -> argparse.ArgumentParser:
    """An option parser described by the first line of ``doc``, with ``--out`` (the JSON file to
    write, default none) and one option per keyword: ``flower_rounds=4`` is ``--flower-rounds``,
    typed as its default (int 4)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    for key, default in defaults.items():
        ap.add_argument(f"--{key.replace('_', '-')}", type=type(default), default=default)
    ap.add_argument("--out", default=None)
    return ap


def machine_note(threads: int, load: float | None = None) -> str:
    """Whether a benchmark's figures are an idle machine's: the 1-minute run-queue average
    (``os.getloadavg``, read now unless given) against the ``threads`` the benchmark itself ran.
    Contention changes ratios between candidates (many small kernels lose more than few large
    ones), so a figure taken with other work running is not one for an idle target."""
    import os

    load = os.getloadavg()[0] if load is None else float(load)
    cpus = os.cpu_count() or 1
    ours = f"{threads} thread{'' if threads == 1 else 's'} of this benchmark"
    if load > threads + 0.5:
        return f"other work was running (run queue {load:.1f} on {cpus} CPUs, {ours}): not an idle-machine figure"
    return f"no other work running (run queue {load:.1f} on {cpus} CPUs, {ours})"


def sync(device) -> None:
    """Wait for the work queued on ``device`` (a no-op on the CPU), so a wall-clock reading covers it."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_gflops(size: int = 2048, repeats: int = 3, device: str = "cpu") -> float:
    """This machine's dense fp32 GEMM rate at the current torch thread count, GFLOP/s: the best of
    ``repeats`` products of two ``size x size`` matrices (2 size^3 FLOPs each, MKL via ``torch.mm``
    on the CPU, cuBLAS on ``device="cuda"``, where the caller decides whether TF32 is allowed).
    The floor a benchmark prints beside its measured time (FLOPs / this rate) is the time no
    formulation of the same arithmetic beats on this machine."""
    import time

    import torch

    a, b = torch.rand(size, size, device=device), torch.rand(size, size, device=device)
    a @ b   # warm-up
    sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * size ** 3 / best / 1e9

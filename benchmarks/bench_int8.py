"""Agreement of the int8 SAGE evaluation with fp32, and its speed, at each x86 ISA level.
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

from benchmarks.options import parser

#: environment of each ISA level (``native``: the machine as it is)
LEVELS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512_core": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "sse41": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
#: variables that select an ISA; removed from the parent's environment before a level's own are set
ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "DNNL_MAX_CPU_ISA",
                 "FBGEMM_ENABLE_INSTRUCTIONS", "ONEDNN_VERBOSE", "DNNL_VERBOSE")
TARGET_AGREEMENT = 0.995
_RESULT = "bench_int8 result: "


def measure(clients: int = 4, train: int = 2400, test: int = 1000, threads: int = 1, repeats: int = 3,
            seed: int = 0, engine: str | None = None, weight_qmax: int | None = None) -> dict[str, Any]:
    """Train ``clients`` clients for one epoch, then time and compare fp32 and int8 predictions (this process)."""
    import torch

    from etl.images import FASHION_MNIST_DIR, load_idx_dataset
    from federation.data.image_shards import make_shards, subsample
    from federation.engine.image_model import FMNIST_SPEC, StackedModel
    from federation.images import int8
    from federation.images.int8 import predict_shared_int8

    int8.ENGINE = engine or int8.ENGINE
    int8.WEIGHT_QMAX = weight_qmax or int8.WEIGHT_QMAX
    torch.set_num_threads(threads)
    ds = subsample(load_idx_dataset(FASHION_MNIST_DIR, "fashion-mnist"), train, test, seed)
    sh = make_shards(ds, clients, 0.5, seed)
    model = StackedModel(FMNIST_SPEC, clients, seed=seed)
    model.local_epoch(sh.x_train, sh.y_train, sh.train_index, sh.n_train, 64, torch.Generator().manual_seed(seed))
    enc = {n: v for n, v in model.params.items() if not n.startswith("decoder.")}
    x = sh.x_test
    fp32_s, int8_s = [], []
    for _ in range(repeats):              # interleaved, best of ``repeats`` (the first call is the warm-up)
        t = time.perf_counter()
        ref = model.predict_shared_inputs(x)
        fp32_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        got = predict_shared_int8(enc, x, chunk=300)
        int8_s.append(time.perf_counter() - t)
    equal = (got == ref).double()
    return {"capability": torch.backends.cpu.get_cpu_capability(), "kernels": _int8_kernels(enc, x[:8]),
            "agreement": float(equal.mean()), "worst_client": float(equal.mean(dim=1).min()),
            "int8_s": min(int8_s), "fp32_s": min(fp32_s), "clients": clients, "test_images": int(x.shape[0]),
            "int8_sha1": hashlib.sha1(got.numpy().tobytes()).hexdigest(), "threads": threads,
            "engine": int8.ENGINE, "weight_qmax": int8.WEIGHT_QMAX}


def _int8_kernels(enc: dict, x) -> list[str]:
    """oneDNN implementations that ran the u8 convolutions of one small int8 pass (from its verbose log)."""
    import torch

    from federation.images.int8 import predict_shared_int8

    sys.stdout.flush()
    read, write = os.pipe()
    saved = os.dup(1)
    os.dup2(write, 1)                     # oneDNN logs to the C stdout
    try:
        with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            predict_shared_int8(enc, x)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(write)
    with os.fdopen(read) as log:
        lines = log.read().splitlines()
    found = {m.group(1) for ln in lines if ",exec," in ln and ",convolution," in ln and "src:u8" in ln
             for m in [re.search(r",convolution,([^,]+),", ln)] if m}
    return sorted(found)


def run_level(level: str, args: argparse.Namespace) -> dict[str, Any]:
    """:func:`measure` in a fresh interpreter under ``LEVELS[level]``; its row (``error`` if it failed)."""
    env = {k: v for k, v in os.environ.items() if k not in ISA_VARIABLES}
    env.update(LEVELS[level])
    cmd = [sys.executable, "-m", "benchmarks.bench_int8", "--worker", "--clients", str(args.clients),
           "--train", str(args.train), "--test", str(args.test), "--threads", str(args.threads),
           "--repeats", str(args.repeats), "--seed", str(args.seed)]
    cmd += ["--engine", args.engine] if args.engine else []
    cmd += ["--weight-qmax", str(args.weight_qmax)] if args.weight_qmax else []
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    rows = [ln[len(_RESULT):] for ln in p.stdout.splitlines() if ln.startswith(_RESULT)]
    row = json.loads(rows[-1]) if p.returncode == 0 and rows else {
        "error": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]}
    row.update(level=level, env=" ".join(f"{k}={v}" for k, v in LEVELS[level].items()) or "(none)")
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure every selected level; print the table (and write ``--out``); return the rows."""
    ap = parser(__doc__, clients=4, train=2400, test=1000, threads=1, repeats=3, seed=0)
    ap.add_argument("--levels", nargs="+", choices=list(LEVELS), default=list(LEVELS))
    ap.add_argument("--engine", default=None, help="quantized engine instead of int8.ENGINE (A/B)")
    ap.add_argument("--weight-qmax", type=int, default=None, help="weight code bound instead of int8.WEIGHT_QMAX (A/B)")
    ap.add_argument("--worker", action="store_true", help="measure in this process and print one JSON line")
    args = ap.parse_args(argv if argv is not None else [])
    if args.worker:
        row = measure(args.clients, args.train, args.test, args.threads, args.repeats, args.seed,
                      args.engine, args.weight_qmax)
        print(_RESULT + json.dumps(row), flush=True)
        return row
    rows: list[dict[str, Any]] = []
    for level in args.levels:
        if level == "avx512_core" and rows and rows[0].get("capability") not in (None, "AVX512"):
            rows.append({"level": level, "skipped": f"native level is {rows[0]['capability']}, not AVX-512"})
            continue
        rows.append(run_level(level, args))
    native = next((r for r in rows if r.get("level") == "native" and "int8_sha1" in r), None)
    print(f"int8 vs fp32, {args.clients} clients x {args.test} test images, {args.threads} thread(s), "
          f"best of {args.repeats}, engine {args.engine or 'default'}, weight codes "
          f"{'+-' + str(args.weight_qmax) if args.weight_qmax else 'default'}; target >= {TARGET_AGREEMENT:.1%} equal at every level")
    print("| ISA level | environment | ATen | int8 kernel | equal to fp32 (worst client) "
          "| int8 = native int8 | int8 s | fp32 s | fp32 / int8 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "agreement" not in r:
            print(f"| {r['level']} | {r.get('env', '')} | {r.get('skipped') or r.get('error')} | | | | | | |")
            continue
        same = "yes" if native and r["int8_sha1"] == native["int8_sha1"] else "no" if native else "-"
        print(f"| {r['level']} | {r['env']} | {r['capability']} | {', '.join(r['kernels']) or r['engine'] + ' (not oneDNN)'} "
              f"| {r['agreement']:.2%} ({r['worst_client']:.2%}) | {same} | {r['int8_s']:.3f} | {r['fp32_s']:.3f} "
              f"| {r['fp32_s'] / r['int8_s']:.2f}x |")
    measured = [r for r in rows if "agreement" in r]
    print(f"agreement >= {TARGET_AGREEMENT:.1%} at every measured level: "
          f"{all(r['agreement'] >= TARGET_AGREEMENT for r in measured)} ({len(measured)} of {len(rows)} levels ran)")
    result = {"rows": rows, "load_average_1min": os.getloadavg()[0]}
    if args.out:
        from etl.io import atomic_write_text
        atomic_write_text(args.out, json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])

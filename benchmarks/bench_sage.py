"""Seconds per SAGE round for K = 50 clients on Fashion-MNIST on 2 CPU cores.
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Any

import torch

from benchmarks.options import machine_note, matmul_peak_gflops, parser
from etl.io import atomic_write_text
from federation.core.graphs import neighbour_table
from federation.data.image_shards import make_graph, make_shards, subsample
from federation.engine.image_model import StackedModel, predict_flops_per_image, train_flops_per_image
from federation.images.int8 import predict_shared_int8
from federation.images.run import load_dataset, run_selector
from federation.methods.registry import get_selector
from federation.methods.selectors import parse_config


def bench(clients: int = 50, rounds: int = 2, alpha: float = 0.1, graph: str = "er",
          selectors: tuple[str, ...] = ("sage_os",), threads: int = 2,
          test_samples: int | None = None, seed: int = 0, eval_precision: str = "int8") -> dict[str, Any]:
    """Time ``rounds`` rounds of each selector; returns the measurements as a dict."""
    torch.set_num_threads(threads)
    cfg = parse_config({"benchmark": "sage", "n_clients": clients, "rounds": rounds, "alpha_dir": alpha,
                        "graph": graph, "test_samples": test_samples, "seeds": [seed],
                        "selectors": list(selectors), "eval_precision": eval_precision})
    t0 = time.perf_counter()
    ds, spec = load_dataset(cfg)
    ds = subsample(ds, None, cfg.test_samples, seed)
    shards = make_shards(ds, cfg.n_clients, cfg.alpha_dir, seed)
    cand, valid, degree = neighbour_table(make_graph(cfg.graph, cfg.n_clients, seed, cfg.er_p, cfg.ba_m))
    setup = time.perf_counter() - t0
    out: dict[str, Any] = {
        "clients": clients, "rounds": rounds, "alpha_dir": alpha, "graph": graph, "threads": threads,
        "test_samples": len(shards.y_test), "train_images": int(shards.n_train.sum()),
        "max_client_train": int(shards.n_train.max()), "mean_degree": float(degree.double().mean()),
        "setup_s": setup, "torch": torch.__version__, "machine": platform.machine(),
        "processor": platform.processor(), "selectors": {}}
    model = StackedModel(spec, cfg.n_clients, seed)
    t1, c1 = time.perf_counter(), time.process_time()
    model.local_epoch(shards.x_train, shards.y_train, shards.train_index, shards.n_train, cfg.batch_size,
                      torch.Generator().manual_seed(seed))   # trained clients: a meaningful int8 agreement
    out["local_epoch_s"], out["local_epoch_cpu_s"] = time.perf_counter() - t1, time.process_time() - c1
    enc = {n: v for n, v in model.params.items() if not n.startswith("decoder.")}
    model.predict_shared_inputs(shards.x_test[:100])  # warm-up
    predict_shared_int8(enc, shards.x_test[:100])
    t1 = time.perf_counter()
    fp32 = model.predict_shared_inputs(shards.x_test)
    out["eval_predictors_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    int8 = predict_shared_int8(enc, shards.x_test)
    out["eval_predictors_int8_s"] = time.perf_counter() - t1
    out["int8_agreement"] = float((int8 == fp32).double().mean())
    out["eval_precision"] = eval_precision
    out["eval_profile"] = profile_evaluation(model, shards.x_test[:1000])
    out["eval_gmac"] = eval_macs(spec, cfg.n_clients, len(shards.y_test)) / 1e9
    out["peak_gflops"] = matmul_peak_gflops()
    out["floor"] = flop_floor(spec, shards, out["peak_gflops"])
    out["load_average_1min"] = _load()
    for s in cfg.selectors:
        res = run_selector(s, cfg, shards, spec, cand, valid, degree, seed)
        sm = res["summary"]
        out["selectors"][get_selector(s).display] = {
            "s_per_round": sum(h["seconds_round"] for h in res["history"]) / rounds,
            "train_s_per_round": sm["seconds_train"] / rounds,
            "probe_select_mix_s_per_round": sm["seconds_probe_mix"] / rounds,
            "eval_s_per_round": sm["seconds_eval"] / rounds,
            "global_acc": sm["global_acc"], "client_acc": sm["client_acc"]}
    return out


#: targets on 2 idle cores (seconds): all K predictors on the test set; one SAGE round, its local
#: training and its full evaluation.
TARGETS = {"eval_predictors_s": 1.0, "s_per_round": 6.0, "train_s_per_round": 3.0, "eval_s_per_round": 2.0}


def eval_macs(spec, n_clients: int, n_images: int) -> float:
    """Multiply-adds of evaluating ``n_clients`` encoder + head predictors on ``n_images`` images
    (:func:`federation.engine.image_model.predict_flops_per_image` / 2)."""
    return predict_flops_per_image(spec) / 2 * n_clients * n_images


def flop_floor(spec, shards, peak_gflops: float) -> dict[str, float]:
    """FLOPs of one round's training (one local epoch: every client's training images once) and of
    one full evaluation (all K predictors on the shared test set, each client's predictor on its
    local evaluation split), and the seconds they take at ``peak_gflops``: the floor no formulation
    of these layers beats on this machine (counts: :func:`federation.engine.image_model.layer_macs`).
    """
    train = train_flops_per_image(spec) * int(shards.n_train.sum())
    evaluation = predict_flops_per_image(spec) * (shards.n_clients * len(shards.y_test) + int(shards.n_eval.sum()))
    return {"train_gflop": train / 1e9, "eval_gflop": evaluation / 1e9,
            "train_s": train / 1e9 / peak_gflops, "eval_s": evaluation / 1e9 / peak_gflops}


def profile_evaluation(model: StackedModel, x: torch.Tensor, top: int = 5) -> list[dict[str, Any]]:
    """torch.profiler's top operators (self CPU time) of one evaluation of all predictors on ``x``."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model.predict_shared_inputs(x)
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows) or 1.0
    return [{"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "share": e.self_cpu_time_total / total,
             "calls": e.count} for e in rows[:top]]


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def report_targets(res: dict[str, Any]) -> list[str]:
    """One line per figure with its target, for ``python -m benchmarks.run sage``."""
    ev = res["eval_predictors_s"]
    lines = [f"evaluation of {res['clients']} predictors on {res['test_samples']} images: "
             f"{ev:.2f} s (target <= {TARGETS['eval_predictors_s']:.0f} s on 2 idle cores; "
             f"measured / target = {ev / TARGETS['eval_predictors_s']:.1f}x; {res['eval_gmac']:.0f} GMAC, "
             f"{res['eval_gmac'] / ev:.1f} GMAC/s)"]
    q = res["eval_predictors_int8_s"]
    lines.append(f"evaluation, int8 encoder convolutions: {q:.2f} s (target <= {TARGETS['eval_predictors_s']:.0f} s; "
                 f"measured / target = {q / TARGETS['eval_predictors_s']:.1f}x; fp32 / int8 = {ev / q:.2f}x; "
                 f"predictions equal to fp32 on {100 * res['int8_agreement']:.2f} % (needs >= 99.5 %))")
    lines.append(f"one local epoch of {res['clients']} clients ({res['train_images']} images): "
                 f"{res['local_epoch_s']:.2f} s wall, {res['local_epoch_cpu_s']:.2f} CPU s")
    lines += [f"  evaluation profile (fp32): {p['op']} {100 * p['share']:.0f} %" for p in res["eval_profile"]]
    f = res["floor"]
    lines.append(f"FLOP floor at this machine's measured fp32 GEMM peak ({res['peak_gflops']:.0f} GFLOP/s on "
                 f"{res['threads']} threads, same run): local epoch {f['train_gflop']:.0f} GFLOP -> {f['train_s']:.2f} s "
                 f"(measured {res['local_epoch_s']:.2f} s = {res['local_epoch_s'] / f['train_s']:.1f}x the floor); "
                 f"full evaluation {f['eval_gflop']:.0f} GFLOP -> {f['eval_s']:.2f} s")
    for name, r in res["selectors"].items():
        lines.append(f"{name}: {r['s_per_round']:.2f} s per round (train {r['train_s_per_round']:.2f}, target <= "
                     f"{TARGETS['train_s_per_round']:.0f}; probe+select+mix {r['probe_select_mix_s_per_round']:.2f}; "
                     f"eval {r['eval_s_per_round']:.2f} ({res['eval_precision']}), target <= {TARGETS['eval_s_per_round']:.0f}; "
                     f"round target <= {TARGETS['s_per_round']:.0f} s on 2 idle cores; measured / target = "
                     f"{r['s_per_round'] / TARGETS['s_per_round']:.1f}x; FLOP floor: train {f['train_s']:.2f} s = "
                     f"{r['train_s_per_round'] / f['train_s']:.1f}x below the measured, eval {f['eval_s']:.2f} s = "
                     f"{r['eval_s_per_round'] / f['eval_s']:.1f}x below)")
    lines.append(machine_note(res["threads"], res.get("load_average_1min")))
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command-line entry: parse options, run :func:`bench`, print (and optionally write) JSON."""
    ap = parser(__doc__, clients=50, rounds=2, alpha=0.1)
    ap.add_argument("--graph", choices=["er", "ba"], default="er")
    ap.add_argument("--selectors", nargs="+", default=["sage_os"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--test-samples", type=int, default=None)
    ap.add_argument("--eval-precision", choices=["fp32", "int8"], default="int8")
    a = ap.parse_args(argv)
    res = bench(a.clients, a.rounds, a.alpha, a.graph, tuple(a.selectors), a.threads, a.test_samples,
                eval_precision=a.eval_precision)
    text = json.dumps(res, indent=1)
    print(text)
    print("\n".join(report_targets(res)))
    if a.out:
        atomic_write_text(a.out, text)
    return res


if __name__ == "__main__":
    main()

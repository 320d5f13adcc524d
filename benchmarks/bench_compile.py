"""The engine's training step three ways: eager PyTorch, the fused C++ kernels, ``torch.compile``.
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import torch

OUT = Path("bench_out")


def _env(kernels: str):
    """``ABPS_KERNELS`` set for the duration of a ``with`` block (restored afterwards)."""
    return mock.patch.dict(os.environ, {"ABPS_KERNELS": kernels})


def build_data(workload: str, clients: int, seed: int, tmp: str):
    """The benchmark's :class:`federation.data.tensors.FederatedData`: bench_flower's equal-size clients, or
    bench_engine's FedProx-Synthetic cohort (the same generator call as ``bench_engine.main``)."""
    if workload == "flower":
        from benchmarks.bench_flower import federated_data

        return federated_data(clients, seed), f"bench_flower workload, {clients} clients x 250 train rows, d = 60"
    from federation.data.synthetic import write_fedprox_cohort
    from federation.data.tensors import FederatedData

    cohort = str(Path(tmp) / f"fedprox{clients}")
    write_fedprox_cohort(cohort, n_centers=clients, alpha=0.5, beta=0.5, seed=0, mean_size=300, shared=0.8)
    return FederatedData.from_cohort(cohort), f"bench_engine workload, FedProx-Synthetic(0.5, 0.5), {clients} centers"


def _step_inputs(eng, seed_round: int = 0) -> dict[str, Any]:
    """One full step's inputs (the first 128 rows of every center, step 0's dropout draws)."""
    from federation.engine.mlp import keep_from_bits

    tr = eng.data.splits["train"]
    n, bs = eng.n, eng.cfg.batch_size
    w = min(bs, tr.x.shape[1])
    k = int(round(eng.cfg.dropout * 65536))
    bits = eng.streams.dropout_bits(seed_round, 0, 0, n, w, sum(eng.hidden))
    real = tr.n.clamp(max=w)
    rows = None if bool((real == w).all()) else torch.arange(w).unsqueeze(0) < real.unsqueeze(1)
    return {"p": eng.init_params(), "x": tr.x[:, :w].contiguous(), "y": tr.y[:, :w].contiguous(), "rows": rows,
            "real": real, "bits": bits, "keep": keep_from_bits(bits, eng.hidden, k) if k else None, "k": k,
            "scale": 65536.0 / (65536 - k)}


def _grads_from_bits(eng) -> Callable:
    """``_grads`` taking the int16 draws ``[c, w, h1 + h2]`` instead of float masks (masks built
    inside, by the rule of :func:`federation.engine.mlp.keep_from_bits`)."""
    h1 = eng.hidden[0]

    def fn(p, x, y, rows, real, bits, thr, scale):
        keep = ((bits[..., :h1] >= thr).to(torch.float32), (bits[..., h1:] >= thr).to(torch.float32))
        return type(eng)._grads(eng, p, x, y, rows, real, keep, scale)

    return fn


def _timed(fn: Callable) -> tuple[Any, float, float]:
    """(result, wall s, CPU s of the process) of ``fn()``."""
    c, t = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t, time.process_time() - c


def _error_text(exc: BaseException) -> str:
    """``Type: first line of the message`` (inductor errors carry long internal tracebacks)."""
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"[:300]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(max abs difference over all tensors, max over tensors of that difference / max |a|)."""
    absd = [float((a[k] - b[k]).abs().max()) for k in a]
    rel = [float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-30)) for k in a]
    return max(absd), max(rel)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints (and returns) the result, also written under bench_out/."""
    from federation.core.config import EngineConfig
    from federation.engine import kernels
    from federation.engine.mlp import PARAM_NAMES, AdamState, StackedEngine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=230)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8, help="timed rounds per variant (after one warm-up round)")
    ap.add_argument("--step-reps", type=int, default=20)
    ap.add_argument("--modes", default="default,max-autotune-no-cudagraphs",
                    help="comma-separated torch.compile modes")
    ap.add_argument("--dynamic", choices=("false", "true", "auto"), default=None,
                    help="torch.compile dynamic= (auto = None); default false for the flower workload, auto else")
    ap.add_argument("--workload", choices=("flower", "engine"), default="flower")
    ap.add_argument("--no-from-bits", action="store_true", help="skip the step-level compile-default-bits variant")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args([] if argv is None else argv)
    dyn_name = a.dynamic or ("false" if a.workload == "flower" else "auto")
    dynamic = {"false": False, "true": True, "auto": None}[dyn_name]
    modes = [m for m in a.modes.split(",") if m]
    torch.set_num_threads(a.threads)
    load0 = os.getloadavg()[0]

    with _env("cpp"):
        kernels.library()  # build (or load from the cache) before anything is timed; raises without a compiler
    with tempfile.TemporaryDirectory() as tmp, \
            mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor")}):
        data, source = build_data(a.workload, a.clients, a.seed, tmp)
        cfg = EngineConfig()
        names = ["eager", "cpp", *[f"compile-{m}" for m in modes]]
        engines = {v: StackedEngine(data, cfg, seed=a.seed) for v in names}
        env_of = {v: ("cpp" if v == "cpp" else "torch") for v in names}
        compile_s: dict[str, float] = {}
        grads_fn: dict[str, Callable] = {}
        for m in modes:
            grads_fn[f"compile-{m}"] = torch.compile(engines[f"compile-{m}"]._grads, mode=m, dynamic=dynamic)

        # ---- step level: one full step of all centers, same inputs for every variant
        si = _step_inputs(engines["eager"])
        args = (si["p"], si["x"], si["y"], si["rows"], si["real"])
        thr = si["k"] - 32768
        calls: dict[str, Callable[[], dict[str, torch.Tensor]]] = {
            "eager": lambda: engines["eager"]._grads(*args, si["keep"], si["scale"]),
            "cpp": lambda: engines["cpp"]._grads_fused(*args, si["bits"], si["k"], si["scale"]),
        }
        for m in modes:
            calls[f"compile-{m}"] = (lambda f: lambda: f(*args, si["keep"], si["scale"]))(grads_fn[f"compile-{m}"])
        if not a.no_from_bits:
            fb = torch.compile(_grads_from_bits(engines["eager"]), mode="default", dynamic=dynamic)
            calls["compile-default-bits"] = lambda: fb(*args, si["bits"], thr, si["scale"])
        ref = None
        agree: dict[str, dict[str, float]] = {}
        failed: dict[str, str] = {}  # variant -> the error its compilation raised (variant dropped)
        for v, fn in list(calls.items()):
            env = "cpp" if v == "cpp" else "torch"
            try:
                with _env(env):
                    g, wall, _ = _timed(fn)
            except Exception as exc:  # an inductor failure drops that variant, not the benchmark
                if not v.startswith("compile"):
                    raise
                failed[v] = _error_text(exc)
                print(f"[bench_compile] {v}: compilation failed, variant dropped: {failed[v]}", file=sys.stderr,
                      flush=True)
                del calls[v]
                if v in names:
                    names.remove(v)
                continue
            if v.startswith("compile"):
                compile_s[v] = wall
                print(f"[bench_compile] {v}: first call (compile) {wall:.1f} s", file=sys.stderr, flush=True)
            if ref is None:
                ref = g
            absd, rel = _max_diff(ref, g)
            agree[v] = {"step_grad_max_abs_diff": absd, "step_grad_max_rel_diff": rel}
        warm_compile = None
        # the first mode again, after a dynamo reset, with the inductor cache now warm
        if modes and f"compile-{modes[0]}" in calls:
            torch._dynamo.reset()
            m = modes[0]
            grads_fn[f"compile-{m}"] = torch.compile(engines[f"compile-{m}"]._grads, mode=m, dynamic=dynamic)
            calls[f"compile-{m}"] = (lambda f: lambda: f(*args, si["keep"], si["scale"]))(grads_fn[f"compile-{m}"])
            with _env("torch"):
                _, warm_compile, _ = _timed(calls[f"compile-{m}"])
            # dynamo.reset dropped the other compiled functions too: recompile them (warm cache), untimed
            for v in list(calls):
                if v.startswith("compile") and v != f"compile-{m}":
                    if v != "compile-default-bits":
                        grads_fn[v] = torch.compile(engines[v]._grads, mode=v[len("compile-"):], dynamic=dynamic)
                        calls[v] = (lambda f: lambda: f(*args, si["keep"], si["scale"]))(grads_fn[v])
                    else:
                        fb = torch.compile(_grads_from_bits(engines["eager"]), mode="default", dynamic=dynamic)
                        calls[v] = lambda: fb(*args, si["bits"], thr, si["scale"])
                    try:
                        with _env("torch"):
                            calls[v]()
                    except Exception as exc:
                        failed[v] = _error_text(exc)
                        del calls[v]
                        if v in names:
                            names.remove(v)
        step_t: dict[str, list[float]] = {v: [] for v in calls}
        order = list(calls)
        for rep in range(a.step_reps):
            for v in order[rep % len(order):] + order[: rep % len(order)]:  # rotate who goes first
                with _env("cpp" if v == "cpp" else "torch"):
                    step_t[v].append(_timed(calls[v])[1])

        # ---- round level: train_round of every variant, alternated
        for v in names:
            if v.startswith("compile"):
                engines[v]._grads = grads_fn[v]  # instance attribute: train_round's self._grads(...)
        state = {v: (engines[v].init_params(),) for v in names}
        state = {v: (p, AdamState.zeros_like(p)) for v, (p,) in state.items()}
        round_wall: dict[str, list[float]] = {v: [] for v in names}
        round_cpu: dict[str, list[float]] = {v: [] for v in names}
        first_round: dict[str, float] = {}
        for r in range(a.rounds + 1):
            rot = names[r % len(names):] + names[: r % len(names)]
            for v in rot:
                if v not in names:
                    continue
                p, st = state[v]
                try:
                    with _env(env_of[v]):
                        _, wall, cpu = _timed(lambda: engines[v].train_round(p, st, r))
                except Exception as exc:  # a recompilation for a new shape failed: drop the variant
                    if not v.startswith("compile"):
                        raise
                    failed[v] = _error_text(exc)
                    print(f"[bench_compile] {v}: compilation failed in round {r}, variant dropped: {failed[v]}",
                          file=sys.stderr, flush=True)
                    names.remove(v)
                    for d in (round_wall, round_cpu, first_round):
                        d.pop(v, None)
                    continue
                if r == 0:
                    first_round[v] = wall
                else:
                    round_wall[v].append(wall)
                    round_cpu[v].append(cpu)
            print(f"[bench_compile] round {r}: " + ", ".join(
                f"{v} {round_wall[v][-1] if r else first_round[v]:.3f}" for v in names)
                + f" s, load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
        for v in names:
            absd, rel = _max_diff({k: state["eager"][0][k] for k in PARAM_NAMES},
                                  {k: state[v][0][k] for k in PARAM_NAMES})
            agree.setdefault(v, {}).update({"params_after_rounds_max_abs_diff": absd,
                                            "params_after_rounds_max_rel_diff": rel})

    step_med = {v: statistics.median(t) for v, t in step_t.items()}
    step_min = {v: min(t) for v, t in step_t.items()}
    wall_min = {v: min(t) for v, t in round_wall.items()}
    wall_med = {v: statistics.median(t) for v, t in round_wall.items()}
    cpu_med = {v: statistics.median(t) for v, t in round_cpu.items()}
    best_compiled = min((v for v in names if v.startswith("compile")), key=lambda v: wall_med[v], default=None)
    res: dict[str, Any] = {
        "benchmark": "engine step: eager vs fused C++ kernels vs torch.compile",
        "source": source, "n_centers": data.n_centers, "d": data.d, "threads": a.threads,
        "torch": torch.__version__, "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "modes": modes, "dynamic": dyn_name, "rounds_timed": a.rounds, "step_reps": a.step_reps,
        "load_1min_before": load0, "load_1min_after": os.getloadavg()[0],
        "compile_failed": failed, "compile_first_call_s": compile_s, "compile_first_call_warm_cache_s": warm_compile,
        "first_round_s": first_round,
        "step_s_median": step_med, "step_s_min": step_min, "step_s": step_t, "round_wall_s_min": wall_min,
        "round_wall_s_median": wall_med, "round_cpu_s_median": cpu_med, "round_wall_s": round_wall,
        "agreement_vs_eager": agree,
        "ratio_step_vs_cpp": {v: step_med[v] / step_med["cpp"] for v in step_med},
        "ratio_step_min_vs_cpp": {v: step_min[v] / step_min["cpp"] for v in step_min},
        "ratio_round_wall_min_vs_cpp": {v: wall_min[v] / wall_min["cpp"] for v in names},
        "ratio_round_wall_vs_cpp": {v: wall_med[v] / wall_med["cpp"] for v in names},
        "ratio_round_wall_vs_eager": {v: wall_med[v] / wall_med["eager"] for v in names},
        "best_compiled": best_compiled,
        "cpp_faster_than_best_compiled": (best_compiled is not None and wall_med["cpp"] < wall_med[best_compiled]),
    }
    md = _table(res)
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_compile.json").write_text(json.dumps(res, indent=2) + "\n")
    (OUT / "bench_compile.md").write_text(md + "\n")
    if a.out:
        from etl.io import atomic_write_text

        atomic_write_text(a.out, json.dumps(res, indent=2) + "\n")
    print(md, flush=True)
    return res


def _table(res: dict[str, Any]) -> str:
    """The markdown summary (also printed)."""
    lines = [
        f"Engine step, {res['source']}; {res['threads']} threads, torch {res['torch']}, torch.compile dynamic="
        f"{res['dynamic']}; 1-min load {res['load_1min_before']:.1f} -> {res['load_1min_after']:.1f} on "
        f"{res['cpus']} CPUs; medians of {res['step_reps']} steps / {res['rounds_timed']} rounds per variant, "
        "interleaved",
        "",
        "| variant | compile (first call), s | s / step (min) | step vs cpp (min) | s / round, wall (min) "
        "| CPU s / round | round vs cpp (min) "
        "| grad max abs diff vs eager (rel) | params after rounds, max abs diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ag = res["agreement_vs_eager"]
    for v, s in res["step_s_median"].items():
        comp = res["compile_first_call_s"].get(v)
        comp_txt = "-" if comp is None else f"{comp:.1f}"
        warm = res["compile_first_call_warm_cache_s"]
        if comp is not None and v == f"compile-{res['modes'][0]}" and warm is not None:
            comp_txt += f" (warm cache {warm:.1f})"
        rw = res["round_wall_s_median"].get(v)
        round_txt = ("-", "-", "-") if rw is None else (
            f"{rw:.3f} ({res['round_wall_s_min'][v]:.3f})", f"{res['round_cpu_s_median'][v]:.3f}",
            f"{res['ratio_round_wall_vs_cpp'][v]:.2f}x ({res['ratio_round_wall_min_vs_cpp'][v]:.2f}x)")
        pd = ag[v].get("params_after_rounds_max_abs_diff")
        lines.append(f"| {v} | {comp_txt} | {s:.4f} ({res['step_s_min'][v]:.4f}) | "
                     f"{res['ratio_step_vs_cpp'][v]:.2f}x ({res['ratio_step_min_vs_cpp'][v]:.2f}x) | {round_txt[0]} | "
                     f"{round_txt[1]} | {round_txt[2]} | {ag[v]['step_grad_max_abs_diff']:.1e} "
                     f"({ag[v]['step_grad_max_rel_diff']:.1e}) | {'-' if pd is None else f'{pd:.1e}'} |")
    for v, err in res["compile_failed"].items():
        if v not in res["step_s_median"]:
            lines.append(f"| {v} | failed: {err} | - | - | - | - | - | - | - |")
        else:
            lines.append(f"| {v} (recompile for a new shape) | failed: {err} | | | - | - | - | | |")
    b = res["best_compiled"]
    if b is not None:
        lines.append("")
        lines.append(f"Fastest compiled variant per round: {b}, {res['ratio_round_wall_vs_cpp'][b]:.2f}x the C++ "
                     f"kernels' wall time "
                     f"({'C++ faster' if res['cpp_faster_than_best_compiled'] else 'compile faster'}).")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])

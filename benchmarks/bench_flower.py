"""Seconds per FedAvg round: Flower, a plain per-client PyTorch loop, and the abps runner.
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.options import parser

D, N_TRAIN, N_VAL, BIAS, W_NORM = 60, 250, 30, -2.2, 0.5
HIDDEN = (128, 64)
LR, WD, BATCH, EPOCHS, DROPOUT = 1e-3, 1e-5, 128, 2, 0.2
#: target: the abps runner at >= 30x Flower's seconds per round
TARGET_X_FLOWER = 30.0
#: that is about <= 0.145 s per abps round on 2 idle threads (30x Flower's measured 4.37 s)
TARGET_ROUND_S = 0.145


def client_data(i: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Client ``i``'s rows: ``x_train [250, 60]``, ``y_train [250]``, ``x_val [30, 60]``, ``y_val [30]``,
    ``x_test [30, 60]``, ``y_test [30]`` (float32). Deterministic in (seed, i); the label weight
    vector ``w`` (norm 0.5) is shared by all clients."""
    w = np.random.default_rng([seed, 0x57]).standard_normal(D)
    w *= W_NORM / np.linalg.norm(w)
    rng = np.random.default_rng([seed, 1, i])
    out: dict[str, np.ndarray] = {}
    for split, rows in (("train", N_TRAIN), ("val", N_VAL), ("test", N_VAL)):
        x = rng.standard_normal((rows, D)).astype(np.float32)
        p = 1.0 / (1.0 + np.exp(-(x.astype(np.float64) @ w + BIAS)))
        out[f"x_{split}"] = x
        out[f"y_{split}"] = (rng.random(rows) < p).astype(np.float32)
    return out


@functools.cache
def client_tensors(i: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """:func:`client_data` as torch tensors, built once per process and client (cached: the peers
    do not regenerate their rows every call)."""
    return {k: torch.from_numpy(v) for k, v in client_data(i, seed).items()}


_MODELS: dict[int, torch.nn.Module] = {}


def _worker_model() -> torch.nn.Module:
    """One reusable :func:`make_model` per thread (its weights are always overwritten by
    ``load_state_dict`` before use), so a client call does not pay for a fresh initialization."""
    tid = threading.get_ident()
    if tid not in _MODELS:
        _MODELS[tid] = make_model()
    return _MODELS[tid]


def make_model() -> torch.nn.Module:
    """The benchmark's MLP: 60-128-64-1, ReLU, dropout 0.2 after each hidden layer."""
    return torch.nn.Sequential(
        torch.nn.Linear(D, HIDDEN[0]), torch.nn.ReLU(), torch.nn.Dropout(DROPOUT),
        torch.nn.Linear(HIDDEN[0], HIDDEN[1]), torch.nn.ReLU(), torch.nn.Dropout(DROPOUT),
        torch.nn.Linear(HIDDEN[1], 1),
    )


def local_train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> None:
    """2 epochs of Adam (fresh, lr 1e-3, weight decay 1e-5) on shuffled batches of 128 (last one
    partial): what each client does per round, in the Flower client and in the loop alike."""
    opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WD)
    model.train()
    for _ in range(EPOCHS):
        perm = torch.randperm(x.shape[0], generator=gen)
        for lo in range(0, x.shape[0], BATCH):
            idx = perm[lo : lo + BATCH]
            loss = F.binary_cross_entropy_with_logits(model(x[idx]).squeeze(-1), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()


@torch.no_grad()
def client_auroc(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Val AUROC of ``model`` on one client's rows ``x [rows, 60]``, ``y [rows]``; NaN for a
    one-class split. Rank-based (:func:`federation.core.metrics.batched_auroc` on one row, the
    computation abps uses), equal to scikit-learn's ``roc_auc_score`` (tests/test_benchmarks.py)
    at about a tenth of its cost per call."""
    from federation.core.metrics import batched_auroc

    model.eval()
    s = model(x).squeeze(-1)
    return float(batched_auroc(s.unsqueeze(0), y.unsqueeze(0), torch.ones(1, y.shape[0], dtype=torch.bool))[0])


def _median_steady(rounds_s: list[float]) -> float:
    return statistics.median(rounds_s[1:] if len(rounds_s) > 1 else rounds_s)


# ------------------------------------------------------------------------------------------ loop
def run_loop(n: int, rounds: int, seed: int) -> dict[str, Any]:
    """Plain per-client loop: for each round, every client trains a copy of the global model, the
    server averages by sample count, every client scores the new global model on its val rows."""
    data = [client_tensors(i, seed) for i in range(n)]
    torch.manual_seed(seed)
    glob = make_model()
    m = make_model()  # the worker model, loaded with the global weights for every client
    gen = torch.Generator().manual_seed(seed)
    times: list[float] = []
    aurocs: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        acc = {k: torch.zeros_like(v) for k, v in glob.state_dict().items()}
        total = 0
        g_state = glob.state_dict()
        for c in data:
            m.load_state_dict(g_state)
            local_train(m, c["x_train"], c["y_train"], gen)
            k_rows = c["x_train"].shape[0]
            for k, v in m.state_dict().items():
                acc[k].add_(v, alpha=k_rows)
            total += k_rows
        glob.load_state_dict({k: v / total for k, v in acc.items()})
        aurocs = [client_auroc(glob, c["x_val"], c["y_val"]) for c in data]
        times.append(time.perf_counter() - t0)
    return {"rounds_s": times, "final_val_auroc_mean": float(np.nanmean(aurocs))}


# ------------------------------------------------------------------------------------------ abps
def federated_data(n: int, seed: int):
    """The workload as a :class:`federation.data.tensors.FederatedData` (all clients have equal sizes,
    so no padding)."""
    from federation.data.tensors import FederatedData, SplitTensors

    rows = [client_data(i, seed) for i in range(n)]
    splits = {}
    for split in ("train", "val", "test"):
        x = torch.from_numpy(np.stack([r[f"x_{split}"] for r in rows]))
        y = torch.from_numpy(np.stack([r[f"y_{split}"] for r in rows]))
        splits[split] = SplitTensors(x, y, torch.ones(y.shape, dtype=torch.bool),
                                     torch.full((n,), y.shape[1], dtype=torch.int64))
    return FederatedData(center_ids=[f"c{i:05d}" for i in range(n)], feature_names=[f"f{j}" for j in range(D)],
                         splits=splits, meta=torch.zeros(n, 15), meta_base=torch.zeros(n, 3))


def run_ours(data, rounds: int, seed: int, method: str = "fedavg") -> dict[str, Any]:
    """``run_one`` on the workload (fresh Adam per round); seconds per round from the callback."""
    from federation.core.config import build_config
    from federation.methods import get_method
    from federation.run.runner import run_one

    cls = get_method(method)
    cfg = build_config(method, cls.default_config, {"engine": {"reset_optimizer_each_round": True}},
                       rounds=rounds)
    stamps: list[float] = []
    t0 = time.perf_counter()
    res = run_one(cfg, data, seed, on_round=lambda r, m: stamps.append(time.perf_counter()))
    return {"rounds_s": np.diff([t0, *stamps]).tolist(), "final_val_auroc_mean": res.final_val_auroc_mean}


# ---------------------------------------------------------------------------------------- Flower
def flower_available() -> bool:
    """True when ``flwr`` (with its simulation extra) can be imported."""
    try:
        import flwr.simulation  # noqa: F401
    except ImportError:
        return False
    return True


def _flower_apps(n: int, rounds: int, seed: int, stamps: list[float], result: dict[str, Any]):
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    client = ClientApp()

    def _load(msg: Message, ctx: Context) -> tuple[torch.nn.Module, dict[str, torch.Tensor], int]:
        torch.set_num_threads(1)
        pid = int(ctx.node_config["partition-id"])
        model = _worker_model()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        return model, client_tensors(pid, seed), pid

    @client.train()
    def train(msg: Message, ctx: Context) -> Message:
        model, c, pid = _load(msg, ctx)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + pid)
        local_train(model, c["x_train"], c["y_train"], gen)
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                              "metrics": MetricRecord({"num-examples": int(c["x_train"].shape[0])})})
        return Message(content=content, reply_to=msg)

    @client.evaluate()
    def evaluate(msg: Message, ctx: Context) -> Message:
        model, c, _ = _load(msg, ctx)
        auc = client_auroc(model, c["x_val"], c["y_val"])
        metrics = MetricRecord({"auroc": auc, "num-examples": int(c["x_val"].shape[0])})
        return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)

    server = ServerApp()

    @server.main()
    def main(grid: Grid, ctx: Context) -> None:
        torch.manual_seed(seed)
        def mean_auroc(records: list[RecordDict], weighting: str) -> MetricRecord:
            # clients with a one-class val split report NaN; the mean is over the others (as ours)
            vals = [float(r["metrics"]["auroc"]) for r in records]
            return MetricRecord({"auroc": float(np.nanmean(vals)) if not all(np.isnan(vals)) else float("nan")})

        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=n, min_evaluate_nodes=n,
                          min_available_nodes=n, evaluate_metrics_aggr_fn=mean_auroc)

        def stamp(rnd: int, arrays: ArrayRecord) -> None:
            stamps.append(time.perf_counter())

        out = strategy.start(grid=grid, initial_arrays=ArrayRecord(make_model().state_dict()), num_rounds=rounds,
                             evaluate_fn=stamp)
        last = out.evaluate_metrics_clientapp.get(rounds)
        if last is not None and "auroc" in last:
            result["final_val_auroc_mean"] = float(last["auroc"])

    return server, client


def run_flower(n: int, rounds: int, seed: int, cpus: int) -> dict[str, Any]:
    """Flower ``run_simulation`` (Ray backend, 1 CPU per client, Ray given ``cpus`` CPUs)."""
    import logging

    from flwr.simulation import run_simulation

    stamps: list[float] = []
    result: dict[str, Any] = {}
    server, client = _flower_apps(n, rounds, seed, stamps, result)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"num_cpus": cpus, "num_gpus": 0, "include_dashboard": False,
                             "logging_level": logging.ERROR, "log_to_driver": False}}
    t0 = time.perf_counter()
    run_simulation(server_app=server, client_app=client, num_supernodes=n, backend_name="ray",
                   backend_config=backend)
    wall = time.perf_counter() - t0
    if len(stamps) < rounds + 1:
        raise RuntimeError(f"Flower finished {max(0, len(stamps) - 1)} of {rounds} rounds")
    result["rounds_s"] = np.diff(stamps).tolist()
    result["startup_and_shutdown_s"] = wall - (stamps[-1] - stamps[0])
    return result


# ------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints (and returns) the JSON document."""
    ap = parser(__doc__, clients=230, threads=2, flower_rounds=4, loop_rounds=3, ours_rounds=8, seed=0)
    ap.add_argument("--no-flower", action="store_true")
    ap.add_argument("--ab-prefetch", action="store_true",
                    help="also run abps with the engine's dropout-mask helper thread off (abps-sync), interleaved")
    ap.add_argument("--ab-kernels", action="store_true",
                    help="also run abps on the eager PyTorch step (ABPS_KERNELS=torch, abps-torch), interleaved")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    load0 = os.getloadavg()[0]
    data = federated_data(a.clients, a.seed)
    passes: dict[str, list[dict[str, Any]]] = {"abps": [], "loop": [], "flower": [], "abps-sync": [],
                                               "abps-torch": []}
    skipped = None
    if a.no_flower:
        skipped = "--no-flower"
    elif not flower_available():
        skipped = "flwr is not installed (pip install -e '.[bench]')"
    phases = [("abps", lambda: run_ours(data, a.ours_rounds, a.seed)),
              ("loop", lambda: run_loop(a.clients, a.loop_rounds, a.seed))]
    if skipped is None:
        phases.append(("flower", lambda: run_flower(a.clients, a.flower_rounds, a.seed, a.threads)))
    phases += phases[1::-1]  # loop, abps again
    if a.ab_prefetch:  # abps-sync, abps, abps-sync around the rest: the helper thread's effect, same load
        phases = [("abps-sync", lambda: _without_prefetch(run_ours, data, a.ours_rounds, a.seed)), *phases,
                  ("abps-sync", lambda: _without_prefetch(run_ours, data, a.ours_rounds, a.seed))]
    if a.ab_kernels:  # abps-torch, abps, abps-torch around the rest: the fused kernels' effect, same load
        phases = [("abps-torch", lambda: _eager_step(run_ours, data, a.ours_rounds, a.seed)), *phases,
                  ("abps-torch", lambda: _eager_step(run_ours, data, a.ours_rounds, a.seed))]
    for name, fn in phases:
        passes[name].append(fn())
        torch.set_num_threads(a.threads)  # Flower's in-process client calls set 1
        print(f"[bench_flower] {name}: rounds {[round(t, 3) for t in passes[name][-1]['rounds_s']]} s, "
              f"load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)

    def summary(name: str) -> dict[str, Any] | None:
        runs = passes[name]
        if not runs:
            return None
        steady = [t for r in runs for t in (r["rounds_s"][1:] if len(r["rounds_s"]) > 1 else r["rounds_s"])]
        out = {"median_s_per_round": statistics.median(steady), "first_round_s": [r["rounds_s"][0] for r in runs],
               "rounds_s": [r["rounds_s"] for r in runs],
               "final_val_auroc_mean": [r.get("final_val_auroc_mean") for r in runs]}
        if name == "flower":
            out["startup_and_shutdown_s"] = runs[0]["startup_and_shutdown_s"]
        return out

    s = {k: summary(k) for k in passes}
    ours, loop, flw = s["abps"]["median_s_per_round"], s["loop"]["median_s_per_round"], s["flower"]
    doc: dict[str, Any] = {
        "benchmark": "FedAvg round: Flower vs per-client loop vs abps runner",
        "clients": a.clients, "threads": a.threads, "torch": torch.__version__,
        "flwr": _flwr_version(), "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "load_1min_before": load0, "load_1min_after": os.getloadavg()[0],
        "flower": flw, "loop": s["loop"], "abps": s["abps"], "flower_skipped": skipped,
        "loop_x_vs_abps": loop / ours, "abps_sync": s["abps-sync"], "abps_torch_step": s["abps-torch"],
        "engine_kernels": _kernels_in_use(),
        "target_abps_x_vs_flower": TARGET_X_FLOWER, "target_abps_s_per_round": TARGET_ROUND_S,
    }
    if flw is not None:
        doc["abps_x_vs_flower"] = flw["median_s_per_round"] / ours
        doc["loop_x_vs_flower"] = flw["median_s_per_round"] / loop
        doc["target_met"] = doc["abps_x_vs_flower"] >= TARGET_X_FLOWER
    text = json.dumps(doc, indent=2)
    print(text)
    print(_table(doc), flush=True)
    if a.out:
        from etl.io import atomic_write_text

        atomic_write_text(a.out, text + "\n")
    return doc


def _without_prefetch(fn, *args):
    """``fn(*args)`` with the engine's dropout-mask helper thread off
    (:attr:`federation.engine.mlp.StackedEngine.prefetch_bytes` = 0; results are the same)."""
    from federation.engine.mlp import StackedEngine

    saved = StackedEngine.prefetch_bytes
    StackedEngine.prefetch_bytes = 0
    try:
        return fn(*args)
    finally:
        StackedEngine.prefetch_bytes = saved


def _eager_step(fn, *args):
    """``fn(*args)`` with the engine on its eager PyTorch step (``ABPS_KERNELS=torch``; the
    environment is restored afterwards)."""
    from unittest import mock

    with mock.patch.dict(os.environ, {"ABPS_KERNELS": "torch"}):
        return fn(*args)


def _kernels_in_use() -> bool:
    """Whether the abps runs used the fused C++ kernels (:mod:`federation.engine.kernels`)."""
    from federation.engine import kernels

    return kernels.available()


def _flwr_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("flwr")
    except Exception:  # not installed
        return None


def _table(doc: dict[str, Any]) -> str:
    """The human-readable summary printed after the JSON."""
    flw = doc["flower"]
    base = flw["median_s_per_round"] if flw else None
    lines = [f"FedAvg round, {doc['clients']} clients, {doc['threads']} threads, load "
             f"{doc['load_1min_before']:.1f} -> {doc['load_1min_after']:.1f} on {doc['cpus']} CPUs"]
    for name, label in (("flower", f"Flower {doc['flwr']} run_simulation (Ray)"), ("loop", "per-client loop"),
                        ("abps", "abps run_one (fedavg)")):
        r = doc[name]
        if r is None:
            lines.append(f"  {label:42s} skipped: {doc['flower_skipped']}")
            continue
        x = f"{base / r['median_s_per_round']:6.1f}x Flower" if base else ""
        lines.append(f"  {label:42s} {r['median_s_per_round']:8.3f} s/round {x}")
    if base:
        ok = "met" if doc["target_met"] else "MISSED"
        lines.append(f"  target: abps >= {TARGET_X_FLOWER:.0f}x Flower -> {doc['abps_x_vs_flower']:.1f}x ({ok})")
    else:
        lines.append(f"  abps vs per-client loop: {doc['loop_x_vs_abps']:.1f}x (Flower not measured)")
    lines.append(f"  abps step: {'fused C++ kernels' if doc['engine_kernels'] else 'eager PyTorch (kernels unavailable)'}")
    if doc.get("abps_torch_step"):
        eager = doc["abps_torch_step"]["median_s_per_round"]
        lines.append(f"  abps on the eager PyTorch step (ABPS_KERNELS=torch): {eager:.3f} s/round "
                     f"(kernels: {doc['abps']['median_s_per_round']:.3f}, {eager / doc['abps']['median_s_per_round']:.2f}x)")
    if doc.get("abps_sync"):
        sync = doc["abps_sync"]["median_s_per_round"]
        lines.append(f"  abps without the dropout helper thread: {sync:.3f} s/round "
                     f"(helper on: {doc['abps']['median_s_per_round']:.3f}; target <= {TARGET_ROUND_S} s at 2 threads)")
    elif doc["abps"] is not None:
        lines.append(f"  abps vs target <= {TARGET_ROUND_S} s/round (2 threads, idle): "
                     f"{doc['abps']['median_s_per_round'] / TARGET_ROUND_S:.2f}x the target")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""Seconds to write one round checkpoint against seconds per round, and the share of a run that the
default cadence costs (target <= 2 %): clinical methods at n = 230 centers, the SAGE benchmark's
round (50 clients, Fashion-MNIST) and the gossip benchmark's tick (50 LeNet-5 nodes).

    .venv/bin/python -m benchmarks.bench_checkpoint [--centers 230] [--rounds 4] [--threads 1] [--methods fedavg,abps,wpfed]
        [--sage-clients 50] [--sage-rounds 3] [--gossip-nodes 50] [--gossip-ticks 150] [--only clinical,sage,gossip]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

#: target: checkpoints at the default cadence cost at most this share of a run
TARGET_SHARE = 0.02


def _time(name: str, data: Any, rounds: int, folder: Path) -> dict[str, Any]:
    from federation.core.config import build_config
    from federation.methods import get_method
    from federation.run import checkpoint
    from federation.run.runner import run_one

    cfg = build_config(name, get_method(name).default_config, None, rounds=rounds)
    path = folder / f"{name}.json.ckpt"
    ends: list[float] = []
    writes: list[float] = []

    def on_round(tau: int, m: dict[str, float]) -> None:
        ends.append(time.perf_counter())

    def on_checkpoint(tau: int, snap: Any) -> None:
        t0 = time.perf_counter()
        checkpoint.save(path, {"stamp": {}, "mlflow": {}, "done": [], "current": {"seed": 0, "state": snap()}})
        writes.append(time.perf_counter() - t0)

    t_start = time.perf_counter()
    run_one(cfg, data, 11, on_round, checkpoint=on_checkpoint)
    # round k's time: from the end of round k - 1 (after its checkpoint) to the end of round k
    starts = [t_start] + [e + w for e, w in zip(ends[:-1], writes)]
    per_round = [e - s for s, e in zip(starts, ends)]
    return {"seconds_per_round": statistics.fmean(per_round[1:]), "seconds_per_checkpoint": statistics.fmean(writes),
            "checkpoint_mb": path.stat().st_size / 2**20}


class _Offers:
    """A checkpoint hook that times the run between its calls and writes (timed) at the time points
    in ``write_at``: seconds per round = wall time between the first and the last call, less the
    writes in between, over the rounds between them."""

    def __init__(self, path: Path, write_at: set[int], payload: Any) -> None:
        self.path, self.write_at, self.payload = path, write_at, payload
        self.calls: list[tuple[int, float]] = []
        self.writes: list[tuple[int, float]] = []

    def __call__(self, tau: int, snap: Any) -> None:
        from federation.run import checkpoint

        self.calls.append((tau, time.perf_counter()))
        if tau in self.write_at:
            t0 = time.perf_counter()
            checkpoint.save(self.path, self.payload(tau, snap()))
            self.writes.append((tau, time.perf_counter() - t0))

    def figures(self, every: int, minutes: float) -> dict[str, Any]:
        (t_first, c_first), (t_last, c_last) = self.calls[0], self.calls[-1]
        inside = sum(w for tau, w in self.writes if t_first <= tau < t_last)
        per_round = (c_last - c_first - inside) / (t_last - t_first)
        write = statistics.fmean(w for _, w in self.writes)
        gap = min(x for x in (every * per_round if every else None, 60.0 * minutes if minutes else None) if x)
        return {"seconds_per_round": per_round, "seconds_per_checkpoint": write,
                "checkpoint_mb": self.path.stat().st_size / 2**20, "checkpoint_over_round": write / per_round,
                "default_every_rounds": every, "default_every_minutes": minutes,
                "share_at_default": write / (gap + write),
                "share_every_25_rounds": write / (25 * per_round + write)}


def _time_sage(clients: int, rounds: int, folder: Path) -> dict[str, Any]:
    """One SAGE-OS selector run of ``rounds`` rounds at the paper's sizes but ``clients``."""
    from federation.core.graphs import neighbour_table
    from federation.data.image_shards import make_graph, make_shards
    from federation.images.run import load_dataset, run_selector
    from federation.methods.selectors import parse_config

    cfg = parse_config({"benchmark": "sage", "n_clients": clients, "rounds": rounds, "selectors": ["SAGE-OS"]})
    ds, spec = load_dataset(cfg)
    shards = make_shards(ds, cfg.n_clients, cfg.alpha_dir, 0)
    cand, valid, degree = neighbour_table(make_graph(cfg.graph, cfg.n_clients, 0, cfg.er_p, cfg.ba_m))
    hook = _Offers(folder / "sage.json.ckpt", set(range(1, rounds)),
                   lambda tau, state: {"stamp": {}, "mlflow": {}, "done": {}, "current": {"unit": "0/sage_os",
                                                                                           "state": state}})
    run_selector("sage_os", cfg, shards, spec, cand, valid, degree, 0, checkpoint=hook)
    return {"clients": clients, **hook.figures(cfg.checkpoint.every_rounds, cfg.checkpoint.every_minutes)}


def _time_gossip(nodes: int, ticks: int, folder: Path) -> dict[str, Any]:
    """One gossip simulation (the paper's baseline network but ``nodes``) of ``ticks`` ticks,
    writing a checkpoint at three ticks."""
    from etl.images import FASHION_MNIST_DIR, load_idx_dataset
    from federation.gossip.runner import checkpoint_config
    from federation.gossip.simulation import GossipConfig, simulate

    data = load_idx_dataset(FASHION_MNIST_DIR, "fashion-mnist")
    cfg = GossipConfig(n_nodes=nodes, ticks=ticks, eval_every=50)
    hook = _Offers(folder / "vv.json.ckpt", {ticks // 4, ticks // 2, 3 * ticks // 4},
                   lambda tau, state: {"stamp": {}, "mlflow": {}, "done": {}, "current": {"unit": "plain",
                                                                                           "state": state}})
    simulate(cfg, data, 0, checkpoint=hook)
    cadence = checkpoint_config({})
    return {"nodes": nodes, "ticks": ticks, **hook.figures(cadence.every_rounds, cadence.every_minutes)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns (and prints) the result document."""
    from federation.core.config import CheckpointConfig
    from federation.data.synthetic import generate_fedprox_cohort
    from federation.data.tensors import FederatedData

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--centers", type=int, default=230)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--methods", default="fedavg,abps,wpfed")
    ap.add_argument("--sage-clients", type=int, default=50)
    ap.add_argument("--sage-rounds", type=int, default=3)
    ap.add_argument("--gossip-nodes", type=int, default=50)
    ap.add_argument("--gossip-ticks", type=int, default=150)
    ap.add_argument("--only", default="clinical,sage,gossip", help="which runs to time (comma-separated)")
    a = ap.parse_args(argv)
    only = set(a.only.split(","))
    torch.set_num_threads(a.threads)
    every = CheckpointConfig().every_rounds
    doc: dict[str, Any] = {"benchmark": "checkpoint write vs round", "threads": a.threads,
                           "default_every_rounds": every, "target_share": TARGET_SHARE}
    names = a.methods.split(",") if "clinical" in only else []
    with tempfile.TemporaryDirectory() as tmp:
        if names:
            cohort, centers = generate_fedprox_cohort(a.centers, seed=0)
            data = FederatedData.from_frames(cohort, centers)
            doc.update(centers=data.n_centers, features=data.d)
        for name in names:
            r = _time(name, data, a.rounds, Path(tmp))
            r["checkpoint_over_round"] = r["seconds_per_checkpoint"] / r["seconds_per_round"]
            r["share_at_default"] = r["seconds_per_checkpoint"] / (every * r["seconds_per_round"] +
                                                                    r["seconds_per_checkpoint"])
            doc[name] = r
        if "sage" in only:
            doc["sage"] = _time_sage(a.sage_clients, a.sage_rounds, Path(tmp))
        if "gossip" in only:
            doc["gossip"] = _time_gossip(a.gossip_nodes, a.gossip_ticks, Path(tmp))
    print(json.dumps(doc, indent=2))
    for name in [*names, *(k for k in ("sage", "gossip") if k in doc)]:
        r = doc[name]
        ok = "met" if r["share_at_default"] <= TARGET_SHARE else "MISSED"
        unit = "tick" if name == "gossip" else "round"
        cadence = (f"every {r.get('default_every_rounds', every)} {unit}s" if r.get("default_every_rounds", every)
                   else "") + (f" / {r['default_every_minutes']:g} min" if r.get("default_every_minutes") else "")
        print(f"{name}: {r['seconds_per_round']:.3f} s/{unit}, checkpoint {r['seconds_per_checkpoint']:.3f} s "
              f"({r['checkpoint_mb']:.1f} MB) = {r['checkpoint_over_round']:.2f} {unit}s; {cadence.strip(' /')}: "
              f"{100 * r['share_at_default']:.2f} % of the run (target <= {100 * TARGET_SHARE:.0f} %: {ok})")
    return doc


if __name__ == "__main__":
    main()

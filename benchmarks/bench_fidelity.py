"""Fidelity study of ABPS's goal-aware isolation (ABPS paper Sec. 6.5).
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GOALS = ("diversity", "homogeneity", "alignment")
PRESET = {"diversity": "abps-div", "homogeneity": "abps-hom", "alignment": "abps-align"}
#: ABPS paper Sec. 6.5 / Table 1 (50 rounds, 5 seeds): isolation per round, E|P|, bandwidth x FedAvg, AUROC.
PAPER = {
    "diversity": {"rest": 0.41, "partners": 0.59, "bandwidth": 0.16, "auroc": 0.694},
    "homogeneity": {"rest": None, "partners": 0.99, "bandwidth": 0.25, "auroc": 0.742},
    "alignment": {"rest": None, "partners": 0.99, "bandwidth": 0.25, "auroc": 0.739},
}


def readings(gammas: list[float]) -> list[dict[str, Any]]:
    """Every (tau_mode, candidacy, normalize_metadata, gamma) combination, as ABPS parameter overrides
    (candidacy only varies under ``per_center``: the global sets are symmetric)."""
    structures = [("global", "proposer"), ("per_center", "proposer"), ("per_center", "mutual")]
    return [{"tau_mode": t, "candidacy": c, "normalize_metadata": z, "gamma": g}
            for (t, c), z, g in itertools.product(structures, (True, False), gammas)]


def reading_label(r: dict[str, Any]) -> str:
    """Short name of a reading, e.g. ``per_center/mutual/raw/g=1.41`` (``global/raw/g=2``)."""
    cand = "" if r["tau_mode"] == "global" else f"/{r.get('candidacy', 'proposer')}"
    return f"{r['tau_mode']}{cand}/{'z' if r['normalize_metadata'] else 'raw'}/g={r['gamma']:.3g}"


def selection_only(meta: Any, reading: dict[str, Any], goal: str, rounds: int = 20, seed: int = 11) -> float:
    """Isolation rate of the matching alone, every UCB at the prior (0.5 = tau_acc, as in round 1): the
    rest that the candidate sets and the kappa = 1 capacity produce by themselves, without training.

    Args:
        meta: ``[n, 15]`` metadata vectors.
    Returns:
        Mean over ``rounds`` independent matchings of the share of centers left without a partner.
    """
    import numpy as np
    import torch

    from abps.goal_filter import candidate_mask
    from abps.matching import propose_reject

    n = meta.shape[0]
    mask, _ = candidate_mask(meta.double(), goal, 0.25, reading["normalize_metadata"], reading["tau_mode"],
                             reading.get("candidacy", "proposer"))
    prior = torch.full((n, n), 0.5, dtype=torch.float64)
    return statistics.fmean(propose_reject(prior, mask, 1, 0.5, 0.1, np.random.default_rng([seed, r])).isolation_rate()
                            for r in range(rounds))


def target_distance(rows: dict[str, dict[str, float]]) -> float:
    """How far one reading's three goal rows fall outside the study's targets (0 = all met).

    Diversity: isolation per round in [0.20, 0.60]. Homogeneity and alignment: isolation rate <= 0.05
    and E|P| >= 0.95. Distances are in share units and summed over the rows.
    """
    d = rows["diversity"]["rest"]
    out = max(0.0, 0.20 - d) + max(0.0, d - 0.60)
    for g in ("homogeneity", "alignment"):
        out += max(0.0, rows[g]["rest"] - 0.05) + max(0.0, 0.95 - rows[g]["partners"])
    return out


def paper_distance(rows: dict[str, dict[str, float]]) -> float:
    """Summed absolute distance to the paper's isolation rate (diversity) and E|P| (all three rows)."""
    out = abs(rows["diversity"]["rest"] - PAPER["diversity"]["rest"])
    return out + sum(abs(rows[g]["partners"] - PAPER[g]["partners"]) for g in GOALS)


def choose(table: dict[str, dict[str, dict[str, float]]]) -> str:
    """The reading label with the smallest (target distance, paper distance)."""
    return min(table, key=lambda k: (round(target_distance(table[k]), 9), paper_distance(table[k])))


def _cohort(out: Path) -> Path:
    given = os.environ.get("ABPS_FIDELITY_COHORT")
    if given:
        return Path(given)
    mimic, cohort = out / "mimic", out / "cohort"
    cli = [sys.executable, "-c", "from cli.app import main; main()"]
    if not (mimic / "synth_manifest.json").is_file():
        subprocess.run([*cli, "synth", "mimic", "--out", str(mimic)], check=True)
    if not (cohort / "centers.parquet").is_file():
        subprocess.run([*cli, "etl", "--mimic-dir", str(mimic), "--out", str(cohort)], check=True)
    return cohort


def run_cell(data: Any, goal: str, reading: dict[str, Any], rounds: int, seed: int) -> dict[str, Any]:
    """One ABPS+P+Q+kappa=1 run under ``goal`` and ``reading``: per-round isolation rate and |P|, final
    bandwidth and AUROC."""
    from federation.core.config import build_config
    from federation.methods import get_method
    from federation.run.runner import run_one

    name = PRESET[goal]
    # bandwidth relative to FedAvg over the same number of rounds (the ledger default divides by 50 rounds)
    cfg = build_config(name, get_method(name).default_config, {"params": dict(reading), "reference_rounds": rounds},
                       rounds=rounds)
    t0 = time.perf_counter()
    res = run_one(cfg, data, seed)
    return {
        "goal": goal, **reading, "seed": seed, "rounds": rounds,
        "rest_per_round": [h["isolation_rate"] for h in res.history],
        "partners_per_round": [h["mean_partners"] for h in res.history],
        "bandwidth": res.rel_bandwidth, "auroc": res.final_auroc_mean,
        "seconds": time.perf_counter() - t0,
    }


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """``{reading label: {goal: {rest, rest_min, rest_max, partners, bandwidth, auroc, seeds}}}``."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    keyed: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        keyed.setdefault((reading_label(r), r["goal"]), []).append(r)
    for (label, goal), rs in keyed.items():
        rest_rounds = [statistics.fmean(v) for v in zip(*(r["rest_per_round"] for r in rs))]
        table.setdefault(label, {})[goal] = {
            "rest": statistics.fmean(rest_rounds), "rest_min": min(rest_rounds), "rest_max": max(rest_rounds),
            "partners": statistics.fmean(p for r in rs for p in r["partners_per_round"]),
            "bandwidth": statistics.fmean(r["bandwidth"] for r in rs),
            "auroc": statistics.fmean(r["auroc"] for r in rs), "seeds": float(len(rs)),
        }
    return {k: v for k, v in table.items() if all(g in v for g in GOALS)}


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.1f} %"


def markdown(table: dict[str, dict[str, dict[str, float]]], rounds: int, seeds: list[int]) -> str:
    """The Sec. 6.5 table of every reading beside the paper's rows, and the chosen reading."""
    lines = [f"Rounds {rounds}, seeds {' '.join(map(str, seeds))}. Isolation = mean over rounds of the share "
             "of centers with P_i empty (min-max over rounds in brackets).", "",
             "| reading | goal | isolation per round | E\\|P\\| | bandwidth x FedAvg | AUROC | target miss |",
             "|---|---|---|---|---|---|---|"]
    for g in GOALS:
        p = PAPER[g]
        rest = "41 %" if p["rest"] else "rare (E\\|P\\| 0.99)"
        lines.append(f"| **paper** (50 rounds) | {g} | {rest} | {p['partners']:.2f} | {p['bandwidth']:.2f}x | "
                     f"{p['auroc']:.3f} | |")
    for label in sorted(table, key=lambda k: (target_distance(table[k]), k)):
        rows = table[label]
        miss = target_distance(rows)
        for g in GOALS:
            r = rows[g]
            lines.append(f"| {label} | {g} | {_pct(r['rest'])} ({_pct(r['rest_min'])}-{_pct(r['rest_max'])}) | "
                         f"{r['partners']:.3f} | {r['bandwidth']:.3f}x | {r['auroc']:.3f} | "
                         f"{miss:.3f} |")
    if table:
        lines += ["", f"Closest reading on all three rows at once: **{choose(table)}**."]
    return "\n".join(lines) + "\n"


def structural_markdown(structural: dict[str, dict[str, float]]) -> str:
    """Table of :func:`selection_only` isolation rates for every reading's candidate structure."""
    lines = ["Selection only (no training; every UCB at the prior, kappa 1, 20 matchings): isolation rate per goal.",
             "", "| candidate structure | diversity | homogeneity | alignment |", "|---|---|---|---|"]
    for label, row in structural.items():
        lines.append(f"| {label.rsplit('/g=', 1)[0]} | " + " | ".join(_pct(row[g]) for g in GOALS) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run the study (reduced by default, see the module docstring), print and write the table."""
    import torch

    from etl.io import atomic_write_text
    from federation.data.tensors import FederatedData

    torch.set_num_threads(int(os.environ.get("ABPS_FIDELITY_THREADS", "1")))
    out = Path(os.environ.get("ABPS_FIDELITY_OUT", "bench_out/fidelity"))
    out.mkdir(parents=True, exist_ok=True)
    rounds = int(os.environ.get("ABPS_FIDELITY_ROUNDS", "15"))
    seeds = [int(s) for s in os.environ.get("ABPS_FIDELITY_SEEDS", "11").split()]
    gammas = [float(g) for g in os.environ.get("ABPS_FIDELITY_GAMMAS", f"2 {math.sqrt(2)} 0.1").split()]
    data = FederatedData.from_cohort(_cohort(out))
    structural = {reading_label(r): {g: selection_only(data.meta, r, g) for g in GOALS}
                  for r in readings(gammas[:1])}
    only = [x for x in os.environ.get("ABPS_FIDELITY_ONLY", "").split(",") if x]
    runs: list[dict[str, Any]] = []
    prev = out / "fidelity.json"
    if os.environ.get("ABPS_FIDELITY_RESUME") and prev.is_file():
        old = json.loads(prev.read_text())
        if old.get("rounds") == rounds:
            runs = [r for r in old["runs"] if r["seed"] in seeds]
    done = {(reading_label(r), r["goal"], r["seed"]) for r in runs}
    todo = [r for r in readings(gammas) if not only or reading_label(r) in only]
    todo.sort(key=lambda r: only.index(reading_label(r)) if only else 0)
    for seed, reading, goal in itertools.product(seeds, todo, GOALS):
        if (reading_label(reading), goal, seed) in done:
            continue
        runs.append(run_cell(data, goal, reading, rounds, seed))
        r = runs[-1]
        print(f"{reading_label(reading):26s} {goal:12s} seed {seed}: rest {statistics.fmean(r['rest_per_round']):.3f} "
              f"E|P| {statistics.fmean(r['partners_per_round']):.3f} bw {r['bandwidth']:.3f}x "
              f"AUROC {r['auroc']:.3f} ({r['seconds']:.0f} s)", flush=True)
        atomic_write_text(out / "fidelity.json", json.dumps({"rounds": rounds, "seeds": seeds, "runs": runs,
                                                             "selection_only": structural}, indent=1) + "\n")
    table = summarize_runs(runs)
    md = markdown(table, rounds, seeds) + "\n" + structural_markdown(structural)
    atomic_write_text(out / "fidelity.md", md)
    print(md)


if __name__ == "__main__":
    main()

"""Wall time of Table 1 in full: ``abps sweep --config configs/table1.yaml`` on 2 cores.
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: target: Table 1 in full with ``abps sweep`` on 2 cores, in minutes
TARGET_MIN = 30.0
ROOT = Path(__file__).resolve().parent.parent


def _cli(args: list[str]) -> None:
    """Run the ``abps`` CLI of this checkout in a child process; raises on a non-zero exit."""
    cmd = [sys.executable, "-c", "from cli.app import main; main()", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)


def build_cohort(workdir: Path, stays: int) -> tuple[Path, float]:
    """The synthetic MIMIC cohort under ``workdir`` (``mimic/`` source, ``cohort/`` ETL output),
    built with the CLI unless ``cohort/cohort.parquet`` exists. Returns (cohort dir, seconds spent
    building; 0 when reused)."""
    cohort = workdir / "cohort"
    if (cohort / "cohort.parquet").exists():
        return cohort, 0.0
    t0 = time.perf_counter()
    workdir.mkdir(parents=True, exist_ok=True)
    _cli(["synth", "mimic", "--out", str(workdir / "mimic"), "--stays", str(stays)])
    _cli(["etl", "--mimic-dir", str(workdir / "mimic"), "--out", str(cohort)])
    return cohort, time.perf_counter() - t0


def _cpu_s() -> float:
    """User + system CPU seconds of this process and its reaped children (the pool workers)."""
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints (and returns) the JSON document.

    Raises:
        SystemExit: a cell of the sweep failed (the document is printed first).
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cohort", type=Path, default=None, help="an existing cohort directory (abps etl output)")
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("ABPS_BENCH_WORKDIR", "bench_out/table1")),
                    help="where the synthetic source and cohort are built (reused) without --cohort")
    ap.add_argument("--stays", type=int, default=94_458, help="synthetic ICU stays (default: MIMIC-IV v3.1's)")
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "table1.yaml")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=None, help="override every cell's rounds (reduced run)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="override the file's seeds (reduced run)")
    ap.add_argument("--methods", default=None, help="comma-separated subset of the file's methods (reduced run)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    from federation.sweep import load_sweep, run_sweep

    spec, base = load_sweep(a.config)
    if a.methods:
        keep = {m.strip() for m in a.methods.split(",") if m.strip()}
        entries = [e for e in spec.methods if e.method in keep]
        unknown = keep - {e.method for e in entries}
        if unknown:
            raise SystemExit(f"--methods: not in {a.config}: {', '.join(sorted(unknown))}")
        spec = spec.model_copy(update={"methods": entries})
    build_s = 0.0
    cohort = a.cohort
    if cohort is None:
        cohort, build_s = build_cohort(a.workdir, a.stays)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="abps-table1-") as tmp:
        cpu0, t0 = _cpu_s(), time.perf_counter()
        out = run_sweep(spec, base, cohort, executor="local", workers=a.workers, rounds=a.rounds, seeds=a.seeds,
                        tracking_uri=f"sqlite:///{tmp}/mlflow.db", experiment="bench-table1", progress=False)
        wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    reduced = bool(a.rounds or a.seeds or a.methods)
    per_method: dict[str, list[float]] = {}
    for c in out.cells:
        if c.key in out.seconds:
            per_method.setdefault(c.label, []).append(out.seconds[c.key])
    cell_s = sum(out.seconds.values())
    doc: dict[str, Any] = {
        "benchmark": "Table 1 sweep wall time", "config": str(a.config), "cohort": str(cohort),
        "cohort_build_s": build_s, "workers": a.workers, "rounds_override": a.rounds, "seeds_override": a.seeds,
        "methods": [e.method for e in spec.methods], "cells": len(out.cells), "ran": len(out.ran),
        "failed": len(out.failed), "wall_s": wall, "cpu_s_incl_workers": cpu, "wall_min": wall / 60.0,
        "target_min": TARGET_MIN, "ratio_to_target": wall / 60.0 / TARGET_MIN, "reduced": reduced,
        "cpus": os.cpu_count(), "load_1min_before": load0, "load_1min_after": os.getloadavg()[0],
        # seconds inside the workers (run_one of each cell), by row: where the wall time goes
        "cell_s_total": cell_s, "workers_busy_share": cell_s / (a.workers * wall) if wall > 0 else 0.0,
        "cell_s_mean_by_row": {k: sum(v) / len(v) for k, v in per_method.items()},
    }
    text = json.dumps(doc, indent=2)
    print(text)
    ok = "met" if wall / 60.0 <= TARGET_MIN else "MISSED"
    print(f"Table 1 sweep: {len(out.cells)} cells ({len(out.failed)} failed), {a.workers} workers, "
          f"wall {wall:.1f} s = {wall / 60:.2f} min (CPU {cpu:.0f} s), target <= {TARGET_MIN:.0f} min: "
          f"ratio {doc['ratio_to_target']:.2f} ({'REDUCED run, not the target workload' if reduced else ok}); "
          f"load {load0:.1f} -> {doc['load_1min_after']:.1f} on {os.cpu_count()} CPUs", flush=True)
    if a.out:
        from etl.io import atomic_write_text

        atomic_write_text(a.out, text + "\n")
    if out.failed:
        for key, msg in sorted(out.failed.items()):
            print(f"  failed: {key}: {msg}", file=sys.stderr)
        raise SystemExit(1)
    return doc


if __name__ == "__main__":
    main()

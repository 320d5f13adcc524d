"""How far results move across CPU kinds and engine steps: the demo sweep under each platform.
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ABPS_KERNELS_MARCH": "x86-64-v3"}
PLATFORMS = {"native-fused": {"ABPS_KERNELS": "cpp"}, "native-eager": {"ABPS_KERNELS": "torch"},
             "avx2-fused": {**AVX2, "ABPS_KERNELS": "cpp"}, "avx2-eager": {**AVX2, "ABPS_KERNELS": "torch"}}


def _abps(args: list[str], env: dict[str, str]) -> None:
    cmd = [str(Path(sys.executable).parent / "abps"), *args]
    subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cohort", default=str(ROOT / "demo_out" / "cohort"))
    ap.add_argument("--rounds", type=int, default=None, help="override the demo's 30 rounds")
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--platforms", nargs="+", default=list(PLATFORMS), choices=list(PLATFORMS))
    ap.add_argument("--out", default=str(ROOT / "bench_out" / "platforms.json"))
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="abps-platforms-"))
    uri = f"sqlite:///{work}/ml.db"
    tables: dict[str, dict[str, dict[str, str]]] = {}
    seconds: dict[str, float] = {}
    for name in a.platforms:
        env = {**PLATFORMS[name], "ABPS_KERNELS_CACHE": str(work / f"kernels-{name}")}
        extra = (["--rounds", str(a.rounds)] if a.rounds else []) + (
            ["--seeds", *map(str, a.seeds)] if a.seeds else [])
        t0 = time.perf_counter()
        _abps(["sweep", "--config", "configs/demo.yaml", "--cohort", a.cohort, "--experiment", f"p-{name}",
               "--tracking-uri", uri, "--no-progress", *extra], env)
        seconds[name] = time.perf_counter() - t0
        _abps(["report", "--experiment", f"p-{name}", "--out", str(work / f"report-{name}"), "--tracking-uri", uri],
              {})
        with open(work / f"report-{name}" / "table1.csv") as fh:
            tables[name] = {r["label"]: r for r in csv.DictReader(fh)}
        print(f"{name}: {seconds[name]:.0f} s", flush=True)
    base = tables[a.platforms[0]]
    rows = []
    print(f"\n{'row':<12}" + "".join(f"{p:>14}" for p in a.platforms) + f"{'max |dAUROC|':>14}{'bytes equal':>13}")
    for label in base:
        aurocs = [float(tables[p][label]["auroc_mean"]) for p in a.platforms]
        d = max(abs(x - aurocs[0]) for x in aurocs)
        same_bytes = len({tables[p][label]["bytes_mean"] for p in a.platforms}) == 1
        rows.append({"label": label, "auroc": dict(zip(a.platforms, aurocs)), "max_abs_diff": d,
                     "bytes_equal": same_bytes})
        print(f"{label:<12}" + "".join(f"{x:>14.4f}" for x in aurocs) + f"{d:>14.4f}{str(same_bytes):>13}")
    doc = {"cohort": a.cohort, "rounds": a.rounds, "seeds": a.seeds, "seconds": seconds, "rows": rows,
           "max_abs_auroc_diff": max(r["max_abs_diff"] for r in rows),
           "bytes_equal": all(r["bytes_equal"] for r in rows)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nlargest AUROC difference across platforms: {doc['max_abs_auroc_diff']:.4f}; "
          f"bytes identical: {doc['bytes_equal']}  -> {a.out}")
    return doc


if __name__ == "__main__":
    main()

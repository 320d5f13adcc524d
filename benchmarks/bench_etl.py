"""ETL throughput and memory: chartevents rows per second end to end, and peak RSS of `abps etl`.

Writes a synthetic MIMIC-IV v3.1 directory with at least 50 M chartevents rows (the default
94,458 stays charted every 0.5 h), then times ``abps etl`` on it in a child process three times
and reads each child's peak resident set size and CPU time:

* ``uncached``: ``--chart-cache off``, the gzip CSV scanned directly (the path before the cache);
* ``first run``: an empty cache folder, so the run writes the chartevents Parquet cache
  (etl/chart_cache.py: the vitals per stay, vital and charttime over the whole file, sorted)
  and then reads it;
* ``cached run``: the same command again, reading the cache.

Target on a 2-core machine: >= 5 M rows/s end to end, <= 3 GB peak RSS; each line
prints the figure, its target and the ratio measured in this run, and the 1-minute load average
(the machine may be shared: wall-clock rates fall with load, CPU seconds much less).

``python -m benchmarks.bench_etl [--stays N] [--chart-hours-step H] [--workdir DIR]
[--runs uncached,first,cached]``; results go to ``bench_out/etl.json``. The synthetic folder lies
under ``--workdir`` (default ``$ABPS_BENCH_WORKDIR``, else ``bench_out``; e.g.
``ABPS_BENCH_WORKDIR=/tmp/etlbench python -m benchmarks.run etl``) as ``synth_etl`` and is re-used when its manifest
matches; delete it when done (it is several GB with the cache).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench_out"
TARGET_ROWS_PER_S = 5e6
TARGET_PEAK_GB = 3.0
#: v3.1 chartevents rows (reference/mimic-iv-etl-facts.md), for the extrapolation line.
V31_ROWS = 432_997_491
RUNS = ("uncached", "first", "cached")


def _synth(folder: Path, stays: int, step: float) -> int:
    manifest = folder / "synth_manifest.json"
    if manifest.exists():
        m = json.loads(manifest.read_text())
        if m["options"]["stays"] == stays and float(m["options"]["chart_hours_step"]) == step:
            return int(m["rows"]["chartevents"])
    cmd = [sys.executable, "-c", "from cli.app import main; main()", "synth", "mimic", "--out", str(folder),
           "--stays", str(stays), "--chart-hours-step", str(step)]
    subprocess.run(cmd, check=True, cwd=REPO)
    return int(json.loads(manifest.read_text())["rows"]["chartevents"])


_CHILD = ("import resource, sys; from cli.app import main\n"
          "code = 0\n"
          "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code if isinstance(e.code, int) else 1\n"
          "u = resource.getrusage(resource.RUSAGE_SELF)\n"
          "print('PEAK_RSS_KB', u.ru_maxrss, 'CPU_S', u.ru_utime + u.ru_stime, 'EXIT', code)")


def run_once(synth_dir: Path, out: Path, cache: str, rows: int) -> dict:
    """One ``abps etl`` in a child process: wall, CPU, peak RSS, rows/s, the cache's status."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, "etl", "--mimic-dir", str(synth_dir), "--out", str(out),
                           "--chart-cache", cache], check=True, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    tail = proc.stdout.rsplit("PEAK_RSS_KB", 1)[1].split()
    if int(tail[4]) != 0:  # the ETL refused its input: say why instead of a missing report file
        why = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"abps etl exited with {tail[4]} on {synth_dir}: {why}")
    report = json.loads((out / "cohort_report.json").read_text())
    return {
        "etl_wall_s": round(wall, 2),
        "cpu_s": round(float(tail[2]), 2),
        "rows_per_s": round(rows / wall),
        "rows_per_cpu_s": round(rows / float(tail[2])),
        "peak_rss_mb": round(int(tail[0]) / 1024, 1),  # the ETL process's own peak (Linux: KiB)
        "chartevents_stage_s": round(report["timings_s"].get("chartevents_s", float("nan")), 2),
        "cache": report.get("chartevents_cache", {}),
        "centers": report["centers"],
        "stays": report["stays"],
        "load_avg_1m_before": round(load, 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the result dict (also written to bench_out/etl.json)."""
    ap = argparse.ArgumentParser(prog="bench_etl")
    ap.add_argument("--stays", type=int, default=94_458)
    ap.add_argument("--chart-hours-step", type=float, default=0.5)
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("ABPS_BENCH_WORKDIR", OUT)),
                    help="folder for the synthetic data, cache and outputs (default $ABPS_BENCH_WORKDIR or bench_out)")
    ap.add_argument("--runs", default=",".join(RUNS), help="comma-separated subset of uncached,first,cached")
    args = ap.parse_args([] if argv is None else argv)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if not runs or any(r not in RUNS for r in runs):
        raise SystemExit(f"--runs takes a comma-separated subset of {','.join(RUNS)}")
    OUT.mkdir(exist_ok=True)
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    synth_dir = work / "synth_etl"
    rows = _synth(synth_dir, args.stays, args.chart_hours_step)
    gz_bytes = (synth_dir / "icu" / "chartevents.csv.gz").stat().st_size
    cache = work / "chart_cache"
    res: dict = {"chartevents_rows": rows, "chartevents_gz_mb": round(gz_bytes / 2**20, 1),
                 "cores": os.cpu_count(), "runs": {}}
    for name in runs:
        if name == "first":
            shutil.rmtree(cache, ignore_errors=True)
        setting = "off" if name == "uncached" else str(cache)
        res["runs"][name] = run_once(synth_dir, work / f"etl_cohort_{name}", setting, rows)
    if cache.exists():
        res["cache_mb"] = round(sum(p.stat().st_size for p in cache.iterdir()) / 2**20, 1)
        res["cache_rows"] = next((r["cache"]["rows"] for r in res["runs"].values() if r["cache"].get("rows")), None)
    (OUT / "etl.json").write_text(json.dumps(res, indent=2))
    cached_rows = f", {res['cache_rows']:,} rows of vitals per charttime" if res.get("cache_rows") else ""
    print(f"chartevents: {rows:,} rows, {res['chartevents_gz_mb']} MB gzip CSV"
          + (f"; Parquet cache {res['cache_mb']} MB{cached_rows}" if "cache_mb" in res else ""))
    print("| run | cache | ETL wall s | CPU s | rows/s (target >= 5 M) | ratio | peak RSS MB (target <= 3 GB) | "
          "ratio | load 1 min |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in res["runs"].items():
        print(f"| {name} | {r['cache'].get('status', 'off')} | {r['etl_wall_s']} | {r['cpu_s']} | "
              f"{r['rows_per_s'] / 1e6:.2f} M | {r['rows_per_s'] / TARGET_ROWS_PER_S:.2f}x | {r['peak_rss_mb']} | "
              f"{r['peak_rss_mb'] / 1024 / TARGET_PEAK_GB:.2f}x | {r['load_avg_1m_before']} -> "
              f"{r['load_avg_1m_after']} |")
    for name, r in res["runs"].items():
        print(f"{name}: at this rate the v3.1 chartevents ({V31_ROWS / 1e6:.0f} M rows) take about "
              f"{V31_ROWS / r['rows_per_s']:.0f} s of wall time ({V31_ROWS / r['rows_per_cpu_s']:.0f} CPU s)")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])

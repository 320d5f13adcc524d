"""ETL throughput and memory: chartevents rows per second end to end, and peak RSS of `abps etl`.

Writes a synthetic MIMIC-IV v3.1 directory with at least 50 M chartevents rows (the default
94,458 stays charted every 0.5 h), then times ``abps etl`` on it in a child process and reads the
child's peak resident set size. Target on a 2-core machine (issue 2): >= 5 M rows/s, <= 3 GB.

``python -m benchmarks.bench_etl [--stays N] [--chart-hours-step H] [--keep]``; results go to
``bench_out/etl.json`` and a Markdown row is printed. The synthetic folder is cached under
``bench_out/synth_etl`` (re-used when its manifest matches).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench_out"


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


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the result dict (also written to bench_out/etl.json)."""
    ap = argparse.ArgumentParser(prog="bench_etl")
    ap.add_argument("--stays", type=int, default=94_458)
    ap.add_argument("--chart-hours-step", type=float, default=0.5)
    args = ap.parse_args([] if argv is None else argv)
    OUT.mkdir(exist_ok=True)
    synth_dir = OUT / "synth_etl"
    rows = _synth(synth_dir, args.stays, args.chart_hours_step)
    gz_bytes = (synth_dir / "icu" / "chartevents.csv.gz").stat().st_size
    out = OUT / "etl_cohort"
    child = ("import resource, sys; from cli.app import main\n"
             "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
             "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", child, "etl", "--mimic-dir", str(synth_dir), "--out", str(out)],
                          check=True, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak_kb = int(proc.stdout.rsplit("PEAK_RSS_KB", 1)[1].split()[0])
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = json.loads((out / "cohort_report.json").read_text())
    res = {
        "chartevents_rows": rows,
        "chartevents_gz_mb": round(gz_bytes / 2**20, 1),
        "etl_wall_s": round(wall, 2),
        "cpu_s_all_children": round(usage.ru_utime + usage.ru_stime, 2),
        "rows_per_s": round(rows / wall),
        "peak_rss_mb": round(peak_kb / 1024, 1),  # the ETL process's own peak (Linux: KiB)
        "chartevents_stage_s": report["timings_s"].get("chartevents_s"),
        "centers": report["centers"],
        "stays": report["stays"],
        "cores": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    (OUT / "etl.json").write_text(json.dumps(res, indent=2))
    print("| chartevents rows | gz MB | ETL wall s | chartevents stage s | rows/s | peak RSS MB | centers |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {rows:,} | {res['chartevents_gz_mb']} | {res['etl_wall_s']} | {res['chartevents_stage_s']} | "
          f"{res['rows_per_s']:,} | {res['peak_rss_mb']} | {res['centers']} |")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])

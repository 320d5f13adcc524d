"""ETL wall time and memory against the decompression floor and two peers, in one process tree.
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
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
#: v3.1 chartevents rows (reference/mimic-iv-etl-facts.md), for the extrapolation column.
V31_ROWS = 432_997_491
RUNS = ("zcat", "first", "uncached", "cached", "pandas", "polars")
TARGETS = {"first": 1.0, "uncached": 1.0, "cached": 0.5}
TARGET_PEAK_GB = 3.0


def _synth(folder: Path, seed: int) -> int:
    manifest = folder / "synth_manifest.json"
    if manifest.exists():
        m = json.loads(manifest.read_text())
        if m["options"]["seed"] == seed:
            return int(m["rows"]["chartevents"])
    cmd = [sys.executable, "-c", "from cli.app import main; main()", "synth", "mimic", "--out", str(folder),
           "--seed", str(seed)]
    subprocess.run(cmd, check=True, cwd=REPO)
    return int(json.loads(manifest.read_text())["rows"]["chartevents"])


#: Every child prints its own peak RSS and CPU time last (a Python child measures itself).
_TAIL = ("import resource\n"
         "u = resource.getrusage(resource.RUSAGE_SELF)\n"
         "print('PEAK_RSS_KB', u.ru_maxrss, 'CPU_S', u.ru_utime + u.ru_stime, 'EXIT', code)\n")

_ETL = ("import sys; from cli.app import main\n"
        "code = 0\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code if isinstance(e.code, int) else 1\n"
        + _TAIL)

#: Shared by the peers: the vital items and valid ranges of the ETL's SQL (not re-typed here).
_ITEMS = ("import sys\nfrom etl.chart_stream import vital_items\n"
          "it = vital_items()\n"
          "ITEMS = {int(i): (it.vitals[v], lo, hi, bool(inc), bool(f)) for i, v, lo, hi, inc, f in "
          "zip(it.itemid, it.vital, it.lo, it.hi, it.hi_incl, it.f2c)}\n"
          "src, dst = sys.argv[1], sys.argv[2]\n")

_PANDAS = _ITEMS + """import pandas as pd
items = pd.DataFrame([(k, *v) for k, v in ITEMS.items()], columns=["itemid", "vital", "lo", "hi", "incl", "f2c"])
parts = []
for chunk in pd.read_csv(src, usecols=["stay_id", "charttime", "itemid", "valuenum"], chunksize=10_000_000,
                         dtype={"stay_id": "Int64", "itemid": "Int64", "valuenum": "float64"}, parse_dates=["charttime"]):
    c = chunk.merge(items, on="itemid")
    c = c[(c.valuenum > c.lo) & ((c.valuenum < c.hi) | (c.incl & (c.valuenum == c.hi)))]
    c = c.drop_duplicates(["stay_id", "charttime", "itemid", "valuenum"])
    c["v"] = c.valuenum.where(~c.f2c, (c.valuenum - 32) / 1.8)
    parts.append(c[["stay_id", "vital", "charttime", "v"]])
out = pd.concat(parts).groupby(["stay_id", "vital", "charttime"], as_index=False)["v"].mean()
out.sort_values(["stay_id", "charttime", "vital"]).to_parquet(dst, index=False)
code = 0
""" + _TAIL

_POLARS = _ITEMS + """import polars as pl
items = pl.DataFrame([(k, *v) for k, v in ITEMS.items()], schema=["itemid", "vital", "lo", "hi", "incl", "f2c"],
                     orient="row").with_columns(pl.col("itemid").cast(pl.Int32))
ok = (pl.col("valuenum") > pl.col("lo")) & ((pl.col("valuenum") < pl.col("hi"))
                                            | (pl.col("incl") & (pl.col("valuenum") == pl.col("hi"))))
(pl.scan_csv(src, schema_overrides={"stay_id": pl.Int64, "itemid": pl.Int32, "valuenum": pl.Float64,
                                     "charttime": pl.Datetime("us")})
 .select("stay_id", "charttime", "itemid", "valuenum")
 .join(items.lazy(), on="itemid").filter(ok)
 .unique(["stay_id", "charttime", "itemid", "valuenum"])
 .with_columns(v=pl.when(pl.col("f2c")).then((pl.col("valuenum") - 32) / 1.8).otherwise(pl.col("valuenum")))
 .group_by("stay_id", "vital", "charttime").agg(pl.col("v").mean())
 .sort("stay_id", "charttime", "vital")
 .sink_parquet(dst))
code = 0
""" + _TAIL

#: zcat in a Python child that waits for it and reports the child's peak RSS and CPU.
_ZCAT = ("import resource, subprocess, sys\n"
         "code = subprocess.run(['zcat', sys.argv[1]], stdout=subprocess.DEVNULL).returncode\n"
         "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
         "print('PEAK_RSS_KB', u.ru_maxrss, 'CPU_S', u.ru_utime + u.ru_stime, 'EXIT', code)\n")


def run_child(code: str, args: list[str]) -> dict:
    """One child process: wall seconds, CPU seconds, peak RSS (MB), load before and after."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "ABPS_NO_PROGRESS": "1"})
    wall = time.perf_counter() - t0
    if "PEAK_RSS_KB" not in proc.stdout:
        raise RuntimeError(f"child failed: {(proc.stderr.strip().splitlines() or ['no message'])[-1]}")
    tail = proc.stdout.rsplit("PEAK_RSS_KB", 1)[1].split()
    if int(tail[4]) != 0:
        raise RuntimeError(f"child exited with {tail[4]}: {(proc.stderr.strip().splitlines() or ['no message'])[-1]}")
    return {"wall_s": round(wall, 2), "cpu_s": round(float(tail[2]), 2),
            "peak_rss_mb": round(int(tail[0]) / 1024, 1),
            "load_1m": [round(load, 2), round(os.getloadavg()[0], 2)]}


def _run(name: str, src: Path, synth: Path, work: Path, cache: Path) -> dict:
    """One run of the sequence (zcat, an ETL run or a peer) in its own child process."""
    if name == "zcat":
        return run_child(_ZCAT, [str(src)])
    if name in ("first", "uncached", "cached"):
        if name == "first":
            shutil.rmtree(cache, ignore_errors=True)
        out = work / f"etl_cohort_{name}"
        r = run_child(_ETL, ["etl", "--mimic-dir", str(synth), "--out", str(out),
                             "--chart-cache", "off" if name == "uncached" else str(cache)])
        report = json.loads((out / "cohort_report.json").read_text())
        return {**r, "cache": report.get("chartevents_cache", {}).get("status"), "timings_s": report.get("timings_s", {})}
    return run_child(_PANDAS if name == "pandas" else _POLARS, [str(src), str(work / f"peer_{name}.parquet")])


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the result dict (also written to bench_out/etl.json)."""
    ap = argparse.ArgumentParser(prog="bench_etl")
    ap.add_argument("--synth-dir", type=Path, default=None,
                    help="an existing `abps synth mimic` folder (default: written under --workdir)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the synthetic folder written (default 1)")
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("ABPS_BENCH_WORKDIR", OUT)),
                    help="folder for the synthetic data, cache and outputs (default $ABPS_BENCH_WORKDIR or bench_out)")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {','.join(RUNS)} (zcat always runs)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the whole sequence this many times and report, per run, the repetition with the "
                         "median ratio to its own zcat (default 1; 3 or 5 on a machine shared with other work)")
    args = ap.parse_args([] if argv is None else argv)
    if args.repeat < 1:
        raise SystemExit("--repeat takes a whole number >= 1")
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if not runs or any(r not in RUNS for r in runs):
        raise SystemExit(f"--runs takes a comma-separated subset of {','.join(RUNS)}")
    if "zcat" not in runs:
        runs.insert(0, "zcat")
    if "cached" in runs and "first" not in runs:
        runs.insert(runs.index("cached"), "first")
    if shutil.which("zcat") is None:
        raise SystemExit("zcat not found (the ratio base); install gzip")
    OUT.mkdir(exist_ok=True)
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    synth = args.synth_dir or work / "synth_etl"
    manifest = synth / "synth_manifest.json"
    rows = (int(json.loads(manifest.read_text())["rows"]["chartevents"]) if args.synth_dir
            else _synth(synth, args.seed))
    src = synth / "icu" / "chartevents.csv.gz"
    cache = work / "chart_cache"
    res: dict = {"chartevents_rows": rows, "chartevents_gz_mb": round(src.stat().st_size / 1e6, 1),
                 "cores": os.cpu_count(), "runs": {}}
    reps: list[dict] = []
    for k in range(args.repeat):
        one: dict = {}
        for name in runs:
            one[name] = _run(name, src, synth, work, cache)
            print(f"  {name}: {one[name]['wall_s']} s" + (f" (repetition {k + 1})" if args.repeat > 1 else ""), flush=True)
        for r in one.values():
            r["x_zcat"] = round(r["wall_s"] / one["zcat"]["wall_s"], 3)
            r["v31_wall_s"] = round(r["wall_s"] * V31_ROWS / rows)
        reps.append(one)
    for name in runs:  # the repetition of median ratio (the upper middle one of an even count)
        ordered = sorted((rep[name] for rep in reps), key=lambda r: r["x_zcat"])
        res["runs"][name] = {**ordered[len(ordered) // 2], "x_zcat_each": [rep[name]["x_zcat"] for rep in reps]}
    if cache.exists():
        res["cache_mb"] = round(sum(p.stat().st_size for p in cache.iterdir()) / 1e6, 1)
    res["repeat"] = args.repeat
    (OUT / "etl.json").write_text(json.dumps(res, indent=2))
    print(f"chartevents: {rows:,} rows, {res['chartevents_gz_mb']} MB gzip CSV, {res['cores']} cores"
          + (f"; Parquet cache {res['cache_mb']} MB" if "cache_mb" in res else ""))
    print("| run | wall s | x zcat (target) | CPU s | peak RSS MB (target <= 3 GB) | v3.1 (433 M rows) wall | load 1 min |")
    print("|---|---|---|---|---|---|---|")
    for name, r in res["runs"].items():
        target = f" (<= {TARGETS[name]})" if name in TARGETS else ""
        rss = "-" if name == "zcat" else r["peak_rss_mb"]
        each = f" [{', '.join(f'{x:.2f}' for x in r['x_zcat_each'])}]" if args.repeat > 1 else ""
        print(f"| {name} | {r['wall_s']} | {r['x_zcat']:.2f}{target}{each} | {r['cpu_s']} | {rss} | "
              f"{r['v31_wall_s'] / 60:.1f} min | {r['load_1m'][0]} -> {r['load_1m'][1]} |")
    for name in ("first", "uncached", "cached"):  # the ETL's own stage times (cohort_report.json)
        if name in res["runs"]:
            stages = ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in res["runs"][name]["timings_s"].items())
            print(f"{name} stages (s): {stages}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])

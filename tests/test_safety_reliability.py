"""Reliability: a sweep killed with SIGKILL while logging a cell loses and duplicates
nothing on rerun, and no real identifier of the MIMIC-IV demo reaches the MLflow store, the logs
or the reports after a run on the demo.

(Determinism across executors, the real compute time and the live per-round metrics of sweep cells
are tested in tests/test_sweep.py; flat memory over 200 rounds is benchmarks/bench_memory.py.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl

from federation import sweep as sw
from federation.data.synthetic import write_fedprox_cohort

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def test_kill_9_while_logging_a_cell_then_rerun_loses_and_duplicates_nothing(tmp_path):
    from mlflow.tracking import MlflowClient

    cohort = write_fedprox_cohort(tmp_path / "cohort", n_centers=4, seed=5, mean_size=60.0)
    uri = f"sqlite:///{tmp_path}/ml.db"
    doc = {"name": "k9", "seeds": [1, 2, 3], "rounds": 2, "methods": ["fedavg"]}
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal
        from federation import sweep as sw
        from federation.run.tracking import Tracker

        real, seen = Tracker.log_json, []

        def log_json(self, obj, name):
            if name == "per_center.json":
                seen.append(name)
                if len(seen) == 2:  # the second cell: metrics logged, artifacts not yet, run still RUNNING
                    os.kill(os.getpid(), signal.SIGKILL)
            real(self, obj, name)

        Tracker.log_json = log_json
        sw.run_sweep(sw.SweepSpec.model_validate({doc!r}), {str(CONFIGS)!r}, {str(cohort)!r},
                     tracking_uri={uri!r}, progress=False)
    """))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "ABPS_STATE": os.environ["ABPS_STATE"], "OMP_NUM_THREADS": "1"})
    assert p.returncode == -signal.SIGKILL, p.stderr[-1500:]
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("k9")
    runs = client.search_runs([exp.experiment_id], "tags.`abps.kind` = 'cell'")
    by_status = sorted((r.info.status, r.data.tags["seed"]) for r in runs)
    assert by_status == [("FINISHED", "1"), ("RUNNING", "2")]  # seed 3 never started
    killed = next(r for r in runs if r.info.status == "RUNNING")
    assert "final_auroc_mean" in killed.data.metrics  # it died in the middle of its logging

    out = sw.run_sweep(sw.SweepSpec.model_validate(doc), CONFIGS, cohort, tracking_uri=uri, progress=False)
    assert sorted(k[1] for k in out.ran) == [2, 3] and [k[1] for k in out.skipped] == [1]
    runs = client.search_runs([exp.experiment_id], "tags.`abps.kind` = 'cell'")
    finished = [r for r in runs if r.info.status == "FINISHED"]
    assert sorted(int(r.data.tags["seed"]) for r in finished) == [1, 2, 3]  # none lost, none twice
    assert client.get_run(killed.info.run_id).info.status == "KILLED"
    assert client.get_run(out.parent_run_id).info.status == "FINISHED"
    assert len({r.data.tags["mlflow.parentRunId"] for r in finished}) == 1


_ID_COLUMNS = ("subject_id", "hadm_id", "stay_id")


def _demo_ids(mimic_demo_dir: Path) -> set[str]:
    icu = pl.read_csv(mimic_demo_dir / "icu" / "icustays.csv.gz", columns=list(_ID_COLUMNS))
    return {str(v) for c in _ID_COLUMNS for v in icu[c].to_list()}


def _scan(paths: list[Path], texts: dict[str, str], ids: set[str]) -> list[str]:
    """Every place a demo identifier appears as a whole number (not inside a longer number or a
    decimal fraction), in any file's bytes (the sqlite store included) or any captured text."""
    pat = re.compile(r"(?<![\d.])(\d{8})(?![\d.])")
    hits = []
    for p in paths:
        for m in pat.finditer(p.read_bytes().decode("latin-1")):
            if m.group(1) in ids:
                hits.append(f"{p.name}: {m.group(1)}")
    for name, text in texts.items():
        hits += [f"{name}: {m.group(1)}" for m in pat.finditer(text) if m.group(1) in ids]
    return hits


def test_no_demo_identifier_in_mlflow_logs_or_reports(mimic_demo_dir, tmp_path, capfd):
    from cli.app import main

    ids = _demo_ids(mimic_demo_dir)
    assert len(ids) > 300 and all(len(i) == 8 for i in ids)  # 140 stays x three 8-digit ids
    cohort, store = tmp_path / "cohort", tmp_path / "store"
    uri = f"sqlite:///{store}/mlflow.db"
    main(["etl", "--mimic-dir", str(mimic_demo_dir), "--partition", "iid", "--n-centers", "3",
          "--min-center-stays", "1", "--out", str(cohort)])
    main(["train", "--method", "abps", "--cohort", str(cohort), "--seeds", "11", "--rounds", "2", "--no-progress",
          "--tracking-uri", uri, "--experiment", "scan", "--output", str(tmp_path / "results.json")])
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: scan\nseeds: [1]\nrounds: 2\nmethods: [fedavg, wpfed]\n")
    main(["sweep", "--config", str(sweep), "--cohort", str(cohort), "--tracking-uri", uri, "--no-progress"])
    main(["report", "--experiment", "scan", "--out", str(tmp_path / "report"), "--tracking-uri", uri])
    captured = capfd.readouterr()
    files = [p for p in [*store.rglob("*"), *(tmp_path / "report").rglob("*"), tmp_path / "results.json"]
             if p.is_file()]
    assert any(p.name == "mlflow.db" for p in files) and any(p.name == "per_center.json" for p in files)
    assert any(p.name == "table1.md" for p in files)
    assert _scan(files, {"stdout": captured.out, "stderr": captured.err}, ids) == []
    # the scan itself finds an identifier where there is one
    leak = tmp_path / "leak.txt"
    some = sorted(ids)[0]
    leak.write_text(f"center a: stay {some}, auroc 0.{some}\n")
    assert _scan([leak], {}, ids) == [f"leak.txt: {some}"]

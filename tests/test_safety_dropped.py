"""every center left out is counted and said (console and results.json).

``abps etl --mimic-dir DEMO --min-center-stays 1`` gives 95 centers; 32 of them (37 stays,
8 deaths) have no train row and were dropped by ``abps train`` without a word on main.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from federation.data.tensors import FederatedData

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from cli.app import main; main()"]
ENV = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "ABPS_STATE": os.environ["ABPS_STATE"], "OMP_NUM_THREADS": "1"}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=REPO, timeout=300, env=ENV)


@pytest.fixture(scope="module")
def c95(mimic_demo_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("c95") / "c"
    p = run("etl", "--mimic-dir", str(mimic_demo_dir), "--min-center-stays", "1", "--out", str(out))
    assert p.returncode == 0, p.stderr[-800:]
    return out


def _independent_count(cohort_dir: Path, min_train: int) -> dict[str, int]:
    """Counted straight from the parquet files, without federation.data.tensors."""
    co = pl.read_parquet(cohort_dir / "cohort.parquet")
    n_centers = pl.read_parquet(cohort_dir / "centers.parquet").height
    per = co.group_by("center_id").agg((pl.col("split") == "train").sum().alias("tr"), pl.len().alias("n"),
                                       pl.col("label").sum().alias("d"))
    gone = per.filter(pl.col("tr") < min_train)
    kept = per.height - gone.height
    return {"centers": n_centers - kept, "stays": int(gone["n"].sum()), "deaths": int(gone["d"].sum()),
            "min_train": min_train}


def test_dropped_centers_are_counted(c95):
    d = FederatedData.from_cohort(c95)
    assert d.dropped == {"centers": 32, "stays": 37, "deaths": 8, "min_train": 1}
    assert d.dropped == _independent_count(c95, 1) and d.n_centers == 95 - 32
    d3 = FederatedData.from_cohort(c95, min_train=3)
    assert d3.dropped == _independent_count(c95, 3) and d3.dropped["centers"] > 32
    assert d3.n_centers + d3.dropped["centers"] == 95


def test_train_says_what_it_dropped(c95, tmp_path):
    out = tmp_path / "results.json"
    p = run("train", "--method", "local", "--cohort", str(c95), "--seeds", "1", "--rounds", "1", "--no-progress",
            "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--output", str(out))
    assert p.returncode == 0, p.stderr[-800:]
    assert "note: 32 of 95 centers (37 stays, 8 deaths) left out: no train rows" in p.stderr
    doc = json.loads(out.read_text())
    assert doc["dropped_centers"] == {"centers": 32, "stays": 37, "deaths": 8, "min_train": 1}
    assert doc["n_centers"] == 63

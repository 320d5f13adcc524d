"""`abps synth mimic` and `abps etl` show a progress bar of their steps on a terminal (stderr), and
nothing on stderr when it is not one (logs and captured output stay clean)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _abps(args: list[str], cwd: Path, terminal: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("FORCE_COLOR", None)
    if terminal:
        env["FORCE_COLOR"] = "1"  # rich treats stderr as a terminal
    return subprocess.run([sys.executable, "-c", "from cli.app import main; main()", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_synth_and_etl_show_their_steps_on_a_terminal(tmp_path: Path, mimic_demo_dir: Path) -> None:
    p = _abps(["synth", "mimic", "--stays", "400", "--out", "syn"], tmp_path, terminal=True)
    assert p.returncode == 0, p.stderr[-2000:]
    # the bar's last state is drawn when it stops (the steps between are drawn at rich's refresh rate)
    assert "synth mimic" in p.stderr and "ground_truth.parquet" in p.stderr
    p = _abps(["synth", "mimic", "--stays", "400", "--out", "syn2"], tmp_path, terminal=False)
    assert p.returncode == 0 and p.stderr == ""

    args = ["etl", "--mimic-dir", str(mimic_demo_dir), "--window-years", "20", "--min-center-stays", "1"]
    p = _abps([*args, "--out", "c1"], tmp_path, terminal=True)
    assert p.returncode == 0, p.stderr[-2000:]
    # the title and the last stage (drawn when the bar stops; the stages between at rich's refresh rate)
    for stage in ("etl mimic", "centers, splits and outputs"):
        assert stage in p.stderr, stage
    p = _abps([*args, "--out", "c2"], tmp_path, terminal=False)
    assert p.returncode == 0 and "first-day vitals" not in p.stderr


def test_train_on_a_new_store_prints_no_library_noise(tmp_path: Path) -> None:
    from federation.data.synthetic import write_fedprox_cohort

    # small centers: the runtime warns that they have too few train rows for their own statistics
    write_fedprox_cohort(tmp_path / "icu5", n_centers=5, seed=4, mean_size=120.0, shared=0.8)
    env_free = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    p = subprocess.run([sys.executable, "-c", "from cli.app import main; main()", "train", "--method", "fedavg",
                        "--cohort", "icu5", "--rounds", "1", "--no-progress"], cwd=tmp_path,
                       env={**env_free, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "mlflow" / "mlflow.db").is_file()  # a new store: MLflow created its tables
    noise = [ln for ln in (p.stdout + p.stderr).splitlines()
             if " INFO " in ln or "DeprecationWarning" in ln or "FutureWarning" in ln or "alembic" in ln.lower()]
    assert noise == []
    # a warning is one line, without Python's file, line number and source line
    assert "warning: per-center preprocessing:" in p.stderr
    assert not [ln for ln in p.stderr.splitlines() if ".py:" in ln or "Warning:" in ln], p.stderr

"""MLflow that opens ready: model-training experiments named after the cohort, run names that say
method, goal and seed, the headline metrics (AUROC, Bandwidth, Isolation) first and defined once,
MLflow's own settings (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME) honoured, a remote tracking
server, and the comparison page checked in a real browser (headless Chromium)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_helpers import mlflow_server
from tests.cli_helpers import run_main as _main

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")  # Debian's chromium, installed by the Makefile


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project folder (working directory) holding a 5-center cohort `icu5/`, with neither
    MLflow variable set."""
    from federation.data.synthetic import write_fedprox_cohort

    monkeypatch.chdir(tmp_path)
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "ABPS_STATE"):
        monkeypatch.delenv(var, raising=False)
    # every center's test split holds both classes: a defined headline mean
    write_fedprox_cohort(tmp_path / "icu5", n_centers=5, seed=4, mean_size=200.0, shared=0.8)
    return tmp_path


def _train(*args: str) -> int:
    return _main(["train", "--cohort", "icu5", "--rounds", "2", "--no-progress", *args])


def test_goal_named_everywhere_and_one_bandwidth_and_isolation(project: Path, capsys) -> None:
    from mlflow.tracking import MlflowClient

    from federation.report import write_report

    assert _train("--method", "abps", "--goal", "diversity") == 0
    assert _train("--goal", "diversity") == 0  # the abps-div preset
    assert _train("--method", "fedavg") == 0
    console = capsys.readouterr().out
    assert "abps [goal=diversity]: AUROC" in console and "abps-div: AUROC" in console
    docs = {json.loads(p.read_text())["label"]: json.loads(p.read_text())
            for p in (project / "runs" / "icu5").glob("*/results.json")}
    assert set(docs) == {"abps [goal=diversity]", "abps-div", "fedavg"}
    assert {p.parent.name.rsplit("-", 2)[0] for p in (project / "runs" / "icu5").glob("*/results.json")} == \
        {"abps-goal-diversity", "abps-div", "fedavg"}

    # the default experiment is the cohort's folder name; a model-training experiment
    client = MlflowClient(f"sqlite:///{project}/mlflow/mlflow.db")  # absolute: MLflow caches engines per URI
    exp = client.get_experiment_by_name("icu5")
    assert exp is not None and exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert {"abps [goal=diversity] seed 11", "abps-div seed 11", "fedavg seed 11"} <= set(runs)
    for label, doc in docs.items():
        seed = doc["seeds"]["11"]
        m = runs[f"{label} seed 11"].data.metrics
        assert m["AUROC"] == pytest.approx(seed["final_auroc_mean"], abs=1e-12)
        assert m["Bandwidth"] == m["rel_bandwidth"] == pytest.approx(seed["rel_bandwidth"], abs=1e-12)
        rest = seed["method_summary"].get("rest_share_mean")
        assert m.get("Isolation") == (pytest.approx(rest, abs=1e-12) if rest is not None else None)
        assert doc["config"]["reference_rounds"] == 50
    # FedAvg, 2 rounds of every center sending the full fp32 model: 2 / 50 of the reference
    assert docs["fedavg"]["seeds"]["11"]["rel_bandwidth"] == pytest.approx(2 / 50, rel=1e-12)

    assert _main(["runs"]) == 0
    table = capsys.readouterr().out
    rows = {ln.split("│")[1].strip(): [c.strip() for c in ln.split("│")[1:-1]]
            for ln in table.splitlines() if ln.startswith("│")}
    assert set(rows) == {"abps [goal=diversity]", "abps-div", "fedavg"}
    for label, doc in docs.items():
        seed = doc["seeds"]["11"]
        # method, seed ids, rounds, AUROC, bandwidth, isolation
        assert rows[label][2] == str(doc["config"]["rounds"])
        assert rows[label][4] == f"{seed['rel_bandwidth']:.2f}x"
        rest = seed["method_summary"].get("rest_share_mean")
        assert rows[label][5] == (f"{100 * rest:.1f} %" if rest is not None else "-")
    assert "experiment icu5" in table and "mean over rounds" in table

    rep = write_report("icu5", project / "report", None, log_to_mlflow=False)
    t1 = {r["label"]: r for r in rep["sections"]["table1"]["rows"]}
    for label, doc in docs.items():
        seed = doc["seeds"]["11"]
        assert t1[label]["bandwidth"] == pytest.approx(seed["rel_bandwidth"], abs=1e-12)
        rest = seed["method_summary"].get("rest_share_mean")
        if rest is not None:
            assert t1[label]["rest_share"] == pytest.approx(rest, abs=1e-12)
    assert "abps [goal=diversity]" in (project / "report" / "table1.md").read_text()
    # a command never exports its store as MLFLOW_TRACKING_URI for the commands after it
    assert "MLFLOW_TRACKING_URI" not in os.environ


def test_mixed_cohorts_are_named_by_folder(project: Path, capsys) -> None:
    from federation.data.synthetic import write_fedprox_cohort

    write_fedprox_cohort(project / "ward7", n_centers=5, seed=9, mean_size=200.0, shared=0.8)
    assert _train("--method", "fedavg", "--experiment", "both") == 0
    time.sleep(0.01)
    assert _main(["train", "--cohort", "ward7", "--rounds", "1", "--no-progress", "--method", "fedavg",
                  "--experiment", "both"]) == 0
    capsys.readouterr()
    assert _main(["runs", "--experiment", "both"]) == 0
    out = capsys.readouterr().out
    note = next(ln for ln in out.splitlines() if ln.startswith("note: 1 run(s) on another cohort"))
    assert "(icu5)" in note and "(ward7) are shown" in note


def test_mlflow_environment_variables_are_honoured(project: Path, tmp_path_factory, monkeypatch, capsys) -> None:
    from mlflow.tracking import MlflowClient

    elsewhere = tmp_path_factory.mktemp("shared") / "team.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{elsewhere}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team")
    assert _train("--method", "fedavg") == 0
    assert not (project / "mlflow").exists()  # nothing in the project's own store
    assert list((project / "runs" / "team").glob("fedavg-*/results.json"))
    assert MlflowClient(f"sqlite:///{elsewhere}").get_experiment_by_name("team") is not None
    capsys.readouterr()
    assert _main(["runs"]) == 0 and "experiment team: finished runs (1)" in capsys.readouterr().out
    assert _main(["report", "--out", "rep", "--no-log"]) == 0 and "report of team" in capsys.readouterr().out
    # --tracking-uri / --experiment win over the variables
    assert _train("--method", "fedavg", "--tracking-uri", "sqlite:///own.db", "--experiment", "mine") == 0
    assert MlflowClient(f"sqlite:///{project}/own.db").get_experiment_by_name("mine") is not None
    assert MlflowClient(f"sqlite:///{elsewhere}").get_experiment_by_name("mine") is None
    # neither set: the project's store and the cohort's experiment
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    assert _train("--method", "fedavg") == 0
    assert MlflowClient(f"sqlite:///{project}/mlflow/mlflow.db").get_experiment_by_name("icu5") is not None


def test_ui_on_a_taken_port_is_one_line_and_fails(project: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        p = subprocess.run([sys.executable, "-c", "from cli.app import main; main()", "ui", "--port", str(port)],
                           cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and p.stderr.startswith(f"error: --port {port}: 127.0.0.1:{port} is taken")
    assert "MLflow UI: http" not in p.stdout


@pytest.fixture()
def server(tmp_path: Path):
    """A local `mlflow server` on loopback (its own store and artifact folder), stopped afterwards."""
    srv = tmp_path / "server"
    srv.mkdir()
    with mlflow_server(f"sqlite:///{srv}/s.db", srv, ("--artifacts-destination", str(srv / "art"))) as base:
        yield base


def test_remote_server_and_the_compare_page_in_a_browser(project: Path, server: str, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    assert _train("--method", "fedavg") == 0
    assert _train("--method", "abps", "--goal", "diversity") == 0
    assert not (project / "mlflow").exists()
    capsys.readouterr()
    assert _main(["runs"]) == 0
    assert "experiment icu5: finished runs (2)" in capsys.readouterr().out
    assert _main(["ui"]) == 0  # a server URI: the URL on that server, nothing started
    url = capsys.readouterr().out.strip().removeprefix("MLflow UI: ")
    assert url.startswith(f"{server}/#/compare-runs?runs=") and "workflowType=machine_learning" in url

    assert CHROMIUM.is_file(), "chromium not installed (the Makefile's install step installs Debian's chromium)"
    from playwright.sync_api import sync_playwright

    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=args)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2000})
            page.goto(url)
            page.get_by_text("Isolation", exact=True).first.wait_for(timeout=180_000)
            text = page.inner_text("body")
        finally:
            browser.close()
    assert "Comparing 2 Runs" in text
    assert "abps [goal=diversity] seed 11" in text and "fedavg seed 11" in text
    metrics = text[text.index("\nMetrics\n"):].split("Show diff only", 1)[1]
    names = [ln.strip() for ln in metrics.splitlines() if ln.strip()][:6]
    assert names[:3] == ["AUROC", "Bandwidth", "Isolation"], names  # the headline first

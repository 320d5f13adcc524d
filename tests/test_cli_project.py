"""The first hour: `abps etl` (MIMIC_DIR, release / layout line, next command, recorded
cohort) -> `abps train --goal diversity` with no other option -> `abps runs` / `abps ui`, in a fresh
project folder, on the real MIMIC-IV demo."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import duckdb
import pytest

from cli.project import default_cohort
from etl.errors import InputError
from etl.mimic import mimic_release
from tests.cli_helpers import free_port as _free_port
from tests.cli_helpers import run_main as _main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project folder as the working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MIMIC_DIR", raising=False)
    monkeypatch.delenv("ABPS_STATE", raising=False)  # the project's own .abps/state.json
    return tmp_path


def test_first_hour_etl_then_train_goal_then_runs(project: Path, mimic_demo_dir: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MIMIC_DIR", str(mimic_demo_dir))
    assert _main(["etl", "--out", "cohort_iid", "--partition", "iid", "--n-centers", "4",
                  "--min-center-stays", "1"]) == 0
    out = capsys.readouterr().out
    assert f"found MIMIC-IV 2.x, csv.gz tables in {mimic_demo_dir}" in out
    assert "next: abps train --goal diversity" in out
    state = json.loads((project / ".abps" / "state.json").read_text())
    assert state == {"cohort": str((project / "cohort_iid").resolve()), "source": "mimic"}

    # the promised command, verbatim apart from the short run
    assert _main(["train", "--goal", "diversity", "--rounds", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    results = list((project / "runs" / "cohort_iid").glob("abps-div-*/results.json"))  # experiment: the cohort
    assert len(results) == 1 and str(results[0].relative_to(project)) in out
    doc = json.loads(results[0].read_text())
    assert doc["method"] == "abps-div" and doc["cohort"] == state["cohort"]
    assert doc["config"]["params"]["goal"] == "diversity" and doc["config"]["params"]["kappa"] == 1
    assert doc["config"]["exchange"]["head_layers"] == 1 and doc["config"]["exchange"]["bf16_wire"] is True
    # nothing written loose into the project folder
    assert sorted(p.name for p in project.iterdir()) == [".abps", "cohort_iid", "mlflow", "runs"]

    # an explicit --output is never replaced without --force
    assert _main(["train", "--method", "fedavg", "--rounds", "1", "--no-progress", "--output", "r.json"]) == 0
    before = (project / "r.json").read_bytes()
    capsys.readouterr()
    assert _main(["train", "--method", "fedavg", "--rounds", "1", "--no-progress", "--output", "r.json"]) == 2
    assert "r.json exists; give --force" in capsys.readouterr().err
    assert (project / "r.json").read_bytes() == before
    assert _main(["train", "--method", "fedavg", "--rounds", "1", "--no-progress", "--seeds", "3",
                  "--output", "r.json", "--force"]) == 0
    assert json.loads((project / "r.json").read_text())["seeds"].keys() == {"3"}

    capsys.readouterr()
    assert _main(["runs"]) == 0
    table = capsys.readouterr().out
    line = next(ln for ln in table.splitlines() if "abps-div" in ln)
    auroc = doc["summary"]["final_auroc_mean"]
    assert f"{auroc['mean']:.3f} (1 seed)" in line   # one seed: the mean, no spread to show
    assert line.split("│")[3].strip() == "1"  # rounds run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{project}/mlflow/mlflow.db")  # absolute: MLflow caches engines per URI
    exp = client.get_experiment_by_name("cohort_iid").experiment_id
    (run,) = client.search_runs([exp], "tags.method = 'abps-div' and tags.seed = '11'")
    rest = doc["seeds"]["11"]["method_summary"]["rest_share_mean"]  # isolation: mean over rounds
    assert line.split("│")[-2].strip() == f"{100 * rest:.1f} %" == f"{100 * run.data.metrics['Isolation']:.1f} %"
    fed = next(ln for ln in table.splitlines() if "fedavg" in ln)
    # FedAvg, 1 round of its reference's 50: 0.02x; no isolation
    assert "0.02x" in fed and fed.split("│")[-2].strip() == "-"
    assert table.index("fedavg") < table.index("abps-div")  # Table 1 order


def test_train_without_any_cohort_names_both_ways(project: Path, capsys) -> None:
    assert _main(["train", "--goal", "diversity", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--cohort DIR" in err and "abps etl" in err
    assert not (project / "runs").exists()


def test_default_cohort_order(project: Path) -> None:
    fake = project / "cohort"
    fake.mkdir()
    for f in ("cohort.parquet", "centers.parquet"):
        (fake / f).write_bytes(b"")
    assert default_cohort() == Path("cohort")
    other = project / "built"
    shutil.copytree(fake, other)
    (project / ".abps").mkdir()
    (project / ".abps" / "state.json").write_text(json.dumps({"cohort": str(other)}))
    assert default_cohort() == other
    shutil.rmtree(other)  # a recorded cohort that is gone: back to ./cohort
    assert default_cohort() == Path("cohort")
    shutil.rmtree(fake)
    (project / ".abps" / "state.json").write_text('{"cohort": "/x"')  # cut short
    with pytest.raises(InputError, match=r"^no cohort \(the project record .*state.json is damaged \(not JSON\)\): "
                                         r"give --cohort DIR"):
        default_cohort()
    (project / ".abps" / "state.json").write_text("[1]")
    with pytest.raises(InputError, match=r"state.json is damaged \(not a JSON mapping\)"):
        default_cohort()


def test_goal_flag_picks_the_goal_aware_preset_and_says_so(capsys) -> None:
    from federation.methods.registry import goal_preset

    assert [goal_preset(g) for g in ("homogeneity", "Diversity", "alignment")] == ["abps-hom", "abps-div", "abps-align"]
    assert _main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "abps-hom | abps-div | abps-align" in text.replace("│ ", "").replace(" │", "")


def test_mimic_release_from_the_loaded_tables(mimic_demo_dir: Path, tmp_path: Path) -> None:
    con = duckdb.connect()
    pat = f"read_csv('{mimic_demo_dir / 'hosp' / 'patients.csv.gz'}', all_varchar=true)"
    adm = f"read_csv('{mimic_demo_dir / 'hosp' / 'admissions.csv.gz'}', all_varchar=true)"
    assert mimic_release(con, pat, adm, True, "csv.gz") == "MIMIC-IV 2.x, csv.gz tables"
    assert mimic_release(con, pat, adm, False, "csv.gz") == "MIMIC-IV 1.x, csv.gz tables"
    # one v3.0 era row in patients, or one v3.0 insurance value in admissions: 3.x
    pat3 = f"(SELECT * REPLACE (CASE WHEN subject_id = '10014729' THEN '2020 - 2022' ELSE anchor_year_group END AS anchor_year_group) FROM {pat})"
    adm3 = f"(SELECT * REPLACE (CASE WHEN hadm_id = '25926192' THEN 'Private' ELSE insurance END AS insurance) FROM {adm})"
    assert mimic_release(con, pat3, adm, True, "Parquet") == "MIMIC-IV 3.x, Parquet tables"
    assert mimic_release(con, pat, adm3, True, "csv") == "MIMIC-IV 3.x, csv tables"


def test_ui_serves_the_project_store(tmp_path: Path) -> None:
    port = _free_port()
    log = open(tmp_path / "ui.log", "wb")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", "from cli.app import main; main()", "ui", "--port", str(port)],
                            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        text = ""
        deadline = time.monotonic() + 300  # a guard against a hang, not a timing assertion
        while time.monotonic() < deadline and proc.poll() is None and "MLflow UI: " not in text:
            time.sleep(0.25)
            text = (tmp_path / "ui.log").read_text(errors="replace")
        assert f"MLflow UI: http://127.0.0.1:{port}/#/experiments?workflowType=machine_learning" in text, text[-2000:]
        assert "sqlite:///mlflow/mlflow.db" in text
        # its own two lines only: the server's log (INFO lines, library warnings) stays off the console
        lines = [ln for ln in text.splitlines() if ln.strip()]
        assert len(lines) == 2 and lines[0].startswith("starting the MLflow UI on "), text[-2000:]
        # the URL is printed once the server answers: it serves at once (one try, well within 10 s)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            page = r.read()
        assert b"<title>MLflow</title>" in page or b"MLflow" in page, text[-2000:]
        assert (tmp_path / "mlflow" / "mlflow.db").is_file()  # the project's store, in the project folder
        import psutil

        # the runs pages need no job runner: MLflow's huey consumers (GenAI jobs) are not started
        tree = [" ".join(p.cmdline()) for p in psutil.Process(proc.pid).children(recursive=True)]
        assert tree and not [c for c in tree if "huey" in c or "mlflow.server.jobs" in c], tree
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: `abps ui` stops its server group, and that is no error
        rc = proc.wait(timeout=60)
        log.close()
    assert rc == 0 and (tmp_path / "ui.log").read_text().splitlines()[-1] == "MLflow UI stopped"
    for _ in range(60):  # the server is gone with it: the port stops answering
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                break
        time.sleep(0.5)
    else:
        pytest.fail(f"port {port} still answers after `abps ui` stopped")


def test_default_run_output_never_reuses_a_folder_within_one_second(project: Path, monkeypatch) -> None:
    from cli import project as proj

    monkeypatch.setattr(proj.time, "gmtime", lambda *a: time.struct_time((2026, 12, 2, 4, 2, 43, 2, 336, 0)))
    first = proj.run_output("both", "fedavg")
    assert first == Path("runs/both/fedavg-20261202-040243/results.json")
    first.parent.mkdir(parents=True)
    second = proj.run_output("both", "fedavg")
    assert second == Path("runs/both/fedavg-20261202-040243-2/results.json")
    second.parent.mkdir(parents=True)
    assert proj.run_output("both", "fedavg").parent.name == "fedavg-20261202-040243-3"
    assert proj.run_output("ICU / 2019", "abps goal=diversity").parent == Path(
        "runs/ICU-2019/abps-goal-diversity-20261202-040243")


def test_etl_says_when_most_stays_fall_under_the_center_minimum(project: Path, mimic_demo_dir: Path, capsys) -> None:
    """A small database loses most of its stays to --min-center-stays: the command says so (the
    counts of the report's attrition row), not only cohort_report.md. The full default loses 0.9 %."""
    assert _main(["etl", "--mimic-dir", str(mimic_demo_dir), "--out", "cohort_small", "--window-years", "200",
                  "--min-center-stays", "20"]) == 0
    err = capsys.readouterr().err
    row = json.loads((project / "cohort_small" / "cohort_report.json").read_text())["attrition"][-1]
    assert (row["centers_in"], row["centers_removed"], row["stays_in"], row["stays_removed"]) == (6, 2, 135, 29)
    assert ("note: 2 of 6 centers (29 of 135 stays) hold fewer than 20 stays and were left out "
            "(--min-center-stays)") in err
    assert _main(["etl", "--mimic-dir", str(mimic_demo_dir), "--out", "cohort_all", "--window-years", "200",
                  "--min-center-stays", "1"]) == 0
    assert "left out (--min-center-stays)" not in capsys.readouterr().err


def test_a_run_without_a_seed_uses_the_same_seed_in_train_and_launch() -> None:
    """`abps launch` and `abps train` default to one seed (11), so their default runs are one computation."""
    from cli.project import DEFAULT_SEED
    from tests.option_matrix import commands

    cmds = commands()
    (launch_seed,) = [p for p in cmds[("launch",)].params if "--seed" in getattr(p, "opts", ())]
    assert launch_seed.default == DEFAULT_SEED == 11
    (train_seeds,) = [p for p in cmds[("train",)].params if "--seeds" in getattr(p, "opts", ())]
    assert "(default: 11;" in train_seeds.help  # and the first-hour test reads seed "11" from a default run


def test_a_project_record_that_cannot_be_written_is_named_as_such(tmp_path: Path, monkeypatch) -> None:
    """The cohort is built by then: the message says where it is and names ABPS_STATE, not an
    option of another command."""
    from cli.project import record_etl

    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("ABPS_STATE", str(tmp_path / "afile" / "state.json"))
    with pytest.raises(InputError, match=r"^the cohort is in .*c, but the project record could not be written "
                                         r"\(ABPS_STATE: cannot write .*afile/state.json: a part of its folder is a "
                                         r"file\)$"):
        record_etl(tmp_path / "c", "eicu")
    monkeypatch.setenv("ABPS_STATE", str(tmp_path))
    with pytest.raises(InputError, match=r"ABPS_STATE: cannot write .*: Is a directory"):
        record_etl(tmp_path / "c", "eicu")
    assert (tmp_path / "afile").read_text() == "x"

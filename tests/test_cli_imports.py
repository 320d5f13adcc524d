"""The commands that must answer at once import no heavy library: every ``--help`` imports none of
torch, MLflow, Polars, DuckDB; ``abps runs`` (and the URL ``abps ui`` prints) reads the project's
sqlite store without torch or MLflow, and finds the same runs MLflow's own client finds.

Asserted on the modules a fresh interpreter holds after the command (``sys.modules``), never on a
clock: what the command imports is what makes it slow (torch 1.5 s, MLflow's client 2-3 s).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from federation import method_catalog

HEAVY = ("torch", "mlflow", "polars", "duckdb")

#: runs the abps commands given as JSON argv lists (argv 1) in one fresh interpreter; prints, per
#: command, its exit code, its output and which modules of argv 2 are loaded after it
_PROBE = """
import contextlib, io, json, sys
from cli.app import main
out = []
for argv in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
    out.append({"argv": argv, "code": code, "stdout": buf.getvalue(),
                "heavy": sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)})
print(json.dumps(out))
"""


def _probe(argvs: list[list[str]], cwd: Path) -> list[dict]:
    env = {**os.environ, "COLUMNS": "80"}  # the help as an 80-column terminal shows it
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(argvs), json.dumps(HEAVY)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # no library noise either (MLflow INFO lines, deprecation warnings)
    assert proc.stderr == "", proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _help_argvs() -> list[list[str]]:
    """``--help`` of abps and of every command and sub-command (walked from the typer app)."""
    import typer.main

    from cli.app import _register, app

    _register()
    out: list[list[str]] = [["--help"]]

    def walk(cmd, path: list[str]) -> None:
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            out.append([*path, name, "--help"])
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


def test_the_catalog_is_the_registry() -> None:
    # the names --help lists and the report's row names and order are the registry's
    from federation.methods import all_methods, display_names, families, method_names, paper_order

    c = all_methods()
    rows = tuple((n, c[n].display_name, c[n].family, c[n].paper_order) for n in method_names())
    assert method_catalog.CATALOG == rows, "federation/method_catalog.py CATALOG should read:\n" + "\n".join(
        f"    {r!r}," for r in rows)

    assert list(method_catalog.METHOD_NAMES) == method_names()
    assert method_catalog.PAPER_ORDER == paper_order()
    assert method_catalog.DISPLAY == display_names() and method_catalog.FAMILY == families()
    # the peer-to-peer set the launch help lists is what the peer's check accepts
    from cli.p2p_cmd import _config
    from etl.errors import InputError
    from federation.p2p.peer import check_p2p_config

    accepted = []
    for name in method_names():
        try:
            check_p2p_config(_config(name, None, None, None))
        except InputError:
            continue
        accepted.append(name)
    assert method_catalog.P2P_METHODS == tuple(accepted)


def test_every_help_imports_no_heavy_library(tmp_path: Path) -> None:
    argvs = _help_argvs()
    assert ["train", "--help"] in argvs and ["synth", "mimic", "--help"] in argvs and len(argvs) >= 12
    results = _probe(argvs, tmp_path)
    for r in results:
        assert r["code"] == 0, r
        assert r["heavy"] == [], f"abps {' '.join(r['argv'])} imported {r['heavy']}"
        # a flag shows no value type (typer 0.29 would print `--force <bool>`); valued options keep theirs
        assert "<bool>" not in r["stdout"], f"abps {' '.join(r['argv'])} shows <bool> beside a flag"
        # at 80 columns no help text is cut short (rich ends a word longer than its column with "…")
        assert "…" not in r["stdout"], f"abps {' '.join(r['argv'])} cuts a word of its help at 80 columns"
    train = next(r for r in results if r["argv"] == ["train", "--help"])
    # the method list of --method is there, in Table 1 order, without importing a method
    flat = " ".join(train["stdout"].replace("│", " ").split())
    assert "local, fedavg, fedprox" in flat and "centralized" in flat and "random-partners" in flat
    assert "--force replace an existing" in flat and "--threads <int range>" in flat


def test_command_lists_show_each_summary_as_one_paragraph() -> None:
    """typer keeps a docstring's line breaks in a command list; each summary is one paragraph."""
    from cli.app import _register, app, cache_app, synth_app

    _register()
    infos = [i for a in (app, synth_app, cache_app) for i in a.registered_commands]
    assert len(infos) >= 10
    for info in infos:
        assert info.short_help and "\n" not in info.short_help, info.name
    ui = next(i for i in infos if i.callback.__name__ == "ui")
    assert "print the URL of the comparison of the experiment's latest runs" in ui.short_help


def _log_runs(uri: str) -> dict[str, list[str]]:
    """A store written by the installed MLflow: experiment ``cohort`` with a parent run, two
    finished train children (one with a NaN metric), a running, a failed and a deleted run, and
    an older experiment ``other``. Returns experiment name -> run ids."""
    from mlflow.tracking import MlflowClient

    from federation.run.tracking import KIND_TAG, KIND_TRAIN, LABEL_TAG, METHOD_TAG, SEED_TAG

    client = MlflowClient(uri)
    ids: dict[str, list[str]] = {}
    other = client.create_experiment("other")
    r = client.create_run(other, start_time=1_000, tags={METHOD_TAG: "local", SEED_TAG: "1"}, run_name="local-1")
    client.log_metric(r.info.run_id, "final_auroc_mean", 0.6, timestamp=1, step=0)
    client.set_terminated(r.info.run_id, "FINISHED")
    ids["other"] = [r.info.run_id]
    exp = client.create_experiment("cohort")
    parent = client.create_run(exp, start_time=2_000, tags={KIND_TAG: KIND_TRAIN}, run_name="fedavg")
    client.set_terminated(parent.info.run_id, "FINISHED")
    ids["cohort"] = [parent.info.run_id]
    for seed, start, auroc in ((11, 3_000, 0.71), (22, 3_000, math.nan)):
        r = client.create_run(exp, start_time=start, run_name=f"fedavg-seed{seed}",
                              tags={METHOD_TAG: "fedavg", SEED_TAG: str(seed), LABEL_TAG: "fedavg"})
        client.log_param(r.info.run_id, "params.lr", "0.01")
        for step, value in enumerate((0.5, auroc)):  # the latest step is the run's metric
            client.log_metric(r.info.run_id, "final_auroc_mean", value, timestamp=10 + step, step=step)
        client.log_metric(r.info.run_id, "rel_bandwidth", 1.0, timestamp=10, step=0)
        client.set_terminated(r.info.run_id, "FINISHED", end_time=start + 500)
        ids["cohort"].append(r.info.run_id)
    running = client.create_run(exp, start_time=4_000, tags={METHOD_TAG: "abps", SEED_TAG: "11"})
    failed = client.create_run(exp, start_time=4_000, tags={METHOD_TAG: "abps", SEED_TAG: "22"})
    client.set_terminated(failed.info.run_id, "FAILED")
    deleted = client.create_run(exp, start_time=5_000, tags={METHOD_TAG: "moon", SEED_TAG: "11"})
    client.set_terminated(deleted.info.run_id, "FINISHED")
    client.delete_run(deleted.info.run_id)
    ids["cohort"] += [running.info.run_id, failed.info.run_id, deleted.info.run_id]
    return ids


def _as_plain(run) -> tuple:
    m = {k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in run.data.metrics.items()}
    return (run.info.run_id, run.info.run_name, str(run.info.experiment_id), run.info.status, run.info.start_time,
            run.info.end_time, m, dict(run.data.params), dict(run.data.tags))


def test_the_sqlite_reader_finds_what_mlflow_finds(tmp_path: Path) -> None:
    from federation.run import store_read

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ids = _log_runs(uri)
    with store_read.open_store(uri) as fast:
        assert isinstance(fast, store_read._SqliteStore)
        slow = store_read._ClientStore(uri)
        for name in ("cohort", "other", "missing"):
            assert fast.experiment_id(name) == slow.experiment_id(name)
        exp = fast.experiment_id("cohort")
        got = [_as_plain(r) for r in fast.finished_runs(exp)]
        assert got == [_as_plain(r) for r in slow.finished_runs(exp)]
        assert fast.latest_experiment_with_runs() == slow.latest_experiment_with_runs() == "cohort"
    # an experiment created later whose only run started earlier is not the most recently used
    from mlflow.tracking import MlflowClient
    client = MlflowClient(uri)
    client.create_run(client.create_experiment("newer"), start_time=1_500)
    with store_read.open_store(uri) as fast:
        assert fast.latest_experiment_with_runs() == store_read._ClientStore(uri).latest_experiment_with_runs() == "cohort"
        client.create_run(fast.experiment_id("newer"), start_time=6_000)
        assert fast.latest_experiment_with_runs() == store_read._ClientStore(uri).latest_experiment_with_runs() == "newer"
    # active FINISHED runs only, newest first, ties by run id; the NaN and the latest step kept
    parent, s11, s22 = ids["cohort"][:3]
    assert [g[0] for g in got] == [*sorted([s11, s22]), parent]
    by_id = {g[0]: g for g in got}
    assert by_id[s11][6] == {"final_auroc_mean": 0.71, "rel_bandwidth": 1.0}
    assert by_id[s22][6]["final_auroc_mean"] == "nan" and by_id[s22][7] == {"params.lr": "0.01"}


def test_a_store_without_a_column_read_here_goes_through_mlflow(tmp_path: Path) -> None:
    from federation.run import store_read

    db = tmp_path / "m.db"
    _log_runs(f"sqlite:///{db}")
    con = sqlite3.connect(db)
    con.execute("ALTER TABLE latest_metrics RENAME COLUMN is_nan TO nan_flag")  # a future schema
    con.commit()
    con.close()
    assert store_read._open_sqlite(db) is None
    con = sqlite3.connect(db)
    con.execute("ALTER TABLE latest_metrics RENAME COLUMN nan_flag TO is_nan")
    con.execute("UPDATE experiments SET workspace = 'team-a' WHERE name = 'other'")  # a multi-tenant store
    con.commit()
    con.close()
    assert store_read._open_sqlite(db) is None


def test_runs_reads_the_store_without_torch_or_mlflow(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _log_runs(uri)
    (r,) = _probe([["runs", "--tracking-uri", uri]], tmp_path)
    assert r["code"] == 0 and r["heavy"] == [], r
    # the one finished clinical row: fedavg, seeds 11 and 22; seed 22's mean is undefined
    assert "experiment cohort: finished runs (2)" in r["stdout"]
    row = next(ln for ln in r["stdout"].splitlines() if "fedavg" in ln)
    assert "11 22" in row and "undefined (1 of 2 seeds)" in row and "1.00x" in row


def test_runs_on_image_benchmark_runs_names_the_report(tmp_path: Path) -> None:
    """An experiment of SAGE runs only: ``abps runs`` counts them and names the report that tables
    them, not the clinical first command; beside clinical rows it adds the same as a note."""
    from mlflow.tracking import MlflowClient

    from federation.run.tracking import BENCHMARK_TAG, SELECTOR_TAG

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _log_runs(uri)
    client = MlflowClient(uri)
    for name in ("sage", "cohort"):
        exp = client.get_experiment_by_name(name)
        exp = exp.experiment_id if exp else client.create_experiment(name)
        for sel in ("RG", "SAGE-OS"):
            r = client.create_run(exp, tags={BENCHMARK_TAG: "sage", SELECTOR_TAG: sel})
            client.set_terminated(r.info.run_id, "FINISHED")
    alone, beside = _probe([["runs", "--tracking-uri", uri, "--experiment", "sage"],
                            ["runs", "--tracking-uri", uri, "--experiment", "cohort"]], tmp_path)
    note = ("2 SAGE image-benchmark run(s), which abps runs does not table; abps report --experiment {e} "
            "--out report/{e}/ tables them")
    assert alone["code"] == 0 and alone["stdout"].strip() == "experiment sage: " + note.format(e="sage")
    assert beside["code"] == 0 and "fedavg" in beside["stdout"]
    assert "note: " + note.format(e="cohort") in beside["stdout"]


@pytest.mark.parametrize("env_experiment", [None, "other"])
def test_runs_default_experiment_as_mlflow_lists_it(tmp_path: Path, monkeypatch, env_experiment) -> None:
    from cli.runs_cmd import default_experiment
    from federation.run import store_read

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _log_runs(uri)
    monkeypatch.chdir(tmp_path)  # no recorded cohort here
    if env_experiment:
        monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", env_experiment)
    else:
        monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    want = env_experiment or "cohort"  # the newest experiment holding a run
    assert default_experiment(None, uri) == want
    assert default_experiment(None, uri, store_read._ClientStore(uri)) == want


def test_runs_before_any_training_says_so_and_makes_no_store(tmp_path: Path, capsys) -> None:
    """``abps runs`` on a store that does not exist yet answers that nothing was trained into it
    (exit 0) without creating it; an experiment the user names is still refused, naming it."""
    from cli.app import main

    uri = f"sqlite:///{tmp_path / 'none' / 'mlflow.db'}"
    (first,) = _probe([["runs", "--tracking-uri", uri]], tmp_path)
    assert first["code"] == 0 and first["stdout"].strip() == f"no training runs yet in {uri} (abps train --goal diversity)"
    with pytest.raises(SystemExit) as exc:
        main(["runs", "--tracking-uri", uri, "--experiment", "x"])
    assert exc.value.code == 2 and "--experiment 'x': no such MLflow experiment" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_runs_and_report_on_the_default_store_make_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    """In a folder with no store, ``abps runs`` and ``abps report`` on the default store create no
    ``mlflow/`` folder, and ``abps report`` with no experiment named says there is nothing to
    report (not that an ``--experiment`` the user never gave does not exist)."""
    from cli.app import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ABPS_STATE", str(tmp_path / "state.json"))
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    assert main(["runs"]) in (0, None)
    with pytest.raises(SystemExit) as exc:
        main(["report", "--out", "r"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "no experiment to report: sqlite:///mlflow/mlflow.db holds no runs" in err
    assert "--experiment" not in err.split("(")[0]
    # an experiment named by the option or the variable is refused naming what named it, still
    # before anything is written; an empty store file is read as no store, not filled in
    with pytest.raises(SystemExit):
        main(["report", "--out", "r", "--experiment", "nope"])
    assert "error: --experiment 'nope': no such MLflow experiment" in capsys.readouterr().err
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "nope")
    for argv in (["report", "--out", "r"], ["runs"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "error: MLFLOW_EXPERIMENT_NAME 'nope': no such MLflow experiment" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    (tmp_path / "empty.db").touch()
    assert main(["runs", "--tracking-uri", f"sqlite:///{tmp_path}/empty.db"]) in (0, None)
    assert (tmp_path / "empty.db").stat().st_size == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]


def test_version_prints_the_installed_version(capsys) -> None:
    import tomllib

    from cli.app import main

    try:
        main(["--version"])
    except SystemExit as e:
        assert e.code in (0, None)
    declared = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"abps {declared}"

"""On a small real cohort (the 100-patient MIMIC-IV demo) a mean over too few evaluable centers is
no headline: every place a figure appears says "undefined" with the counts, the per-center figures
stay, and the Pareto front leaves such rows out."""

from __future__ import annotations

import json

import pytest

from cli.app import main
from federation.core.config import EvaluationConfig


def test_required_centers_by_hand():
    e = EvaluationConfig()
    # max(5, ceil(10 % of n)), never more than half the federation
    assert [e.required(n) for n in (1, 3, 4, 5, 6, 10, 31, 50, 51, 230)] == [1, 2, 2, 3, 3, 5, 5, 5, 6, 23]
    assert EvaluationConfig(min_centers=1, min_center_share=0.0).required(31) == 1
    assert EvaluationConfig(min_centers=2, min_center_share=0.5).required(31) == 16
    assert EvaluationConfig(min_centers=30, min_center_share=0.0).required(31) == 16
    with pytest.raises(ValueError):
        EvaluationConfig(min_center_share=1.5)


@pytest.fixture(scope="module")
def demo_cohort(mimic_demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("small") / "cohort"
    main(["etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(out), "--window-years", "20",
          "--min-center-stays", "1"])
    return out


def test_mean_over_one_center_is_undefined_everywhere(demo_cohort, tmp_path, capsys):
    from federation.report import write_report

    uri = f"sqlite:///{tmp_path}/ml.db"
    out = tmp_path / "r.json"
    main(["train", "--method", "fedavg", "--cohort", str(demo_cohort), "--seeds", "11", "22", "--rounds", "1",
          "--output", str(out), "--tracking-uri", uri, "--experiment", "small", "--no-progress"])
    captured = capsys.readouterr()
    console = captured.out
    doc = json.loads(out.read_text())
    n = doc["n_centers"]
    seed = doc["seeds"]["11"]
    scored = seed["n_scored_test"]
    assert scored < 5 < n and seed["min_scored_test"] == 5            # 28 centers: max(5, ceil(2.8)) = 5
    assert seed["final_auroc_mean"] is None or seed["final_auroc_mean"] != seed["final_auroc_mean"]
    assert doc["summary"]["final_auroc_mean"]["mean"] is None
    assert doc["summary"]["final_auroc_mean"]["n_seeds_undefined"] == 2
    assert f"AUROC undefined ({scored} of {n} centers whose test split holds both classes; " \
           "a mean needs at least 5" in console
    assert "across 2 seeds" in console and "1.0000" not in console
    # the spread of the per-center AUROC rests on the same few centers: undefined too, and no
    # warning about a mean that was not given
    assert "AUROC worst-10 % undefined, Gini undefined; AUPRC " in console
    assert "rests on few centers" not in captured.err

    main(["runs", "--experiment", "small", "--tracking-uri", uri])
    runs = capsys.readouterr().out
    assert "undefined" in runs and "1.000" not in runs

    rep = write_report("small", tmp_path / "rep", uri, log_to_mlflow=False)
    (row,) = rep["sections"]["table1"]["rows"]
    assert row["n_undefined"] == 2 and row["n_scored_min"] == scored
    assert rep["sections"]["table1"]["pareto_front"] == []
    md = (tmp_path / "rep" / "table1.md").read_text()
    assert f"undefined (2 of 2 seeds: {scored} centers evaluable, 5 needed)" in md

    # the per-center figures stay available in MLflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("small")
    child = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags][0]
    assert "final_auroc_mean" not in child.data.metrics
    assert child.data.metrics["n_scored_test"] == scored and child.data.metrics["min_scored_test"] == 5
    assert "per_center.json" in {a.path for a in client.list_artifacts(child.info.run_id)}


def test_the_evaluation_setting_is_applied(demo_cohort, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("method: fedavg\nevaluation: {min_centers: 1, min_center_share: 0.0}\n")
    out = tmp_path / "r.json"
    main(["train", "--config", str(cfg), "--cohort", str(demo_cohort), "--seeds", "11", "--rounds", "1",
          "--output", str(out), "--tracking-uri", f"sqlite:///{tmp_path}/ml.db", "--no-progress"])
    doc = json.loads(out.read_text())
    seed = doc["seeds"]["11"]
    assert seed["min_scored_test"] == 1                     # the setting reaches the run
    assert (doc["summary"]["final_auroc_mean"]["mean"] is None) == (seed["n_scored_test"] == 0)
    text = capsys.readouterr().out
    assert "(across 1 seed" in text and "seeds" not in text.split("->")[0]
    assert "+/-" not in text.split("->")[0]   # one seed has no spread across seeds to show


def test_etl_on_a_demo_names_the_options_that_work(mimic_demo_dir, tmp_path):
    """The README's real-data command on the 100-patient demo: a one-line error that names the
    options that work, and those options then build a cohort."""
    from tests.test_cli_errors import one_line_error, run

    line = one_line_error(run("etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(tmp_path / "c")),
                          "--min-center-stays 50", "try --window-years 200 --min-center-stays 1")
    assert "stays of " in line and not (tmp_path / "c").exists()
    suggested = line.split("try ", 1)[1].split()
    p = run("etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(tmp_path / "c"), *suggested)
    assert p.returncode == 0, p.stderr[-500:]
    assert (tmp_path / "c" / "cohort.parquet").is_file()


def test_a_mean_over_few_centers_says_how_many_wherever_it_appears(mimic_demo_dir, tmp_path, capsys):
    from federation.report import write_report

    cohort = tmp_path / "cohort"  # the README's small run: 6 centers, 2 of them with both classes in test
    main(["etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(cohort), "--window-years", "200",
          "--min-center-stays", "1"])

    uri = f"sqlite:///{tmp_path}/ml.db"
    cfg = tmp_path / "few.yaml"
    cfg.write_text("evaluation: {min_centers: 1, min_center_share: 0.0}\n")
    out = tmp_path / "r.json"
    main(["train", "--method", "fedavg", "--cohort", str(cohort), "--seeds", "11", "--rounds", "1",
          "--config", str(cfg), "--output", str(out), "--tracking-uri", uri, "--experiment", "few", "--no-progress"])
    doc = json.loads(out.read_text())
    n, scored = doc["n_centers"], doc["seeds"]["11"]["n_scored_test"]
    assert 1 <= scored < n / 2 and doc["summary"]["final_auroc_mean"]["mean"] is not None
    assert f"warning: only {scored} of {n} centers have both classes" in capsys.readouterr().err

    main(["runs", "--experiment", "few", "--tracking-uri", uri])
    assert f"(1 seed; {scored} of {n} centers)" in capsys.readouterr().out
    write_report("few", tmp_path / "rep", uri, log_to_mlflow=False)
    assert f"(1 seed; {scored} of {n} centers) |" in (tmp_path / "rep" / "table1.md").read_text()

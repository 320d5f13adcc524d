"""`abps report`: Table 1 mean / std / bandwidth by hand, de-duplication, the Pareto front, the SAGE and
variance-correction sections, the MLflow report run, and a report built from a real tiny sweep."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest

from etl.errors import InputError
from federation import report as rp

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_pareto_front_by_hand():
    pts = [(1.0, 0.7), (2.0, 0.8), (2.0, 0.75), (3.0, 0.8), (0.5, 0.6), (1.0, 0.7), (math.nan, 0.9), (0.5, 0.55)]
    # (2, .75) is dominated by (2, .8); (3, .8) by (2, .8); (.5, .55) by (.5, .6); equal points both stay
    assert rp.pareto_front(pts) == [4, 0, 5, 1]
    assert rp.pareto_front([]) == []
    assert rp.pareto_front([(5.0, 0.1)]) == [0]


def test_mean_std_population():
    assert rp.mean_std([0.80, 0.76, 0.78]) == pytest.approx((0.78, math.sqrt(0.0008 / 3)))
    assert rp.mean_std([0.5]) == (0.5, 0.0)
    m, s = rp.mean_std([math.nan])
    assert math.isnan(m) and math.isnan(s)


@pytest.fixture()
def store(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/ml.db"
    client = MlflowClient(uri)
    exp_id = client.create_experiment("hand", artifact_location=(tmp_path / "art").as_uri())
    return uri, client, exp_id


def _cell(client, exp_id, label, method, seed, auroc, model_bytes, t, status="FINISHED", h="h1", rel=math.nan):
    run = client.create_run(exp_id, start_time=t, tags={"abps.kind": "cell", "abps.label": label, "method": method,
                                                        "seed": str(seed), "abps.config_hash": h})
    rid = run.info.run_id
    client.log_metric(rid, "final_auroc_mean", auroc, step=2)
    client.log_metric(rid, "model_bytes", model_bytes, step=2)
    if not math.isnan(rel):
        client.log_metric(rid, "rel_bandwidth", rel, step=2)
    client.log_metric(rid, "rounds_run", 2.0, step=2)
    if status != "RUNNING":
        client.set_terminated(rid, status)
    return rid


def test_table1_by_hand_dedupe_and_sections(store, tmp_path):
    uri, client, exp_id = store
    _cell(client, exp_id, "fedavg", "fedavg", 1, 0.10, 50e6, t=1000, rel=0.5)  # superseded by the later seed-1 run
    _cell(client, exp_id, "fedavg", "fedavg", 1, 0.70, 100e6, t=2000, rel=1.0)
    _cell(client, exp_id, "fedavg", "fedavg", 2, 0.74, 100e6, t=2001, rel=1.0)
    _cell(client, exp_id, "fedavg", "fedavg", 3, 0.00, 100e6, t=2002, status="RUNNING")  # killed: ignored
    _cell(client, exp_id, "fedavg", "fedavg", 4, 0.00, 100e6, t=2003, status="FAILED")   # ignored
    _cell(client, exp_id, "fedavg", "fedavg", "abc", 0.00, 100e6, t=2004)  # no integer seed: not ours, ignored
    _cell(client, exp_id, "abps", "abps", 1, 0.20, 1e6, t=900, h="old")      # older configuration: ignored
    for seed, a, rel in ((1, 0.80, 1.4), (2, 0.76, 1.5), (3, 0.78, 1.6)):
        _cell(client, exp_id, "abps", "abps", seed, a, 150e6, t=3000 + seed, rel=rel)
    _cell(client, exp_id, "local", "local", 1, 0.60, 0.0, t=4000, rel=0.0)
    _cell(client, exp_id, "abps-x", "abps-x", 1, 0.79, 9e6, t=4001, rel=0.09)
    _cell(client, exp_id, "centralized", "centralized", 1, 0.83, 0.0, t=4002)
    _sage_runs(client, exp_id, tmp_path)
    _vv_runs(client, exp_id)

    out = tmp_path / "rep"
    doc = rp.write_report("hand", out, uri)
    rows = {r["label"]: r for r in doc["sections"]["table1"]["rows"]}
    assert [r["label"] for r in doc["sections"]["table1"]["rows"]] == ["local", "fedavg", "abps", "abps-x",
                                                                         "centralized"]
    assert rows["fedavg"]["auroc_mean"] == pytest.approx(0.72) and rows["fedavg"]["auroc_std"] == pytest.approx(0.02)
    assert rows["fedavg"]["n_seeds"] == 2 and rows["fedavg"]["bandwidth"] == pytest.approx(1.0)
    assert rows["abps"]["auroc_mean"] == pytest.approx(0.78)
    assert rows["abps"]["auroc_std"] == pytest.approx(statistics.pstdev([0.80, 0.76, 0.78]))
    assert rows["abps"]["bandwidth"] == pytest.approx(1.5) and rows["abps-x"]["bandwidth"] == pytest.approx(0.09)
    assert rows["local"]["bandwidth"] == 0.0
    # bandwidth: each run's rel_bandwidth (model bytes / FedAvg's reference traffic), mean over seeds
    assert doc["sections"]["table1"]["bandwidth"].startswith("Bandwidth: cumulative model bytes relative to FedAvg's "
                                                             "reference traffic")
    # Pareto over (MB, AUROC) of runs with traffic: abps-x (9, .79) and abps (150, .78 < .79) -> only abps-x
    # dominates abps; fedavg (100, .72) is dominated by abps-x too
    assert doc["sections"]["table1"]["pareto_front"] == ["abps-x"]
    assert any("abps: 1 earlier run(s) with another configuration left out" in n for n in doc["notes"])

    md = (out / "table1.md").read_text()
    assert "| FedAvg | 0.720 ± 0.020 | 1.00× | 2 | 2 |" in md
    assert "| ABPS (base, κ=3) | 0.780 ± 0.016 | 1.50× | 3 | 2 |" in md
    with open(out / "table1.csv") as fh:
        csv_rows = {r["label"]: r for r in csv.DictReader(fh)}
    assert float(csv_rows["abps"]["bandwidth"]) == pytest.approx(1.5)
    import matplotlib.image as mpimg

    img = mpimg.imread(out / "fig3.png")
    assert img.shape[0] > 300 and img.shape[1] > 1000

    # SAGE Tables I-III (means over 2 seeds) and the figure
    t1 = (out / "sage_table1.md").read_text()
    assert "| fmnist-er-0.1 | 0.700 / 0.650 | 0.750 / 0.730 |" in t1  # RG, SAGE-OS columns in paper order
    assert ("SAGE fmnist-er-0.1: 1 earlier run(s) with other settings (n_clients) left out (the tables show the "
            "most recent settings' runs)") in doc["notes"]
    t3 = (out / "sage_table3.md").read_text()
    assert "| fmnist-er-0.1 | n/a / n/a / n/a / n/a | 40.0 / 25.0 / 10.0 / 5.0 |" in t3
    assert (out / "sage_fig3.png").is_file()
    # variance-correction Table I
    vv = (out / "vv_table1.md").read_text()
    assert "| N=50 | n/a (0/2) | n/a (0/2) | 600 (2/2) | 250 (1/2) |" in vv

    # the report run in MLflow carries the files; the report document has no identifier key
    (rep,) = client.search_runs([exp_id], "tags.`abps.kind` = 'report'")
    names = {a.path for a in client.list_artifacts(rep.info.run_id)}
    assert {"report.md", "table1.md", "table1.csv", "fig3.png", "sage_table3.csv", "vv_table1.md"} <= names
    text = (out / "report.md").read_text() + (out / "report.json").read_text()
    assert not any(k in text for k in ("stay_id", "subject_id", "hadm_id"))


def _sage_runs(client, exp_id, tmp_path):
    # an earlier RG run of the same label with 6 clients: other settings, left out of the tables
    vals = {("RG", 1, "6"): (0.10, 0.10), ("RG", 1, "10"): (0.68, 0.64), ("RG", 2, "10"): (0.72, 0.66),
            ("SAGE-OS", 1, "10"): (0.74, 0.70), ("SAGE-OS", 2, "10"): (0.76, 0.76)}
    for i, ((sel, seed, clients), (acc, f1)) in enumerate(vals.items()):
        run = client.create_run(exp_id, start_time=1000 + i, tags={"benchmark": "sage", "selector": sel})
        rid = run.info.run_id
        for k, v in {"config": "fmnist-er-0.1", "dataset": "fmnist", "graph": "er", "alpha_dir": "0.1",
                     "n_clients": clients, "seed": str(seed)}.items():
            client.log_param(rid, k, v)
        client.log_metric(rid, "final_global_acc", acc)
        client.log_metric(rid, "final_macro_f1", f1)
        client.log_metric(rid, "final_comm_oh", 1.0)
        if sel == "SAGE-OS":
            client.log_metric(rid, "final_budget_consumed", 0.35 + 0.1 * (seed - 1))
            client.log_metric(rid, "final_rg_fallback_rate", 0.1)
            client.log_metric(rid, "final_cost_rg_rate", 0.05)
            p = tmp_path / f"s{seed}" / "summary.json"
            p.parent.mkdir()
            stops = {1: {"stop_at_16": 0.5, "stop_at_32": 0.2, "stop_at_64": 0.3, "no_anchor": 0.0},
                     2: {"stop_at_16": 0.6, "stop_at_32": 0.2, "stop_at_64": 0.2, "no_anchor": 0.0}}[seed]
            p.write_text(json.dumps({"stop_distribution": stops}))  # last stage: (0.3 + 0.2) / 2 = 25 %
            client.log_artifact(rid, str(p))
        client.set_terminated(rid, "FINISHED")


def _vv_runs(client, exp_id):
    for arm, seed, most, first in (("variance_corrected", 1, 500.0, 250.0), ("variance_corrected", 2, 700.0, None),
                                   ("plain", 1, None, None), ("plain", 2, None, None)):
        run = client.create_run(exp_id, tags={"benchmark": "vv", "arm": arm, "cell": "N=50"})
        rid = run.info.run_id
        client.log_param(rid, "seed", str(seed))
        if most is not None:
            client.log_metric(rid, "most_reach", most)
        if first is not None:
            client.log_metric(rid, "first_reach", first)
        client.set_terminated(rid, "FINISHED")


def test_report_names_runs_from_different_platforms(store, tmp_path):
    """Runs computed on another SIMD level or engine step are named in the notes with their
    counts; runs that agree on every platform fact give no note."""
    uri, client, exp_id = store
    same = {"abps.platform.cpu_capability": "AVX512", "abps.platform.engine_step": "fused",
            "abps.platform.cpu": "X", "abps.platform.kernel_flags": "-O3", "abps.platform.versions": "torch=2"}
    for seed in (1, 2):
        rid = _cell(client, exp_id, "fedavg", "fedavg", seed, 0.7, 1e6, t=1000 + seed)
        client.set_tag(rid, "abps.platform.cpu", "X")
        for k, v in same.items():
            client.set_tag(rid, k, v)
    doc = rp.write_report("hand", tmp_path / "a", uri, log_to_mlflow=False)
    assert not any("platforms" in n for n in doc["notes"])
    rid = _cell(client, exp_id, "abps", "abps", 1, 0.7, 1e6, t=2000)
    for k, v in {**same, "abps.platform.cpu_capability": "AVX2", "abps.platform.engine_step": "eager"}.items():
        client.set_tag(rid, k, v)
    doc = rp.write_report("hand", tmp_path / "b", uri, log_to_mlflow=False)
    (note,) = [n for n in doc["notes"] if "platforms" in n]
    assert "cpu_capability: AVX2 (1 runs), AVX512 (2 runs)" in note and "engine_step: eager (1 runs), fused (2 runs)" in note
    assert note.startswith("clinical runs: the 3 compared runs") and "Notes" in (tmp_path / "b" / "report.md").read_text()


def test_empty_experiment_and_missing_experiment(store, tmp_path):
    uri, client, exp_id = store
    doc = rp.write_report("hand", tmp_path / "r", uri, log_to_mlflow=False)
    assert doc["sections"] == {}
    md = (tmp_path / "r" / "report.md").read_text()
    assert "No finished clinical runs" in md and "No finished SAGE runs" in md and "variance-correction" in md
    with pytest.raises(InputError, match="no such MLflow experiment"):
        rp.write_report("nosuch", tmp_path / "r2", uri)


def test_a_report_folder_of_another_experiment_needs_force(store, tmp_path):
    """An earlier report of the same experiment is brought up to date; one of another experiment,
    or report-named files no report wrote, are replaced only with force, and kept until then."""
    uri, client, _ = store
    client.create_experiment("other", artifact_location=(tmp_path / "art2").as_uri())
    out = tmp_path / "r"
    rp.write_report("hand", out, uri, log_to_mlflow=False)
    rp.write_report("hand", out, uri, log_to_mlflow=False)  # the same experiment: refreshed
    with pytest.raises(InputError, match=r"^--out .*/r: holds the report of experiment 'hand'; give --force"):
        rp.write_report("other", out, uri, log_to_mlflow=False)
    assert json.loads((out / "report.json").read_text())["experiment"] == "hand"
    rp.write_report("other", out, uri, log_to_mlflow=False, force=True)
    assert json.loads((out / "report.json").read_text())["experiment"] == "other"
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "report.md").write_text("my own notes\n")
    with pytest.raises(InputError, match=r"holds report.md, which no abps report wrote; give --force"):
        rp.write_report("hand", mine, uri, log_to_mlflow=False)
    assert (mine / "report.md").read_text() == "my own notes\n"


def test_report_from_a_tiny_sweep(tmp_path):
    from federation.data.synthetic import write_fedprox_cohort
    from federation.sweep import SweepSpec, run_sweep

    cohort = write_fedprox_cohort(tmp_path / "cohort", n_centers=6, seed=3, mean_size=90.0, shared=0.8)
    uri = f"sqlite:///{tmp_path}/ml.db"
    spec = SweepSpec.model_validate({"name": "tiny", "seeds": [1, 2], "rounds": 2, "methods": ["fedavg", "abps-div"]})
    out = run_sweep(spec, CONFIGS, cohort, tracking_uri=uri, progress=False)
    doc = rp.write_report("tiny", tmp_path / "rep", uri)
    rows = {r["label"]: r for r in doc["sections"]["table1"]["rows"]}
    by_label: dict[str, list[dict]] = {}
    for cell in out.cells:
        by_label.setdefault(cell.label, []).append(out.summaries[cell.key])
    for label, sums in by_label.items():
        a = [s["final_auroc_mean"] for s in sums]
        assert rows[label]["auroc_mean"] == pytest.approx(statistics.fmean(a), abs=1e-12)
        assert rows[label]["auroc_std"] == pytest.approx(statistics.pstdev(a), abs=1e-12)
    for label in ("fedavg", "abps-div"):
        assert rows[label]["bandwidth"] == pytest.approx(statistics.fmean(s["rel_bandwidth"] for s in by_label[label]))
    assert rows["fedavg"]["bandwidth"] == pytest.approx(2 / 50)  # 2 of the reference's 50 full-model rounds
    assert 0 < rows["abps-div"]["bandwidth"] < rows["fedavg"]["bandwidth"]  # kappa 1, bf16, personalized head


def test_report_keeps_goal_runs_apart_and_never_pools_cohorts(tmp_path):
    """`abps train --method abps --goal diversity` is its own row, and runs on another cohort in
    the same experiment are left out (with a note) instead of being averaged in."""
    from federation.core.config import build_config
    from federation.data.synthetic import write_fedprox_cohort
    from federation.run.runner import run_training

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    a = write_fedprox_cohort(tmp_path / "a", n_centers=4, seed=1, mean_size=60, shared=0.8)
    b = write_fedprox_cohort(tmp_path / "b", n_centers=4, seed=2, mean_size=60, shared=0.8)
    for method, params, cohort in (("fedavg", {}, b), ("fedavg", {}, a), ("abps", {}, a),
                                   ("abps", {"goal": "diversity"}, a)):
        cfg = build_config(method, {}, {"method": method, "params": params}, 1)
        run_training(cfg, cohort, [5], tracking_uri=uri, experiment="mix", progress=False)
    doc = rp.write_report("mix", tmp_path / "rep", tracking_uri=uri, log_to_mlflow=False)
    labels = sorted(r["label"] for r in doc["sections"]["table1"]["rows"])
    assert labels == ["abps", "abps [goal=diversity]", "fedavg"]
    assert any("on another cohort ignored (b)" in n and "(a) are shown" in n for n in doc["notes"])


def testrounds_cell_is_whole_when_every_seed_ran_the_same_rounds():
    from federation.report.abps_table1 import rounds_cell

    assert [rounds_cell(x) for x in (50.0, 3.0, 47.4)] == ["50", "3", "47.4"]


def test_a_markdown_cell_holds_a_pipe_or_a_line_break_without_breaking_the_table():
    from federation.report.common import md_table

    text = md_table(["method", "AUROC"], [["a|b\nc", 0.5]])
    assert text.splitlines() == ["| method | AUROC |", "|---|---|", "| a\\|b c | 0.5 |"]


def test_a_store_that_refuses_the_report_run_gets_no_report_files(store, tmp_path, monkeypatch):
    """The report run starts before the files are built: a store that cannot be written (here:
    its run start raises as a read-only SQLite file does) leaves no report folder behind."""
    import contextlib

    from federation.run.tracking import Tracker

    uri, client, exp_id = store
    _cell(client, exp_id, "fedavg", "fedavg", 1, 0.70, 100e6, t=2000, rel=1.0)

    @contextlib.contextmanager
    def refused(self, *args, **kwargs):
        raise InputError("the store cannot be written (attempt to write a readonly database)")
        yield  # pragma: no cover

    monkeypatch.setattr(Tracker, "run", refused)
    with pytest.raises(InputError, match="cannot be written"):
        rp.write_report("hand", tmp_path / "rep", uri)
    assert not (tmp_path / "rep").exists()
    assert rp.write_report("hand", tmp_path / "rep", uri, log_to_mlflow=False)["sections"]
    assert (tmp_path / "rep" / "report.md").is_file()

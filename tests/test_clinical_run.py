"""The clinical figures of a run (federation/core/evaluation.py): a 2-round FedAvg run on the real
MIMIC-IV demo writes them to results.json and MLflow, equal to federation.core.clinical's functions
applied to the run's final test predictions; subgroup codes checked against Polars."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from sklearn.metrics import average_precision_score, brier_score_loss

import federation.core.clinical as cm
from etl.mimic import EtlOptions, run_etl
from federation.core.config import build_config
from federation.core.evaluation import SUBGROUP_AXES, as_logits, group_codes
from federation.core.metrics import batched_auroc
from federation.data.tensors import FederatedData
from federation.methods import get_method
from federation.run.runner import run_one, run_training

SEED = 5


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def demo_cohort(mimic_demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("clin") / "cohort"
    # two iid centers with a large test split, so each center's test rows hold both classes
    run_etl(mimic_demo_dir, out, EtlOptions(partition="iid", n_centers=2, split_fractions=(0.5, 0.1, 0.4),
                                            min_center_stays=1, seed=7))
    return out


@pytest.fixture(scope="module")
def trained(demo_cohort, tmp_path_factory):
    """results.json + MLflow store of `abps train` (fedavg, 2 rounds, one seed), and the same run's
    final parameters from run_one (same cfg, data and seed: identical on CPU)."""
    tmp = tmp_path_factory.mktemp("clinrun")
    cfg = build_config("fedavg", get_method("fedavg").default_config, None, rounds=2)
    uri = f"sqlite:///{tmp}/ml.db"
    doc = run_training(cfg, demo_cohort, [SEED], output=tmp / "results.json", tracking_uri=uri,
                       experiment="clin", progress=False)
    data = FederatedData.from_cohort(demo_cohort, min_train=cfg.min_train)
    res = run_one(cfg, data, SEED, keep_params=True)
    cls = get_method("fedavg")
    logits = cls(cls.Params.model_validate(cfg.params)).make_engine(data, cfg, SEED).predict(res.params, "test")
    return json.loads((tmp / "results.json").read_text()), doc, data, logits, uri, tmp


def test_results_json_equals_clinical_functions_on_final_predictions(trained):
    written, _, data, z, _, _ = trained
    t = data.splits["test"]
    y, m = t.y.double(), t.mask
    z = z.double().masked_fill(~m, 0.0)
    p = torch.sigmoid(z)
    a, b = cm.batched_calibration(z, y, m, min_events=cm.MIN_CELL_EVENTS)
    per = {"auroc": batched_auroc(z, y, m).double(), "auprc": cm.batched_auprc(z, y, m), "brier": cm.batched_brier(p, y, m),
           "ece": cm.batched_ece(p, y, m, 10), "cal_intercept": a, "cal_slope": b}
    clin = written["seeds"][str(SEED)]["clinical"]
    assert clin["distribution"]["auroc"]["n_defined"] == 2
    assert clin["distribution"]["brier"]["n_defined"] == data.n_centers
    for name, v in per.items():
        want = cm.distribution(v, higher_is_better=name not in ("brier", "ece"))
        got = clin["distribution"][name]
        for stat in ("mean", "median", "worst10", "std", "gini")[: 4 if name == "cal_intercept" else 5]:
            w = getattr(want, stat)
            assert (got[stat] is None and not math.isfinite(w)) or got[stat] == pytest.approx(w, rel=1e-9, abs=1e-12)
        assert got["n_defined"] == want.n_defined
        assert got["n_defined"] + got["n_undefined"] == data.n_centers  # every center, rested or not
    lo, hi = cm.bootstrap_mean_auroc(z, y, m, n_boot=200, seed=SEED)
    assert clin["auroc_ci"] == pytest.approx([lo, hi])
    assert lo <= clin["distribution"]["auroc"]["mean"] <= hi
    # the AUROC summary the runtime always reported is the same figure
    assert clin["distribution"]["auroc"]["mean"] == pytest.approx(written["seeds"][str(SEED)]["final_auroc_mean"])
    # one center against scikit-learn (the largest test split with both classes)
    i = max((j for j in range(data.n_centers) if 0 < float(y[j][m[j]].sum()) < int(m[j].sum())),
            key=lambda j: int(m[j].sum()))
    yi, pi = y[i][m[i]].numpy(), p[i][m[i]].numpy()
    assert float(per["auprc"][i]) == pytest.approx(average_precision_score(yi, pi))
    assert float(per["brier"][i]) == pytest.approx(brier_score_loss(yi, pi))


def test_subgroups_equal_subgroup_gaps_and_suppression_is_said(trained):
    written, _, data, z, _, _ = trained
    t = data.splits["test"]
    clin = written["seeds"][str(SEED)]["clinical"]
    rows = clin["subgroups"]
    assert [(r["axis"], r["group"]) for r in rows] == [(a, g) for a, names in SUBGROUP_AXES.items() for g in names]
    g = data.groups["test"]
    for ax, (axis, names) in enumerate(SUBGROUP_AXES.items()):
        want = cm.subgroup_gaps(z.double().masked_fill(~t.mask, 0.0), t.y.double(), t.mask, g[..., ax], list(names),
                             n_boot=200, seed=SEED)
        for w, r in zip(want, [r for r in rows if r["axis"] == axis]):
            assert r["n"] == w.n and r["suppressed"] == w.suppressed
            if not w.suppressed:
                assert r["auroc"] == pytest.approx(w.auroc) and r["ece_gap"] == pytest.approx(w.ece_gap)
    hidden = [f"{r['axis']}={r['group']}" for r in rows if r["suppressed"]]
    assert hidden and all(h in clin["subgroup_note"] for h in hidden)  # the demo's test split is small
    assert all(r["auroc"] is None for r in rows if r["suppressed"])


def test_group_codes_of_the_test_split_match_polars(demo_cohort, trained):
    _, _, data, _, _, _ = trained
    c = pl.read_parquet(demo_cohort / "cohort.parquet").filter(pl.col("split") == "test")
    order = {cid: i for i, cid in enumerate(data.center_ids)}
    c = c.filter(pl.col("center_id").is_in(list(order))).with_columns(
        pl.col("center_id").replace_strict(order, return_dtype=pl.Int64).alias("_c")).sort("_c", maintain_order=True)
    t = data.splits["test"]
    got = data.groups["test"][t.mask].numpy()  # row order: center, then file order
    sex = c["gender"].replace_strict({"F": 0, "M": 1}, default=-1, return_dtype=pl.Int64).to_numpy()
    age = c["age"].to_numpy()
    band = np.select([age < 18, age < 45, age < 65, age < 80], [-1, 0, 1, 2], 3)
    race = c["race"].replace_strict({r: i for i, r in enumerate(SUBGROUP_AXES["race"])}, default=-1,
                                    return_dtype=pl.Int64).to_numpy()
    assert (got == np.stack([sex, band, race], 1)).all()
    assert (data.groups["test"][~t.mask] == -1).all()
    # subgroup sizes of the results = Polars counts on the test split
    written = trained[0]
    n_f = [r["n"] for r in written["seeds"][str(SEED)]["clinical"]["subgroups"] if r["group"] == "F"][0]
    assert n_f == int((c["gender"] == "F").sum())


def test_group_codes_hand_values():
    f = pl.DataFrame({"gender": ["F", "M", None, "X", "M"], "age": [18.0, 44.9, 45.0, 80.0, 17.0],
                      "race": ["WHITE", "UNKNOWN", "ASIAN", "OTHER", None]})
    assert group_codes(f).tolist() == [[0, 0, 0], [1, 0, -1], [-1, 1, 3], [-1, 3, 4], [1, -1, -1]]


def test_probability_scores_are_mapped_back_to_logits():
    z = torch.tensor([[-3.0, 0.0, 2.5]])
    assert torch.allclose(as_logits(torch.sigmoid(z), "probability"), z.double(), atol=1e-6)
    with pytest.raises(ValueError, match="unknown score kind"):
        as_logits(z, "rank")


def test_mlflow_gets_final_metrics_and_per_center_csv(trained):
    from mlflow.tracking import MlflowClient

    written, _, data, _, uri, tmp = trained
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("clin")
    child = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags][0]
    clin = written["seeds"][str(SEED)]["clinical"]
    mets = child.data.metrics
    assert mets["clin_auroc_mean"] == pytest.approx(clin["distribution"]["auroc"]["mean"])
    assert mets["clin_ece_worst10"] == pytest.approx(clin["distribution"]["ece"]["worst10"])
    assert mets["clin_auroc_ci_low"] == pytest.approx(clin["auroc_ci"][0])
    assert sum(k.startswith("clin_") for k in mets) <= 32  # a few keys, not one per center
    path = client.download_artifacts(child.info.run_id, "clinical_per_center.csv", str(tmp))
    rows = list(csv.DictReader(open(path)))
    assert [r["center_id"] for r in rows] == data.center_ids
    assert set(rows[0]) == {"center_id", "n_test", "n_pos", "auroc", "auprc", "brier", "ece", "cal_intercept",
                            "cal_slope", "suppressed"}
    per_center = json.loads(Path(client.download_artifacts(child.info.run_id, "per_center.json", str(tmp))).read_text())
    for r in rows:
        if r["brier"]:
            assert float(r["brier"]) == pytest.approx(per_center[r["center_id"]]["brier"])
    text = Path(path).read_text() + json.dumps(clin)
    assert "stay_id" not in text and "subject_id" not in text and "hadm_id" not in text


def test_report_shows_clinical_and_fairness_tables(trained):
    from federation.report import write_report

    written, _, _, _, uri, tmp = trained
    doc = write_report("clin", tmp / "report", tracking_uri=uri, log_to_mlflow=False)
    clin = written["seeds"][str(SEED)]["clinical"]
    row = doc["sections"]["clinical"]["rows"][0]
    assert row["label"] == "fedavg" and row["n_seeds"] == 1
    assert row["clin_auroc_worst10"] == pytest.approx(clin["distribution"]["auroc"]["worst10"])
    assert row["clin_cal_slope_median"] == pytest.approx(clin["distribution"]["cal_slope"]["median"], nan_ok=True)
    md = (tmp / "report" / "report.md").read_text()
    assert "## Clinical figures" in md and "## Fairness (subgroups)" in md
    assert f"{clin['distribution']['ece']['mean']:.3f}" in (tmp / "report" / "clinical.md").read_text()
    fair = (tmp / "report" / "fairness.md").read_text()
    shown = {(r["axis"], r["group"]) for r in clin["subgroups"] if not r["suppressed"]}
    hidden = [f"{r['axis']}={r['group']}" for r in clin["subgroups"] if r["suppressed"]]
    assert fair.count("| suppressed |") >= len(hidden) and all(h in fair for h in hidden)
    assert len(doc["sections"]["clinical"]["fairness"]) == len(shown) + len(hidden)
    # one seed: the table's gap interval is that seed's bootstrap interval, printed beside the gap
    for r in clin["subgroups"]:
        if not r["suppressed"]:
            lo, hi = r["auroc_gap_ci"]
            assert f"| {r['auroc_gap']:.3f} | [{lo:.3f}, {hi:.3f}] |" in fair
            got = next(f for f in doc["sections"]["clinical"]["fairness"] if (f["axis"], f["group"]) == (r["axis"], r["group"]))
            assert (got["auroc_gap_ci_low"], got["auroc_gap_ci_high"]) == pytest.approx((lo, hi))
    assert {"clinical.csv", "fairness.csv"} <= {p.name for p in (tmp / "report").iterdir()}


def test_train_prints_the_clinical_line(trained):
    from federation.core.evaluation import clinical_line

    written = trained[0]
    line = clinical_line(written["seeds"])
    d = written["seeds"][str(SEED)]["clinical"]["distribution"]
    assert f"AUROC worst-10 % {d['auroc']['worst10']:.3f}" in line and f"ECE {d['ece']['mean']:.3f}" in line
    assert clinical_line({"1": {"final_auroc_mean": 0.5}}) is None


def test_early_stopping_reports_the_restored_round(trained):
    """FedAvg-X (early stopping on val AUROC): the clinical figures are those of the best round's
    parameters, so their AUROC mean is the reported final_auroc_mean of that round."""
    data = trained[2]
    cfg = build_config("fedavg-x", get_method("fedavg-x").default_config, None, rounds=4)
    res = run_one(cfg, data, SEED)
    assert res.clinical is not None and res.best_round <= res.rounds_run
    assert res.clinical.distribution["auroc"]["mean"] == pytest.approx(res.final_auroc_mean)
    for row in res.per_center.values():
        assert set(row) >= {"test_auroc", "auprc", "brier", "ece", "cal_intercept", "cal_slope", "n_pos"}

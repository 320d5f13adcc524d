"""a non-finite value never becomes a result.

Two recipes (a 0/0 WPFed mixing row; FedAvg diverging at lr 1e30) printed
``AUROC 1.3597`` on main; they must stop with one line naming method, seed and round. The
guards underneath: ``check_row_stochastic`` refuses NaN rows, ``batched_auroc`` refuses
non-finite scores and never returns a value outside [0, 1] (scikit-learn is the reference),
config validation refuses NaN / infinity up front.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from sklearn.metrics import roc_auc_score

from federation.core.checks import NonFiniteError, check_finite, check_finite_params
from federation.core.config import RunConfig
from federation.core.metrics import batched_auroc
from federation.engine.mixing import check_row_stochastic

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from cli.app import main; main()"]


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "ABPS_STATE": os.environ["ABPS_STATE"]})


def test_check_row_stochastic_refuses_nan_and_inf_rows():
    check_row_stochastic(torch.tensor([[0.5, 0.5], [0.0, 1.0]]))
    nan_row = torch.tensor([[0.5, 0.5], [float("nan"), float("nan")]])  # a 0/0 row
    with pytest.raises(ValueError, match="non-finite entries .* in 1 row"):
        check_row_stochastic(nan_row)
    with pytest.raises(ValueError, match="non-finite"):
        check_row_stochastic(torch.tensor([[float("inf"), 0.0], [0.0, 1.0]]))


def test_batched_auroc_refuses_non_finite_scores_and_stays_in_unit_interval():
    y = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    for bad in (float("nan"), float("inf"), -float("inf")):
        s = torch.tensor([[0.3, bad, 0.1, 0.2]])
        with pytest.raises(NonFiniteError, match="1 score"):
            batched_auroc(s, y, mask)
    with pytest.raises(NonFiniteError, match="4 score"):  # main returned 1.25 for all-NaN scores
        batched_auroc(torch.full((1, 4), float("nan")), y, mask)
    # a non-finite value on a padding position is ignored (it is not a score)
    s = torch.tensor([[0.3, 0.2, 0.1, float("nan")]])
    m = torch.tensor([[True, True, True, False]])
    assert float(batched_auroc(s, y, m)[0]) == roc_auc_score([1, 0, 1], [0.3, 0.2, 0.1])
    # extreme finite scores (the float64 maximum, which main used as the padding sentinel) with ties
    big = torch.finfo(torch.float64).max
    s = torch.tensor([[big, big, -big, 0.0, 7.0, 0.0]], dtype=torch.float64)
    y2 = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0, 0.0]])
    m2 = torch.tensor([[True, True, True, True, False, True]])
    got = float(batched_auroc(s, y2, m2)[0])
    sel = m2[0].numpy()
    assert math.isclose(got, roc_auc_score(y2[0].numpy()[sel], s[0].numpy()[sel]), abs_tol=1e-12)


def test_batched_auroc_random_ties_against_sklearn_always_in_range():
    g = torch.Generator().manual_seed(5)
    for _ in range(20):
        m, rows = 6, 30
        scores = torch.randint(-2, 3, (m, rows), generator=g).double() * 1e300  # heavy ties, huge values
        labels = (torch.rand(m, rows, generator=g) < 0.4).float()
        mask = torch.rand(m, rows, generator=g) < 0.8
        auc = batched_auroc(scores, labels, mask)
        for i in range(m):
            sel = mask[i].numpy()
            lab = labels[i].numpy()[sel]
            if 0 < lab.sum() < len(lab):
                ref = roc_auc_score(lab, scores[i].numpy()[sel])
                assert 0.0 <= float(auc[i]) <= 1.0 and math.isclose(float(auc[i]), ref, abs_tol=1e-12)
            else:
                assert math.isnan(float(auc[i]))


def test_check_finite_message_names_method_seed_round():
    check_finite("x", {"a": 1.0, "b": [torch.ones(3), np.float32(2.0)], "c": "text", "d": None})
    with pytest.raises(NonFiniteError) as e:
        check_finite("Shapley values", torch.tensor([0.1, float("nan"), float("inf")]), "abps", 22, 4)
    assert str(e.value) == ("abps seed 22 round 4: Shapley values holds 2 non-finite value(s) (NaN or infinity); "
                            "the run is stopped")
    with pytest.raises(NonFiniteError, match="^fedavg seed 1 round 2: beliefs \\(beta\\) holds 1"):
        check_finite_params("beliefs", {"alpha": torch.tensor([1.0, 2.0]), "beta": torch.tensor([[1.0, math.inf]])},
                            "fedavg", 1, 2)
    with pytest.raises(NonFiniteError, match="^extras holds 1"):
        check_finite("extras", {"gain": float("nan")})


def test_config_refuses_non_finite_numbers_up_front():
    for bad in ({"engine": {"lr": float("inf")}}, {"engine": {"lr": float("nan")}},
                {"exchange": {"server_momentum": float("nan")}}, {"params": {"epsilon": float("nan")}},
                {"params": {"weights": [1.0, float("inf")]}}):
        with pytest.raises(ValidationError, match="finite"):
            RunConfig.model_validate({"method": "fedavg", **bad})
    with pytest.raises(ValidationError, match="greater than 0"):
        RunConfig.model_validate({"method": "fedavg", "engine": {"lr": 0.0}})


@pytest.fixture(scope="module")
def iid3(mimic_demo_dir, tmp_path_factory) -> Path:
    """Cohort C: the real MIMIC-IV demo, IID over 3 centers."""
    out = tmp_path_factory.mktemp("iid3") / "c"
    p = run("etl", "--mimic-dir", str(mimic_demo_dir), "--partition", "iid", "--n-centers", "3",
            "--min-center-stays", "1", "--out", str(out))
    assert p.returncode == 0, p.stderr[-800:]
    return out


@pytest.mark.parametrize("recipe,needle", [
    # WPFed's 0/0 weights are refused when the config is validated, before any MLflow run
    ("wpfed", "wpfed: invalid parameter"),
    ("lr", "fedavg seed 11 round 1: parameters after local training (w1) holds"),
])
def test_issue_recipes_stop_with_one_line(iid3, tmp_path, recipe, needle):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/m.db"
    common = ["--cohort", str(iid3), "--seeds", "11", "--rounds", "3", "--no-progress", "--tracking-uri", uri,
              "--output", str(tmp_path / "results.json")]
    if recipe == "wpfed":
        p = run("train", "--method", "wpfed", "--param", "similarity_weight=0", "--param", "quality_prior=0", *common)
    else:
        cfg = tmp_path / "lr.yaml"
        cfg.write_text("method: fedavg\nengine: {lr: 1.0e+30}\n")
        p = run("train", "--method", "fedavg", "--config", str(cfg), *common)
    assert p.returncode == 2, p.stderr[-800:]
    assert "Traceback" not in p.stderr and "AUROC" not in p.stdout
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error")]
    assert len(lines) == 1 and lines[0].startswith(f"error: {needle}"), p.stderr[-800:]
    assert not (tmp_path / "results.json").exists()
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    if recipe == "wpfed":
        assert "similarity_weight = 0 with quality_prior = 0" in lines[0] and runs == []
    else:
        assert runs and all(r.info.status == "FAILED" for r in runs)
    for r in runs:  # nothing out of range was logged before the stop
        assert all(0.0 <= v <= 1.0 for k, v in r.data.metrics.items() if "auroc" in k)


@pytest.mark.parametrize("value,stops", [(math.nan, False), (math.inf, True)])
def test_method_outputs_nan_is_undefined_and_left_out_inf_stops(iid3, monkeypatch, value, stops):
    """A method's NaN round metric (e.g. a mean over no observed partner) is not logged; an
    infinity stops the run with the one-line error."""
    from federation.data.tensors import FederatedData
    from federation.methods import get_method
    from federation.run.runner import run_one

    fedavg = get_method("fedavg")
    monkeypatch.setattr(fedavg, "after_exchange", lambda self, ctx, r, plan: {"probe_metric": value, "ok": 0.5})
    cfg = RunConfig(method="fedavg", rounds=2)
    data = FederatedData.from_cohort(iid3)
    if stops:
        with pytest.raises(NonFiniteError, match=r"^fedavg seed 11 round 1: method output 'probe_metric'"):
            run_one(cfg, data, 11)
    else:
        res = run_one(cfg, data, 11)
        assert all("probe_metric" not in h and h["ok"] == 0.5 for h in res.history)

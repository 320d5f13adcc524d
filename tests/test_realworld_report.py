"""`abps report` under heterogeneous links: a real tiny run of configs/realworld-links.yaml (FedAvg, ABPS,
ABPS-X) gives the "AUROC vs virtual time" section, whose figures are the runs' own logged values."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from federation import report as rp
from federation.core.config import build_config, load_yaml
from federation.data.tensors import FederatedData
from federation.methods import get_method
from federation.report.realworld import _hours_to
from federation.run.runner import run_one

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_hours_to_95_percent_by_hand():
    # gain 0.5 -> 0.7 (0.2); 95 % of it is reached at 0.69 >= 0.5 + 0.19: hour 3.0
    assert _hours_to([1.0, 2.0, 3.0, 4.0], [0.5, 0.6, 0.69, 0.7]) == 3.0
    assert math.isnan(_hours_to([1.0], [0.5]))


@pytest.mark.filterwarnings("ignore:per-center preprocessing")
def test_report_auroc_vs_virtual_time_from_the_links_sweep(tmp_path):
    from federation.data.synthetic import write_fedprox_cohort
    from federation.sweep import SweepSpec, run_sweep

    cohort = write_fedprox_cohort(tmp_path / "cohort", n_centers=6, seed=3, mean_size=90.0, shared=0.8)
    uri = f"sqlite:///{tmp_path}/ml.db"
    doc = load_yaml(CONFIGS / "realworld-links.yaml")
    spec = SweepSpec.model_validate({**doc, "seeds": [1], "rounds": 3, "workers": 1})
    out = run_sweep(spec, CONFIGS, cohort, tracking_uri=uri, progress=False)
    rep = rp.write_report("realworld-links", tmp_path / "rep", uri)
    rows = {r["label"]: r for r in rep["sections"]["realworld"]["rows"]}
    assert set(rows) == {"fedavg", "abps", "abps-x"}
    for cell in out.cells:
        r = rows[cell.label]
        assert r["auroc_mean"] == pytest.approx(out.summaries[cell.key]["final_auroc_mean"], abs=1e-12)
        assert r["virtual_hours"] > 0 and r["available_share"] == 1.0 and r["dropped_per_round"] == 0.0
    # the FedAvg row against a direct run of the same cell
    cfg = build_config("fedavg", get_method("fedavg").default_config,
                       load_yaml(CONFIGS / "realworld-hetero-links.yaml"), rounds=3)
    hist = run_one(cfg, FederatedData.from_cohort(cohort), 1).history
    assert rows["fedavg"]["virtual_hours"] == pytest.approx(hist[-1]["virtual_hours"], rel=1e-12)
    assert rows["fedavg"]["seconds_per_round"] == pytest.approx(statistics.fmean(h["round_seconds"] for h in hist),
                                                               rel=1e-12)
    # ABPS-X sends a bf16 trunk to one partner: its rounds are shorter than FedAvg's full fp32 star
    assert rows["abps-x"]["seconds_per_round"] < rows["fedavg"]["seconds_per_round"]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "AUROC vs virtual time" in md and "realworld_time.png" in md
    import matplotlib.image as mpimg

    img = mpimg.imread(tmp_path / "rep" / "realworld_time.png")
    assert img.shape[0] > 300 and img.shape[1] > 1000
    assert {"realworld.md", "realworld.csv", "realworld_time.png"} <= {p.name for p in (tmp_path / "rep").iterdir()}

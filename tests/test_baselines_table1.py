"""configs/table1.yaml runs every tuned baseline preset, and the Table 1 report shows each row with
its mean ± std over seeds, its bandwidth and the ABPS paper's figure beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from federation.core.config import load_yaml

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TUNED = ("fedprox", "feddyn", "moon", "decefl", "defta", "wpfed", "bnn-fl")


def test_table1_sweep_runs_each_tuned_preset_unchanged():
    """Every tuned baseline (and DeFTA and the Centralized reference) is a row of table1.yaml that
    reads its own preset file without overrides, so the full run uses exactly the tuned values."""
    from federation.sweep import expand_cells, load_sweep

    spec, base = load_sweep(CONFIGS / "table1.yaml")
    cells = {c.label: c for c in expand_cells(spec, base, "cohort-id", seeds=[11])}
    for method in (*TUNED, "centralized", "fedavg", "local"):
        entry = next(e for e in spec.methods if e.method == method)
        assert entry.config == f"{method}.yaml" and not entry.params and not entry.overrides, method
        preset = load_yaml(CONFIGS / f"{method}.yaml")
        got = cells[method].config.params
        for k, v in (preset.get("params") or {}).items():  # the preset's values reach the cell
            assert got[k] == v, (method, k)
    assert cells["feddyn"].config.params["alpha"] == 0.1 and cells["feddyn"].config.params["aggregation"] == "uniform"


def test_table1_markdown_shows_mean_std_bandwidth_and_paper_figure():
    from federation.report import CellRun, table1, table1_markdown

    def cell(method, seed, auroc, nbytes):
        return CellRun(run_id=f"{method}{seed}", label=method, method=method, seed=seed, cohort="c",
                       config_hash=None, start_time=0, final_auroc_mean=auroc, model_bytes=nbytes,
                       rel_bandwidth=float("nan"), rounds_run=50.0, rest_share=float("nan"))

    runs = [cell("fedavg", 11, 0.70, 100.0), cell("fedavg", 22, 0.74, 100.0),
            cell("bnn-fl", 11, 0.60, 200.0), cell("bnn-fl", 22, 0.66, 200.0),
            cell("centralized", 11, 0.80, 0.0), cell("random-partners", 11, 0.71, 25.0)]
    rows, basis = table1(runs)
    assert basis == "fedavg" and [r.label for r in rows] == ["fedavg", "bnn-fl", "centralized", "random-partners"]
    md = table1_markdown(rows, basis)
    lines = {ln.split("|")[1].strip(): ln for ln in md.splitlines() if ln.startswith("| ")}
    # population std over the seeds by hand: (0.70, 0.74) -> 0.720 ± 0.020; (0.60, 0.66) -> 0.630 ± 0.030
    assert "| 0.720 ± 0.020 | 1.00× | 2 |" in lines["FedAvg"] and lines["FedAvg"].endswith("| 0.755 ± 0.019 (1.00×) |")
    assert "| 0.630 ± 0.030 | 2.00× | 2 |" in lines["BNN+FL"] and lines["BNN+FL"].endswith("| 0.749 ± 0.014 (2.00×) |")
    assert lines["Centralized (non-federated upper bound)"].endswith("| 0.827 ± 0.007 |")  # caption: no bandwidth
    assert lines["Random partners (ablation, κ=1)"].endswith("| – |")  # not a paper row
    assert "| 0.250× " not in md and "| 0.25× |" in lines["Random partners (ablation, κ=1)"]
    assert "Paper: AUROC (bandwidth)" in md


def test_paper_figures_cover_every_paper_row():
    from federation.report import PAPER_ORDER
    from federation.report.abps_table1 import PAPER_TABLE1

    assert set(PAPER_TABLE1) == set(PAPER_ORDER)
    # spot checks against the ABPS paper, Table 1 (Sec. 6.4)
    assert PAPER_TABLE1["feddyn"] == (0.758, 0.017, 1.00) and PAPER_TABLE1["abps-x"] == (0.758, 0.010, 0.09)
    assert PAPER_TABLE1["fedavg-x"] == (0.691, 0.008, 0.31) and PAPER_TABLE1["local"][0] == pytest.approx(0.587)

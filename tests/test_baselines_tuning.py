"""federation.report.tuning: the validation-AUROC tuning table and configs/tuning.yaml."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from federation.report.tuning import TuningRecord, tuning_csv, tuning_markdown, tuning_rows

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_choice_reads_validation_never_test():
    recs = [
        TuningRecord("fedprox mu=0.01", "fedprox", 11, 0.70, 0.90),
        TuningRecord("fedprox mu=0.01", "fedprox", 22, 0.72, 0.90),
        TuningRecord("fedprox mu=0.1", "fedprox", 11, 0.74, 0.50),  # best val, worst test
        TuningRecord("fedprox mu=0.1", "fedprox", 22, math.nan, 0.50),  # NaN val left out
        TuningRecord("feddyn alpha=0.1 uniform", "feddyn", 11, math.nan, 0.8),
        TuningRecord("feddyn alpha=0.01 uniform", "feddyn", 11, 0.60, 0.6),
    ]
    rows = tuning_rows(recs)
    by = {r.label: r for r in rows}
    assert [r.label for r in rows] == ["fedprox mu=0.01", "fedprox mu=0.1", "feddyn alpha=0.1 uniform",
                                       "feddyn alpha=0.01 uniform"]
    assert by["fedprox mu=0.01"].val_mean == pytest.approx(0.71) and by["fedprox mu=0.01"].val_std == pytest.approx(0.01)
    assert by["fedprox mu=0.1"].chosen and not by["fedprox mu=0.01"].chosen
    assert by["fedprox mu=0.1"].n_seeds == 2 and by["fedprox mu=0.1"].val_mean == pytest.approx(0.74)
    assert by["feddyn alpha=0.01 uniform"].chosen and not by["feddyn alpha=0.1 uniform"].chosen
    md = tuning_markdown(rows)
    assert "| fedprox | fedprox mu=0.1 | 2 | 0.740 ± 0.000 | 0.500 | **yes** |" in md
    assert "n/a" in md  # the all-NaN point
    assert tuning_csv(rows).splitlines()[0].startswith("method,label,n_seeds,val_auroc_mean")
    with pytest.raises(ValueError, match="several methods"):
        tuning_rows([TuningRecord("x", "fedprox", 1, 0.5, 0.5), TuningRecord("x", "moon", 1, 0.5, 0.5)])


def test_tuning_sweep_file_is_valid_and_covers_every_knob():
    from federation.sweep import expand_cells, load_sweep

    spec, base = load_sweep(CONFIGS / "tuning.yaml")
    cells = expand_cells(spec, base, "cohort-id")
    labels = {c.label: c for c in cells}
    assert len(cells) == len(labels) * len(spec.seeds)
    knobs = {"fedprox": {"mu"}, "feddyn": {"alpha", "aggregation"}, "moon": {"mu", "tau"},
             "decefl": {"graph"}, "defta": {"tolerance", "trust_decay"},
             "wpfed": {"similarity_weight", "candidates"}, "bnn-fl": {"prior_sigma"}}
    for method, names in knobs.items():
        points = [c for c in labels.values() if c.method == method]
        assert len(points) >= 2, method
        for c in points:  # the label names the point: every knob value appears in it
            for k in names:
                assert f"{k}=" in c.label or k == "aggregation", (method, c.label)  # aggregation: a word
            assert c.label.startswith(method + " ")
    assert {c.config.params["alpha"] for c in labels.values() if c.method == "feddyn"} == {0.1, 0.01, 0.001}
    assert {c.config.params["mu"] for c in labels.values() if c.method == "fedprox"} == {0.001, 0.01, 0.1, 1.0}


def test_blind_report_prints_no_test_figure():
    rows = tuning_rows([TuningRecord("fedavg lr=0.003", "fedavg", 11, 0.61, 0.737),
                        TuningRecord("fedavg lr=0.01", "fedavg", 11, 0.63, 0.818)])
    md, csv_text = tuning_markdown(rows, blind=True), tuning_csv(rows, blind=True)
    assert "test" not in md and "0.737" not in md and "0.818" not in md
    assert "| fedavg | fedavg lr=0.01 | 1 | 0.630 ± 0.000 | **yes** |" in md
    assert csv_text.splitlines() == ["method,label,n_seeds,val_auroc_mean,val_auroc_std,chosen",
                                     "fedavg,fedavg lr=0.003,1,0.61,0.0,0",
                                     "fedavg,fedavg lr=0.01,1,0.63,0.0,1"]


def test_eicu_tuning_grid_is_the_documented_protocol():
    from federation.sweep import expand_cells, load_sweep

    spec, base = load_sweep(CONFIGS / "eicu-tuning.yaml")
    cells = expand_cells(spec, base, "cohort-id")
    points = {(c.config.engine.lr, c.config.engine.local_epochs, c.config.engine.batch_size) for c in cells}
    assert points == {(lr, e, b) for lr in (0.001, 0.003, 0.01, 0.03) for e in (2, 5, 10) for b in (128, 16)}
    assert {c.method for c in cells} == {"fedavg"} and spec.seeds == [11, 22, 33] and spec.rounds == 30


def test_choice_on_the_held_out_split_of_a_tuning_cohort():
    recs = [TuningRecord("defta tolerance=0.02", "defta", 11, 0.79, 0.74),  # best val (trust read it)
            TuningRecord("defta tolerance=0.1", "defta", 11, 0.77, 0.76)]   # best on held-out train rows
    assert [r.chosen for r in tuning_rows(recs)] == [True, False]
    assert [r.chosen for r in tuning_rows(recs, choose_on="test")] == [False, True]
    with pytest.raises(ValueError, match="choose_on 'train'"):
        tuning_rows(recs, choose_on="train")

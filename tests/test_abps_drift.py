"""Welch-t drift windows (abps/drift.py), the label-flip drift scenario (federation/data/drift_scenario.py),
and both features inside an ABPS run (DP off reproduces today's run exactly)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from scipy import stats

from abps.beliefs import BetaBeliefs
from abps.drift import (
    DriftMonitor,
    DriftParams,
    WelchWindows,
    candidate_overlap,
    restart_beliefs,
    rounds_until_zero,
    welch_pvalues,
)
from abps.method import AbpsMethod
from etl.errors import InputError
from federation.core.config import build_config
from federation.data.drift_scenario import LabelFlipDrift, apply_drift, drift_centers, drifting_copy
from federation.data.synthetic import generate_fedprox_cohort
from federation.data.tensors import FederatedData
from federation.methods import get_method
from federation.run.runner import run_one

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def small() -> FederatedData:
    cohort, centers = generate_fedprox_cohort(12, seed=3, mean_size=120.0)
    return FederatedData.from_frames(cohort, centers)


def test_welch_pvalue_hand_value_and_scipy():
    """old = (1, 2, 3), new = (4, 5, 6): means 2 and 5, variances 1 and 1, t = -3 / sqrt(2/3) = -3.674,
    Welch-Satterthwaite df = 4; two-sided p = 2 * t_4.sf(3.674) = 0.02131."""
    old = torch.tensor([[1.0, 2.0, 3.0]])
    new = torch.tensor([[4.0, 5.0, 6.0]])
    p = welch_pvalues(old, new)
    assert float(p[0]) == pytest.approx(2 * stats.t.sf(3 / math.sqrt(2 / 3), 4), rel=1e-12)
    assert float(p[0]) == pytest.approx(0.02131, abs=1e-5)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 7, 4)), rng.normal(0.5, 2.0, size=(5, 7, 4))
    ref = stats.ttest_ind(a, b, equal_var=False, axis=-1).pvalue
    assert np.allclose(welch_pvalues(torch.from_numpy(a), torch.from_numpy(b)).numpy(), ref, rtol=1e-12)
    # zero variance on both sides: a certain change when the means differ, none when equal
    flat = welch_pvalues(torch.tensor([[1.0, 1.0], [0.5, 0.5]]), torch.tensor([[0.0, 0.0], [0.5, 0.5]]))
    assert flat.tolist() == [0.0, 1.0]


def test_ring_buffer_order_and_test_only_observed_pairs():
    win = WelchWindows(2, 2)
    obs = torch.tensor([[False, True], [False, False]])
    for v in (0.9, 0.8, 0.1, 0.2, 0.15):
        win.push(torch.full((2, 2), v, dtype=torch.float64), obs)
    assert win.count.tolist() == [[0, 5], [0, 0]]
    # last 4 in time order: 0.8, 0.1, 0.2, 0.15
    assert win.ordered()[0, 1].tolist() == pytest.approx([0.8, 0.1, 0.2, 0.15])
    assert win.latest()[0, 1].tolist() == pytest.approx([0.2, 0.15])
    det, pv = win.test(obs, alpha=0.5)
    assert torch.isnan(pv[0, 0]) and torch.isnan(pv[1, 0])
    ref = stats.ttest_ind([0.8, 0.1], [0.2, 0.15], equal_var=False).pvalue
    assert float(pv[0, 1]) == pytest.approx(ref, rel=1e-12)
    assert bool(det[0, 1]) == (ref < 0.5)


def test_restart_keeps_latest_window():
    """alpha = 1 + 6, beta = 1 + 2, pulls 8; latest window (0, 0.5): s = 0.5, w = 2.
    rho = 0: Beta(1.5, 2.5), pulls 2. rho = 0.5: E_a = 5.5, E_b = 0.5, E_n = 6 ->
    Beta(1 + 2.75 + 0.5, 1 + 0.25 + 1.5) = (4.25, 2.75), pulls 3 + 2 = 5."""
    for rho, want in ((0.0, (1.5, 2.5, 2.0)), (0.5, (4.25, 2.75, 5.0))):
        b = BetaBeliefs.prior(2)
        b.alpha[0, 1], b.beta[0, 1], b.pulls[0, 1] = 7.0, 3.0, 8.0
        mask = torch.tensor([[False, True], [False, False]])
        latest = torch.tensor([[[0.0, 0.0], [0.0, 0.5]], [[0.0, 0.0], [0.0, 0.0]]])
        restart_beliefs(b, mask, latest, rho)
        assert (float(b.alpha[0, 1]), float(b.beta[0, 1]), float(b.pulls[0, 1])) == pytest.approx(want)
        assert float(b.alpha[1, 0]) == 1.0 and float(b.pulls[1, 0]) == 0.0


def test_monitor_detects_a_step_and_not_noise():
    """A pair whose utility steps from 0.9 to 0.1 is detected within w rounds of the step; stationary
    noise at alpha = 0.01 triggers (almost) never; the restart moves the posterior mean below 0.5."""
    n, w = 3, 4
    mon = DriftMonitor(DriftParams(drift_window=w, drift_alpha=0.01), n)
    b = BetaBeliefs.prior(n)
    rng = np.random.default_rng(1)
    obs = ~torch.eye(n, dtype=torch.bool)
    first = None
    for t in range(40):
        mu = np.full((n, n), 0.5)
        mu[0, 1] = 0.9 if t < 20 else 0.1
        phi = torch.from_numpy(np.clip(mu + rng.normal(0, 0.05, (n, n)), 0, 1))
        b.update(phi, obs)
        flagged, m = mon.step(b, phi, obs)
        if bool(mon.detections[0, 1]) and first is None:
            first = t
            assert float(b.mean()[0, 1]) < 0.5
            assert bool(flagged[1])
    assert first is not None and 20 <= first < 20 + w
    stationary = mon.detections.clone()
    stationary[0, 1] = 0
    assert int(stationary.sum()) <= 1  # 5 stationary pairs, ~ 5 * 16 tests at level 0.01


def test_params_validation():
    with pytest.raises(ValueError, match="drift_window"):
        DriftParams(drift_window=1)
    with pytest.raises(ValueError, match="exactly one"):
        LabelFlipDrift(round=2)
    with pytest.raises(ValueError):
        LabelFlipDrift(round=0, count=1)


def test_label_flip_scenario_on_a_copy(small):
    d = LabelFlipDrift(round=3, count=2)
    c = drift_centers(small, d)
    top2 = torch.argsort(small.n_train, descending=True, stable=True)[:2]
    assert c.sum() == 2 and c[top2].all()
    cp = drifting_copy(small, d)
    y0 = cp.splits["train"].y.clone()
    assert not apply_drift(cp, d, 1)
    assert apply_drift(cp, d, 2)
    tr = cp.splits["train"]
    flipped = c[:, None] & tr.mask
    assert torch.equal(tr.y[flipped], 1 - y0[flipped]) and torch.equal(tr.y[~flipped], y0[~flipped])
    assert torch.equal(small.splits["train"].y, y0)  # the shared data is untouched
    assert torch.equal(cp.splits["test"].y, small.splits["test"].y)
    assert torch.allclose(cp.meta[c, 0], 1 - small.meta[c, 0])
    with pytest.raises(InputError, match="unknown center_id"):
        drift_centers(small, LabelFlipDrift(round=1, centers=("nope",)))


def _cfg(name: str, rounds: int, params: dict | None = None, drift: dict | None = None):
    cfg = build_config(name, get_method(name).default_config,
                       {"method": name, "params": params or {}, **({"drift": drift} if drift else {})}, rounds=rounds)
    return cfg


def test_dp_off_reproduces_and_dp_on_is_seeded(small):
    """epsilon = inf (explicit null: the run config refuses a non-finite number) gives the same history and final AUROC as today's run, bit for bit;
    a finite epsilon with the same seed repeats itself, spends (epsilon, delta) once, and changes the
    candidate sets only through the noise."""
    base = run_one(_cfg("abps-hom", 2), small, 11)
    off = run_one(_cfg("abps-hom", 2, {"metadata_dp_epsilon": None}), small, 11)
    assert base.history == off.history and base.final_auroc_mean == off.final_auroc_mean
    assert off.method_summary["dp_epsilon_spent"] == math.inf
    on1 = run_one(_cfg("abps-hom", 2, {"metadata_dp_epsilon": 1.0}), small, 11)
    on2 = run_one(_cfg("abps-hom", 2, {"metadata_dp_epsilon": 1.0}), small, 11)
    assert on1.history == on2.history
    s = on1.method_summary
    assert s["dp_epsilon_spent"] == pytest.approx(1.0, rel=1e-3) and s["dp_releases"] == small.n_centers
    assert on1.history[-1]["dp_epsilon_spent"] == pytest.approx(1.0, rel=1e-3)
    # base ABPS releases no metadata: a DP setting would do nothing, so it is refused
    with pytest.raises(ValidationError, match="metadata_dp_epsilon applies only when metadata is released"):
        run_one(_cfg("abps", 1, {"metadata_dp_epsilon": 1.0}), small, 11)
    assert "dp_epsilon_spent" not in run_one(_cfg("abps", 1, {"metadata_dp_epsilon": math.inf}), small, 11).method_summary


def test_drift_preset_runs_with_scenario(small):
    """abps-drift under a label flip of the largest center at round 2: detections are counted and the
    flipped center's new metadata is re-sent (a second release, booked in the ledger) with a goal."""
    cfg = _cfg("abps-drift", 5, {"goal": "homogeneity", "drift_window": 2, "drift_alpha": 0.2,
                                 "metadata_dp_epsilon": 2.0}, {"round": 2, "count": 1})
    res = run_one(cfg, small, 11)
    s = res.method_summary
    assert s["drift_tests_total"] > 0
    assert s["dp_releases"] >= small.n_centers
    resent = sum(h.get("metadata_resent", 0.0) for h in res.history)
    assert s["dp_releases"] == small.n_centers + resent
    # a re-send is booked in the next round's ledger record (none after the last round)
    booked = sum(h.get("metadata_resent", 0.0) for h in res.history[:-1])
    assert res.metadata_bytes == (small.n_centers + booked) * 15 * 4
    assert isinstance(get_method("abps-drift")(), AbpsMethod)


def test_scenario_refused_where_labels_are_not_stacked(small):
    from etl.errors import InputError

    cfg = build_config("centralized", get_method("centralized").default_config,
                       {"method": "centralized", "drift": {"round": 1, "count": 1}}, rounds=1)
    with pytest.raises(InputError, match="drift scenario"):
        run_one(cfg, small, 1)


def test_welch_decision_on_a_hand_window():
    """One pair, w = 3: old window (0.1, 0.2, 0.3), new window (0.4, 0.5, 0.6): means 0.2 and 0.5,
    variances 0.01 and 0.01, t = -0.3 / sqrt(0.02 / 3) = -3.674, df = 4, p = 0.02131: a change at
    alpha = 0.05, none at alpha = 0.01 (the monitor restarts only the first)."""
    p_hand = 2 * stats.t.sf(0.3 / math.sqrt(0.02 / 3), 4)
    assert p_hand == pytest.approx(0.02131, abs=1e-5)
    obs = torch.tensor([[False, True], [False, False]])
    for alpha, want in ((0.05, True), (0.01, False)):
        mon = DriftMonitor(DriftParams(drift_window=3, drift_alpha=alpha), 2)
        b = BetaBeliefs.prior(2)
        for v in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6):
            phi = torch.full((2, 2), v, dtype=torch.float64)
            b.update(phi, obs)
            flagged, m = mon.step(b, phi, obs)
        assert m["drift_tests"] == 1.0  # only the sixth observation fills both windows
        assert bool(mon.last_detected[0, 1]) is want and bool(flagged[1]) is want
        if want:  # window reset: Beta(1 + 1.5, 1 + 1.5), pulls 3
            assert (float(b.alpha[0, 1]), float(b.beta[0, 1]), float(b.pulls[0, 1])) == pytest.approx((2.5, 2.5, 3.0))
        else:  # untouched: Beta(1 + 2.1, 1 + 3.9), pulls 6
            assert (float(b.alpha[0, 1]), float(b.beta[0, 1]), float(b.pulls[0, 1])) == pytest.approx((3.1, 4.9, 6.0))


def test_level_reset_keeps_the_pull_count():
    """alpha = 7, beta = 3, pulls 8 (prior (1, 1)); latest window (0, 0.5): mean 0.25.
    level: Beta(1 + 8 * 0.25, 1 + 8 * 0.75) = (3, 7), pulls 8: the mean drops to 0.3 and the UCB radius
    of eq. (7) is unchanged (window reset: pulls 2, radius sqrt(9 / 3) = 1.73x wider)."""
    b = BetaBeliefs.prior(2)
    b.alpha[0, 1], b.beta[0, 1], b.pulls[0, 1] = 7.0, 3.0, 8.0
    before = float(b.ucb(10, 1.0)[0, 1] - b.mean()[0, 1])
    mask = torch.tensor([[False, True], [False, False]])
    latest = torch.tensor([[[0.0, 0.0], [0.0, 0.5]], [[0.0, 0.0], [0.0, 0.0]]])
    restart_beliefs(b, mask, latest, 0.0, "level")
    assert (float(b.alpha[0, 1]), float(b.beta[0, 1]), float(b.pulls[0, 1])) == pytest.approx((3.0, 7.0, 8.0))
    assert float(b.ucb(10, 1.0)[0, 1] - b.mean()[0, 1]) == pytest.approx(before)
    assert float(b.alpha[1, 0]) == 1.0
    with pytest.raises(ValueError, match="drift_reset"):
        restart_beliefs(b, mask, latest, 0.0, "prior")


def test_rounds_until_zero_and_candidate_overlap_by_hand():
    # flip at round 3: zeros at rounds 7, 8, 9 -> 4 rounds after the flip (rounds 4-5: only 2 zeros)
    assert rounds_until_zero([4, 3, 2, 0, 0, 2, 0, 0, 0, 1], 3) == 4
    assert rounds_until_zero([4, 3, 2, 1, 0, 0, 0], 3) == 2
    assert rounds_until_zero([4, 3, 2, 1, 0, 0], 3) is None
    assert rounds_until_zero([0, 0, 0, 5], 1) == 0
    exact = torch.tensor([[False, True, True], [True, False, False], [False, False, False]])
    noisy = torch.tensor([[False, True, False], [False, False, True], [False, False, False]])
    # exact 3 pairs, noisy 2, common 1, union 4
    assert candidate_overlap(exact, noisy) == {"candidate_kept_share": pytest.approx(1 / 3),
                                               "candidate_jaccard": pytest.approx(1 / 4)}
    none = torch.zeros(3, 3, dtype=torch.bool)
    assert candidate_overlap(none, none) == {"candidate_kept_share": 1.0, "candidate_jaccard": 1.0}


def test_scenario_metrics_in_a_run(small):
    """Under a drift scenario every ABPS run logs the harmful (mixed) partnerships per round and their
    totals; the run totals agree with the per-round history."""
    cfg = _cfg("abps-drift", 6, {"drift_window": 2, "drift_alpha": 0.2, "drift_reset": "level"}, {"round": 3, "count": 2})
    res = run_one(cfg, small, 11)
    s, h = res.method_summary, res.history
    flipped = drift_centers(small, LabelFlipDrift(round=3, count=2))
    assert int(flipped.sum()) == 2
    edges = [r["flipped_mixed_edges"] for r in h]
    assert s["flip_round"] == 3.0 and s["rounds_after_flip"] == 4.0
    assert s["stopped_partnering"] == float(rounds_until_zero(edges, 3) is not None)
    assert s["mixed_share_pre"] == pytest.approx(sum(r["flipped_mixed_share"] for r in h[:2]) / 2)
    assert s["detections_flipped_total"] == sum(r["drift_detections_flipped"] for r in h)
    assert s["false_alarms_total"] == sum(r["drift_false_alarms"] for r in h)
    assert all(0.0 <= r["flipped_accept_share"] <= 1.0 for r in h)
    assert "drift_detections_flipped" not in run_one(_cfg("abps", 4, {}, {"round": 3, "count": 2}), small, 11).history[0]


def test_peer_scope_pools_the_believers():
    """drift_scope = peer, w = 2: believers 0 and 2 observe peer 1 with (0.9, 0.7), (0.8, 0.8),
    (0.1, 0.3), (0.2, 0.2): pooled stream 0.8, 0.8, 0.2, 0.2. Two constant windows with different means
    are a certain change (p = 0) at round 4: one test; both believers restart from the pooled window
    (sum 0.4): Beta(1.4, 2.6), pulls 2 (the diagonal stays at the prior); the other peers are untouched."""
    n = 3
    mon = DriftMonitor(DriftParams(drift_window=2, drift_alpha=0.05, drift_scope="peer"), n)
    b = BetaBeliefs.prior(n)
    obs = torch.zeros(n, n, dtype=torch.bool)
    obs[0, 1] = obs[2, 1] = True
    tests = []
    for v0, v2 in ((0.9, 0.7), (0.8, 0.8), (0.1, 0.3), (0.2, 0.2)):
        phi = torch.zeros(n, n, dtype=torch.float64)
        phi[0, 1], phi[2, 1] = v0, v2
        b.update(phi, obs)
        flagged, m = mon.step(b, phi, obs)
        tests.append(m["drift_tests"])
    assert tests == [0.0, 0.0, 0.0, 1.0] and flagged.tolist() == [False, True, False]
    for i in (0, 1, 2):
        if i != 1:
            assert (float(b.alpha[i, 1]), float(b.beta[i, 1]), float(b.pulls[i, 1])) == pytest.approx((1.4, 2.6, 2.0))
    assert float(b.pulls[1, 1]) == 0.0 and float(b.pulls[0, 2]) == 0.0
    assert int(mon.windows.count[0, 1]) == 0  # the pooled stream restarts


def test_both_features_from_the_cli(tmp_path):
    """`abps train --param ...`: the DP release and the pooled drift windows with the level reset under a
    label flip (drift block through --config); results.json and MLflow carry the spent epsilon, the
    candidate-set overlap and the drift-scenario totals."""
    import json

    from mlflow.tracking import MlflowClient

    import cli.train_cmd  # noqa: F401  (registers `abps train`)
    from cli.app import main
    from federation.data.synthetic import write_fedprox_cohort

    cohort = write_fedprox_cohort(tmp_path / "cohort", n_centers=8, seed=2, mean_size=80.0, shared=0.8)
    cfg = tmp_path / "flip.yaml"
    cfg.write_text("method: abps-drift\ndrift:\n  round: 2\n  count: 1\n")
    out, uri = tmp_path / "results.json", f"sqlite:///{tmp_path}/ml.db"
    main(["train", "--method", "abps-drift", "--config", str(cfg), "--cohort", str(cohort), "--rounds", "3",
          "--seeds", "11", "--param", "goal=homogeneity", "--param", "metadata_dp_epsilon=2",
          "--param", "metadata_dp_delta=1e-6", "--param", "drift_scope=peer", "--param", "drift_reset=level",
          "--param", "drift_window=2", "--output", str(out), "--tracking-uri", uri, "--experiment", "cli17",
          "--no-progress"])
    doc = json.loads(out.read_text())
    s = doc["seeds"]["11"]["method_summary"]
    assert doc["config"]["params"]["drift_scope"] == "peer" and doc["config"]["params"]["drift_reset"] == "level"
    assert s["dp_epsilon_per_release"] == 2.0 and s["dp_delta"] == 1e-6
    assert s["dp_epsilon_spent"] >= 2.0 * (1 - 1e-3)  # one release per center, more after re-sends
    assert 0.0 <= s["candidate_kept_share"] <= 1.0 and s["flip_round"] == 2.0
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("cli17")
    run = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags][0]
    for key in ("dp_epsilon_spent", "candidate_kept_share", "candidate_jaccard", "mixed_share_pre",
                "stopped_partnering", "drift_tests_total"):
        assert run.data.metrics[key] == pytest.approx(s[key]), key
    assert [m.step for m in client.get_metric_history(run.info.run_id, "flipped_mixed_share")] == [1, 2, 3]


def test_drop_only_ignores_a_rise():
    """The hand window of test_welch_decision_on_a_hand_window (p = 0.0213) as a rise (0.1..0.6) and as
    a fall (0.6..0.1): with drift_direction = drop only the fall is a detection at alpha = 0.05."""
    obs = torch.tensor([[False, True], [False, False]])
    for values, want in (((0.1, 0.2, 0.3, 0.4, 0.5, 0.6), False), ((0.6, 0.5, 0.4, 0.3, 0.2, 0.1), True)):
        for scope in ("pair", "peer"):
            mon = DriftMonitor(DriftParams(drift_window=3, drift_alpha=0.05, drift_direction="drop",
                                           drift_scope=scope), 2)
            b = BetaBeliefs.prior(2)
            for v in values:
                phi = torch.full((2, 2), v, dtype=torch.float64)
                b.update(phi, obs)
                mon.step(b, phi, obs)
            assert bool(mon.last_detected[0, 1]) is want, (values, scope)


def test_privacy_and_drift_sections_from_a_tiny_sweep(tmp_path):
    """configs/privacy-study.yaml and configs/drift-study.yaml load; a tiny sweep with both kinds of
    runs gives report tables whose numbers are the runs' own summaries."""
    from federation import report as rp
    from federation.data.synthetic import write_fedprox_cohort
    from federation.sweep import SweepSpec, expand_cells, load_sweep, run_sweep

    spec, base = load_sweep(CONFIGS / "privacy-study.yaml")
    assert len(expand_cells(spec, base, "c")) == 3 * 6 * 5
    spec, base = load_sweep(CONFIGS / "drift-study.yaml")
    cells = expand_cells(spec, base, "c")
    assert len(cells) == 5 * 3 and {c.config.drift.round for c in cells} == {15}
    assert {(c.config.params["drift_scope"], c.config.params["drift_reset"]) for c in cells
            if c.method == "abps-drift"} == {("pair", "window"), ("peer", "window"), ("peer", "level")}

    cohort = write_fedprox_cohort(tmp_path / "cohort", n_centers=6, seed=3, mean_size=90.0, shared=0.8)
    uri = f"sqlite:///{tmp_path}/ml.db"
    drift = {"drift": {"round": 2, "count": 1}}
    spec = SweepSpec.model_validate({
        "name": "pd", "seeds": [1], "rounds": 3,
        # epsilon only where metadata is released (a goal): on plain ABPS it would be refused
        "methods": [{"method": "abps-hom", "label": "hom", "params": {"metadata_dp_epsilon": 1.0}},
                    {"method": "abps-hom", "label": "hom-off", "params": {"metadata_dp_epsilon": None}},
                    {"method": "abps", "label": "plain", "params": {"gamma": 0.1}, "overrides": drift},
                    {"method": "abps-drift", "label": "welch", "overrides": drift,
                     "params": {"gamma": 0.1, "drift_window": 2, "drift_alpha": 0.3, "drift_reset": "level"}}]})
    out = run_sweep(spec, CONFIGS, cohort, tracking_uri=uri, progress=False)
    assert not out.failed
    doc = rp.write_report("pd", tmp_path / "rep", uri)
    for name in ("privacy.md", "privacy.csv", "drift.md", "drift.csv", "privacy_drift.png"):
        assert (tmp_path / "rep" / name).is_file()
    summaries: dict[str, list[dict]] = {}
    for cell in out.cells:
        summaries.setdefault(cell.label, []).append(out.summaries[cell.key])
    priv = {r["epsilon"]: r for r in doc["sections"]["privacy"]["rows"]}
    assert set(priv) == {1.0, math.inf} and all(r["goal"] == "homogeneity" for r in priv.values())
    on = summaries["hom"]
    assert priv[1.0]["final_auroc_mean"] == pytest.approx(statistics.fmean(s["final_auroc_mean"] for s in on))
    assert priv[1.0]["rest_share_mean"] == pytest.approx(
        statistics.fmean(s["method_summary"]["rest_share_mean"] for s in on))
    assert priv[1.0]["candidate_kept_share"] == pytest.approx(
        statistics.fmean(s["method_summary"]["candidate_kept_share"] for s in on))
    assert priv[1.0]["dp_epsilon_spent"] == pytest.approx(1.0, rel=1e-3)
    assert priv[math.inf]["dp_epsilon_spent"] == math.inf and priv[math.inf]["candidate_kept_share"] == 1.0
    rows = {r["label"].split("[")[0]: r for r in doc["sections"]["drift"]["rows"]}
    assert set(rows) == {"plain", "welch"}  # the goal runs have no drift block
    for label, r in rows.items():
        ms = [s["method_summary"] for s in summaries[label]]
        assert r["stopped"] == sum(m["stopped_partnering"] for m in ms)
        assert r["mixed_share_pre"] == pytest.approx(statistics.fmean(m["mixed_share_pre"] for m in ms))
    welch = [r for r in doc["sections"]["drift"]["rows"] if r["label"].startswith("welch")]
    assert all(r["windows"] for r in welch) and not any(r["windows"] for r in doc["sections"]["drift"]["rows"]
                                                         if r["label"].startswith("plain"))
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Privacy-utility" in md and "Drift: a center turned harmful" in md

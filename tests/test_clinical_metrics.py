"""Batched clinical metrics against scikit-learn and hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score, brier_score_loss, roc_auc_score

import federation.core.clinical as cm


def _padded(rows: list[tuple[np.ndarray, np.ndarray]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(s) for s, _ in rows)
    s = torch.zeros(len(rows), width, dtype=torch.float64)
    y = torch.zeros(len(rows), width)
    m = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (si, yi) in enumerate(rows):
        s[i, : len(si)] = torch.as_tensor(si)
        y[i, : len(yi)] = torch.as_tensor(yi, dtype=torch.float32)
        m[i, : len(si)] = True
    return s, y, m


@pytest.fixture(scope="module")
def centers() -> list[tuple[np.ndarray, np.ndarray]]:
    """Five centers of different sizes, with rounded scores (ties) and label noise."""
    rng = np.random.default_rng(7)
    out = []
    for n in (40, 13, 77, 25, 60):
        z = rng.normal(size=n)
        y = (rng.random(n) < 1 / (1 + np.exp(-(1.5 * z - 0.5)))).astype(float)
        y[0], y[1] = 1.0, 0.0  # both classes present
        out.append((np.round(z, 1), y))
    return out


def test_auprc_equals_sklearn_with_ties(centers):
    s, y, m = _padded(centers)
    got = cm.batched_auprc(s, y, m)
    want = [average_precision_score(yi, si) for si, yi in centers]
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


def test_auprc_hand_computed_and_no_positive():
    # scores 0.9(+), 0.8(-), 0.7(+): AP = (1/2)(1/1 + 2/3) = 5/6
    s, y, m = _padded([(np.array([0.9, 0.8, 0.7]), np.array([1, 0, 1])), (np.array([0.1, 0.2]), np.array([0, 0]))])
    got = cm.batched_auprc(s, y, m)
    assert got[0].item() == pytest.approx(5 / 6, abs=1e-15)
    assert math.isnan(got[1].item())


def test_brier_equals_sklearn(centers):
    rows = [(1 / (1 + np.exp(-si)), yi) for si, yi in centers]
    p, y, m = _padded(rows)
    got = cm.batched_brier(p, y, m)
    np.testing.assert_allclose(got.numpy(), [brier_score_loss(yi, pi) for pi, yi in rows], atol=1e-12)


def test_ece_hand_computed():
    # bins of width 0.5: bin 0 holds p = 0.2, 0.4 (labels 0, 1): |0.5 - 0.3| = 0.2, weight 2/4;
    # bin 1 holds p = 0.6, 1.0 (labels 1, 1): |1 - 0.8| = 0.2, weight 2/4 -> ECE = 0.2
    p, y, m = _padded([(np.array([0.2, 0.4, 0.6, 1.0]), np.array([0, 1, 1, 1]))])
    assert cm.batched_ece(p, y, m, n_bins=2)[0].item() == pytest.approx(0.2, abs=1e-15)
    with pytest.raises(ValueError, match="lie in"):
        cm.batched_ece(p * 2, y, m)


def test_calibration_equals_unpenalized_logistic_regression(centers):
    s, y, m = _padded(centers)
    a, b = cm.batched_calibration(s, y, m)
    for i, (si, yi) in enumerate(centers):
        lr = LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(si[:, None], yi)
        assert a[i].item() == pytest.approx(lr.intercept_[0], abs=1e-5)
        assert b[i].item() == pytest.approx(lr.coef_[0, 0], abs=1e-5)


def test_calibration_of_a_calibrated_model_and_separation():
    rng = np.random.default_rng(3)
    z = rng.normal(size=20_000)
    y = (rng.random(z.size) < 1 / (1 + np.exp(-z))).astype(float)
    sep = (np.array([-2.0, -1.0, 1.0, 2.0]), np.array([0, 0, 1, 1]))  # perfectly separated: no finite fit
    s, yy, m = _padded([(z, y), sep])
    a, b = cm.batched_calibration(s, yy, m)
    assert abs(a[0].item()) < 0.05 and abs(b[0].item() - 1) < 0.05
    assert math.isnan(a[1].item()) and math.isnan(b[1].item())


def test_distribution_hand_computed():
    v = torch.tensor([0.5, 0.7, math.nan, 0.9, 0.6, 0.8, 0.55, 0.65, 0.75, 0.85, 0.95, 0.7])
    d = cm.distribution(v)
    x = np.array([0.5, 0.7, 0.9, 0.6, 0.8, 0.55, 0.65, 0.75, 0.85, 0.95, 0.7])
    assert d.n_defined == 11 and d.n_undefined == 1
    assert d.mean == pytest.approx(x.mean()) and d.median == pytest.approx(np.median(x))
    assert d.worst10 == pytest.approx(np.mean([0.5, 0.55]))  # ceil(1.1) = 2 lowest
    assert d.gini == pytest.approx(np.abs(x[:, None] - x[None, :]).sum() / (2 * 11**2 * x.mean()))
    assert cm.distribution(torch.tensor([0.1, 0.3]), higher_is_better=False).worst10 == pytest.approx(0.3)


def test_bootstrap_interval_covers_the_estimate_and_is_seeded(centers):
    s, y, m = _padded(centers)
    point = float(np.mean([roc_auc_score(yi, si) for si, yi in centers]))
    lo, hi = cm.bootstrap_mean_auroc(s, y, m, n_boot=300, seed=5)
    assert lo < point < hi and 0 <= lo and hi <= 1
    assert (lo, hi) == cm.bootstrap_mean_auroc(s, y, m, n_boot=300, seed=5)


def test_subgroup_gaps_match_sklearn_and_suppress_small_groups(centers):
    s, y, m = _padded(centers)
    rng = np.random.default_rng(1)
    groups = torch.full(s.shape, -1, dtype=torch.long)
    for i, (si, _) in enumerate(centers):
        groups[i, : len(si)] = torch.as_tensor(rng.integers(0, 2, len(si)))
    groups[0, 0] = 2  # group "tiny": one row -> suppressed
    rows = cm.subgroup_gaps(s, y, m, groups, ["F", "M", "tiny"], min_size=30, n_boot=100, seed=2)
    flat_s, flat_y, flat_g = s[m].numpy(), y[m].numpy(), groups[m].numpy()
    overall = roc_auc_score(flat_y, flat_s)
    for j, r in enumerate(rows[:2]):
        sel = flat_g == j
        assert not r.suppressed and r.n == int(sel.sum())
        assert r.auroc == pytest.approx(roc_auc_score(flat_y[sel], flat_s[sel]), abs=1e-12)
        assert r.auroc_gap == pytest.approx(r.auroc - overall, abs=1e-12)
        assert r.auroc_gap_ci[0] <= r.auroc_gap_ci[1]
    assert rows[2].suppressed and rows[2].n == 1 and math.isnan(rows[2].auroc)


def test_bootstrap_counts_equal_resorting_every_replicate_bit_for_bit(centers):
    """The bootstrap intervals, computed from draw counts along one sort (federation.core.metrics.CountedAuroc),
    equal those of the definition: every replicate's resampled rows gathered and sorted afresh
    (batched_auroc per center; batched_auroc per subgroup and overall, pooled), ties and padding
    included, to the last bit."""
    from federation.core.clinical import _resample_within_center
    from federation.core.metrics import batched_auroc

    s, y, m = _padded(centers)
    n, rows = s.shape
    rng = np.random.default_rng(4)
    groups = torch.full(s.shape, -1, dtype=torch.long)
    groups[m] = torch.as_tensor(rng.integers(-1, 3, int(m.sum())))  # -1: in no group, still in "overall"
    n_boot, seed = 60, 9
    q = torch.tensor([0.025, 0.975], dtype=torch.float64)
    means, gaps = [], {j: [] for j in range(3)}
    for idx in _resample_within_center(m, n_boot, seed):
        b = idx.shape[0]
        mb = m[None].expand(b, n, rows)
        sb = s[None].expand(b, n, rows).gather(2, idx).masked_fill(~mb, 0.0)
        yb = y[None].expand(b, n, rows).gather(2, idx).masked_fill(~mb, 0.0)
        gb = groups[None].expand(b, n, rows).gather(2, idx)
        means.append(torch.nanmean(batched_auroc(sb.reshape(-1, rows), yb.reshape(-1, rows),
                                                 mb.reshape(-1, rows)).reshape(b, n), dim=1))
        sp, yp, gp = sb[:, m], yb[:, m], gb[:, m]  # pooled real draws [b, real]
        every = batched_auroc(sp, yp, torch.ones_like(sp, dtype=torch.bool))
        for j in gaps:
            gaps[j].append(batched_auroc(sp, yp, gp == j) - every)
    want = tuple(torch.quantile(torch.cat(means), q).tolist())
    assert cm.bootstrap_mean_auroc(s, y, m, n_boot=n_boot, seed=seed) == want
    got = cm.subgroup_gaps(s, y, m, groups, ["a", "b", "c"], min_size=5, min_events=1, n_boot=n_boot, seed=seed)
    for j, r in enumerate(got):
        assert not r.suppressed
        assert r.auroc_gap_ci == tuple(torch.quantile(torch.cat(gaps[j]), q).tolist()), r.group


def test_a_calibration_fit_on_too_few_events_is_undefined():
    # two deaths among 40 stays, not separated: the fit converges (sklearn agrees), but with
    # min_events = 5 (the small-cell rule the evaluation applies per center) it is undefined
    z = np.linspace(-3.0, 3.0, 40)
    y = np.zeros(40)
    y[[5, 33]] = 1.0
    s, yy, m = _padded([(z, y)])
    a1, b1 = cm.batched_calibration(s, yy, m)
    lr = LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(z[:, None], y)
    assert b1[0].item() == pytest.approx(lr.coef_[0, 0], abs=1e-5)
    a5, b5 = cm.batched_calibration(s, yy, m, min_events=5)
    assert math.isnan(a5[0].item()) and math.isnan(b5[0].item())
    y[[10, 20, 25]] = 1.0  # five of each class: defined again, and the same fit
    s, yy, m = _padded([(z, y)])
    lr = LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(z[:, None], y)
    assert cm.batched_calibration(s, yy, m, min_events=5)[1][0].item() == pytest.approx(lr.coef_[0, 0], abs=1e-5)

"""DP metadata release (abps/privacy.py): calibration against dp_accounting, sensitivity, seeding."""

from __future__ import annotations

import math

import dp_accounting
import pytest
import torch
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from abps.privacy import (
    MetadataDpParams,
    MetadataRelease,
    composed_epsilon,
    metadata_from_sums,
    metadata_sums,
    noise_multiplier,
    sensitivity,
)


@pytest.mark.parametrize("eps,delta", [(0.5, 1e-5), (2.0, 1e-6)])
def test_noise_multiplier_matches_pld_calibration(eps, delta):
    """z from the analytic Gaussian mechanism equals what dp_accounting's generic calibration finds
    with a PLD accountant for one GaussianDpEvent, and the PLD accountant then reports (eps, delta)."""
    z = noise_multiplier(eps, delta)
    z_pld = dp_accounting.calibrate_dp_mechanism(
        pld_privacy_accountant.PLDAccountant, dp_accounting.GaussianDpEvent, eps, delta)
    assert z == pytest.approx(z_pld, rel=2e-3)
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z))
    assert acc.get_epsilon(delta) == pytest.approx(eps, rel=1e-3)


@pytest.mark.parametrize("eps", [0.1, 0.5, 0.9])
def test_sigma_within_classical_bound(eps):
    """For eps < 1 the classical Gaussian mechanism (Dwork and Roth, Thm A.1) needs
    sigma = sqrt(2 ln(1.25 / delta)) Delta / eps; the analytic calibration is never larger."""
    delta, dim = 1e-5, 15
    rel = MetadataRelease(MetadataDpParams(metadata_dp_epsilon=eps, metadata_dp_delta=delta),
                          torch.tensor([100, 200]), seed=0)
    delta2 = sensitivity(dim, max_stays=5)
    classical = math.sqrt(2 * math.log(1.25 / delta)) * delta2 / eps
    assert 0 < rel.sigma(dim) <= classical
    assert rel.sigma(dim) == pytest.approx(noise_multiplier(eps, delta) * delta2, rel=1e-12)


def test_sensitivity_hand_values():
    """Year range 2100..2220: B = 60 / 2030; 3-dim sqrt(2 + B^2), 15-dim sqrt(14 + B^2), times m stays."""
    b = 60 / 2030
    assert sensitivity(3) == pytest.approx(math.sqrt(2 + b * b), rel=1e-14)
    assert sensitivity(15) == pytest.approx(math.sqrt(14 + b * b), rel=1e-14)
    assert sensitivity(15, (2110, 2200), max_stays=5) == pytest.approx(5 * math.sqrt(14 + (45 / 2030) ** 2), rel=1e-14)
    with pytest.raises(ValueError, match="3 or 15"):
        sensitivity(4)


def test_composition_against_rdp_and_basic():
    """k releases compose to at most k * eps (basic composition) and at least eps; PLD is tighter
    than the RDP accountant."""
    z = noise_multiplier(1.0, 1e-5)
    e1, e4 = composed_epsilon(z, 1, 1e-5), composed_epsilon(z, 4, 1e-5)
    assert e1 == pytest.approx(1.0, rel=1e-3)
    assert 1.0 < e4 < 4.0
    rdp = rdp_privacy_accountant.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(z), 4)
    assert e4 <= rdp.get_epsilon(1e-5)
    assert composed_epsilon(z, 0, 1e-5) == 0.0 and composed_epsilon(0.0, 1, 1e-5) == math.inf


def test_sums_roundtrip_and_one_patient_changes():
    """Exact sums post-process back to v_i; removing one patient from a center of n = 4 (label 1,
    cci flag 1) changes the count, label and cci sums by exactly 1 each, within Delta_2."""
    meta = torch.tensor([[0.25, math.log(4), 2150 / 2030] + [0.5] + [0.0] * 11], dtype=torch.float64)
    n = torch.tensor([4])
    s = metadata_sums(meta, n)
    assert s[0, :2].tolist() == pytest.approx([1.0, 4.0])
    assert s[0, 3] == pytest.approx(2.0)
    assert metadata_from_sums(s).tolist()[0] == pytest.approx(meta.tolist()[0], abs=1e-12)
    removed = torch.tensor([[0.0, math.log(3), 2150 / 2030] + [1 / 3] + [0.0] * 11], dtype=torch.float64)
    d = metadata_sums(meta, n) - metadata_sums(removed, torch.tensor([3]))
    assert d[0, [0, 1, 3]].tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert float(d.norm()) <= sensitivity(15)


def test_off_is_identity_and_seed_fixes_noise():
    meta = torch.rand(5, 15, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    meta[:, 1] = torch.tensor([3.0, 4.0, 5.0, 6.0, 7.0])
    meta[:, 2] = 2150 / 2030
    n = meta[:, 1].exp().round()
    off = MetadataRelease(MetadataDpParams(), n, seed=11)
    assert off.release(meta) is meta and not off.enabled
    p = MetadataDpParams(metadata_dp_epsilon=1.0)
    a = MetadataRelease(p, n, seed=11).release(meta)
    b = MetadataRelease(p, n, seed=11).release(meta)
    c = MetadataRelease(p, n, seed=12).release(meta)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert ((a[:, 3:] >= 0) & (a[:, 3:] <= 1)).all()
    # larger centers: the same sum noise is a smaller share of n (prevalence noise std sigma / n)
    big = MetadataRelease(p, n * 100, seed=11).release(meta)
    assert (big[:, 3:] - meta[:, 3:]).abs().mean() < (a[:, 3:] - meta[:, 3:]).abs().mean()


def test_resend_counts_and_keeps_others():
    meta = torch.full((3, 3), 0.5, dtype=torch.float64)
    meta[:, 1] = math.log(50)
    meta[:, 2] = 2150 / 2030
    rel = MetadataRelease(MetadataDpParams(metadata_dp_epsilon=2.0), torch.full((3,), 50), seed=0)
    first = rel.release(meta)
    changed = meta.clone()
    changed[1, 0] = 0.1
    assert rel.changed(changed).tolist() == [False, True, False]
    second = rel.release(changed, rel.changed(changed))
    assert torch.equal(second[[0, 2]], first[[0, 2]]) and not torch.equal(second[1], first[1])
    assert rel.releases.tolist() == [1, 2, 1]
    s = rel.spent()
    assert s["dp_max_releases_per_center"] == 2 and s["dp_releases"] == 4
    assert s["dp_epsilon_spent"] == pytest.approx(composed_epsilon(rel.z, 2, 1e-5))


def test_params_survive_a_json_roundtrip():
    """Sweeps store the resolved params as JSON and validate them again: the default (off) must
    survive that (inf would be written as null)."""
    from abps.method import AbpsParams

    for p in (AbpsParams(), AbpsParams(metadata_dp_epsilon=0.5, drift_window=3, goal="diversity")):
        assert AbpsParams.model_validate(p.model_dump(mode="json")) == p
    assert not MetadataRelease(AbpsParams(metadata_dp_epsilon=math.inf), torch.tensor([5]), 0).enabled


def test_bad_params():
    with pytest.raises(ValueError):
        MetadataDpParams(metadata_dp_epsilon=0.0)
    with pytest.raises(ValueError, match="year_range"):
        MetadataDpParams(metadata_dp_year_range=(2200, 2100))

"""ABPS selection layer: beliefs (eqs. 6-7), Shapley credit (eqs. 4-5, 19), propose-reject with rest
(Sec. 4.3), goal-aware filter (eq. 3), and the guarantees of Theorem 2 and Lemma 1 on a stationary bandit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from abps.bandit import StationaryPeerBandit, clustered_utilities, simulate
from abps.beliefs import BetaBeliefs, max_resting_gamma, ucb_bonus
from abps.goal_filter import (
    calibrate_tau_sim,
    calibrate_tau_sim_per_center,
    candidate_mask,
    goal_scores,
    normalize_metadata,
)
from abps.matching import fedavg_mixing, propose_reject
from abps.shapley import build_coalitions, clip_phi, exact_shapley, shapley_from_utilities, shapley_matrix

F64 = torch.float64


# ---------------------------------------------------------------- beliefs (Sec. 4.2, eqs. 6-7)


def _two_updates() -> BetaBeliefs:
    b = BetaBeliefs.prior(3)
    obs = torch.zeros(3, 3, dtype=F64)
    mask = torch.zeros(3, 3, dtype=torch.bool)
    mask[0, 1] = True
    obs[0, 1] = 0.7
    b.update(obs, mask)
    obs[0, 1] = 0.4
    b.update(obs, mask)
    return b


def test_posterior_mean_and_update_by_hand():
    b = _two_updates()
    # alpha = 1 + 0.7 + 0.4 = 2.1, beta = 1 + 0.3 + 0.6 = 1.9, n = 2
    assert b.alpha[0, 1].item() == pytest.approx(2.1)
    assert b.beta[0, 1].item() == pytest.approx(1.9)
    assert b.pulls[0, 1].item() == 2.0
    assert b.mean()[0, 1].item() == pytest.approx(0.525)
    # untouched pairs stay at the prior Beta(1, 1): mean 0.5, variance 1/12
    assert b.mean()[1, 0].item() == 0.5
    assert b.variance()[1, 0].item() == pytest.approx(1.0 / 12.0)
    # variance of Beta(2.1, 1.9) = 2.1 * 1.9 / (4^2 * 5) = 0.049875
    assert b.variance()[0, 1].item() == pytest.approx(0.049875)


def test_ucb_eq7_by_hand():
    b = _two_updates()
    u = b.ucb(t=5, gamma=2.0)
    # 0.525 + 2 sqrt(2 ln 5 / 3) = 0.525 + 2 * 1.0358372 = 2.5966744
    assert u[0, 1].item() == pytest.approx(2.5966744, abs=1e-6)
    # prior pair: 0.5 + 2 sqrt(2 ln 5 / 1) = 0.5 + 2 * 1.7941226 = 4.0882452
    assert u[2, 0].item() == pytest.approx(4.0882452, abs=1e-6)
    # t = 1: log 1 = 0, no bonus; a fresh prior scores exactly tau_acc = 0.5
    assert torch.equal(b.ucb(1, 2.0), b.mean())
    assert b.ucb(1, 2.0)[1, 2].item() == 0.5


def test_update_rejects_unclipped_observation():
    b = BetaBeliefs.prior(2)
    mask = torch.tensor([[False, True], [False, False]])
    with pytest.raises(ValueError, match="clip"):
        b.update(torch.tensor([[0.0, 1.3], [0.0, 0.0]], dtype=F64), mask)
    # NaN outside the mask is ignored
    b.update(torch.tensor([[float("nan"), 0.25], [float("nan"), float("nan")]], dtype=F64), mask)
    assert b.alpha[0, 1].item() == 1.25 and b.beta[0, 1].item() == 1.75


def test_decay_toward_prior():
    b = _two_updates()
    b.decay(0.5)
    # alpha = 1 + 0.5 * 1.1 = 1.55, beta = 1 + 0.5 * 0.9 = 1.45, n = 1
    assert b.alpha[0, 1].item() == pytest.approx(1.55)
    assert b.beta[0, 1].item() == pytest.approx(1.45)
    assert b.pulls[0, 1].item() == pytest.approx(1.0)
    # invariant n = alpha + beta - alpha0 - beta0 survives the decay
    assert torch.allclose(b.pulls, b.alpha + b.beta - 2.0)
    b.decay(0.0)
    assert torch.equal(b.alpha, torch.ones(3, 3, dtype=F64)) and b.pulls.sum().item() == 0.0
    with pytest.raises(ValueError):
        b.decay(1.5)


# ---------------------------------------------------------------- Shapley (eqs. 4, 5, 19)

# 3-player game, bitmask bit0 = a, bit1 = b, bit2 = c:   {}, a, b, ab, c, ac, bc, abc
GAME3 = torch.tensor([0.60, 0.70, 0.62, 0.74, 0.55, 0.66, 0.58, 0.71], dtype=F64)


def test_exact_shapley_hand_values_and_efficiency():
    phi = exact_shapley(GAME3)
    # phi_a = 1/3 (0.10) + 1/6 (0.12) + 1/6 (0.11) + 1/3 (0.13) = 0.115, etc. (worked by hand)
    assert phi.tolist() == pytest.approx([0.115, 0.035, -0.040], abs=1e-12)
    assert phi.sum().item() == pytest.approx(GAME3[-1].item() - GAME3[0].item())  # eq. (19)
    # one player: phi = U({j}) - U({})
    assert exact_shapley(torch.tensor([0.6, 0.65], dtype=F64)).item() == pytest.approx(0.05)
    # weights of eq. (4) for m = 3: 1/3, 1/6, 1/6, 1/3 on the marginals of player 0
    assert shapley_matrix(3)[:, 0].tolist() == pytest.approx([-1 / 3, 1 / 3, -1 / 6, 1 / 6, -1 / 6, 1 / 6, -1 / 3, 1 / 3])


def test_clip_eq5():
    phi = torch.tensor([-0.2, -0.1, 0.0, 0.05, 0.115, float("nan")], dtype=F64)
    out = clip_phi(phi, -0.1, 0.1)
    assert out[:5].tolist() == pytest.approx([0.0, 0.0, 0.5, 0.75, 1.0])
    assert math.isnan(out[5].item())


def _star_utilities(plan, center, game, other=0.5):
    """Utility of each coalition row: game(frozenset of partner ids) for rows of ``center``."""
    u = torch.full((plan.num_rows,), other, dtype=F64)
    for r in range(plan.num_rows):
        if int(plan.targets[r]) == center:
            members = set(torch.nonzero(plan.mixing[r] > 0).flatten().tolist()) - {center}
            u[r] = game(frozenset(members))
    return u


def test_coalitions_exact_path_matches_hand_values():
    # center 2 has partners 0, 4, 5 (ascending ids -> players a, b, c); others have one partner each
    n = 6
    p = torch.zeros(n, n, dtype=torch.bool)
    for j in (0, 4, 5):
        p[2, j] = p[j, 2] = True
    p[1, 3] = p[3, 1] = True
    w = torch.tensor([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    plan = build_coalitions(p, weights=w)
    assert plan.num_rows == 8 + 2 * 5  # 2^3 for center 2, 2^1 for each of 0, 1, 3, 4, 5
    ids = {0: 1, 4: 2, 5: 4}
    game = lambda s: GAME3[sum(ids[j] for j in s)].item()  # noqa: E731
    res = shapley_from_utilities(plan, _star_utilities(plan, 2, game))
    assert [res.phi[2, j].item() for j in (0, 4, 5)] == pytest.approx([0.115, 0.035, -0.040], abs=1e-12)
    assert torch.equal(res.observed, p)
    assert res.u_local[2].item() == pytest.approx(0.60) and res.u_full[2].item() == pytest.approx(0.71)
    # the full coalition's row is the exchange's FedAvg row (sample-weighted): 30, 10, 50, 60 over 150
    full_rows = plan.mixing[(plan.targets == 2)][-1]
    assert torch.allclose(full_rows, fedavg_mixing(p, w)[2])
    assert full_rows.tolist() == pytest.approx([10 / 150, 0, 30 / 150, 0, 50 / 150, 60 / 150])
    # a NaN AUROC (one-class validation split) gives no observation for that center
    u = _star_utilities(plan, 2, game)
    u[plan.targets == 1] = float("nan")
    res2 = shapley_from_utilities(plan, u)
    assert not res2.observed[1].any() and res2.observed[3, 1]


def test_tmc_close_to_exact_on_seven_players():
    n = 8
    p = torch.zeros(n, n, dtype=torch.bool)
    p[0, 1:] = p[1:, 0] = True
    a = [0.05, 0.03, 0.02, -0.01, 0.04, 0.0, -0.03]

    def game(s):
        x = sum(a[j - 1] for j in s)
        return 0.6 + 0.25 * (1 - math.exp(-4 * x)) if x >= 0 else 0.6 + x

    table = torch.tensor([game(frozenset(k + 1 for k in range(7) if (m >> k) & 1)) for m in range(128)], dtype=F64)
    exact = exact_shapley(table)
    plan = build_coalitions(p, exact_max=5, num_permutations=8, rng=np.random.default_rng(0))
    assert plan.num_rows == (2 + 8 * 6) + 7 * 2
    tmc = shapley_from_utilities(plan, _star_utilities(plan, 0, game)).phi[0, 1:]
    assert (tmc - exact).abs().max().item() < 0.005  # |phi| up to 0.04
    # without truncation every permutation telescopes: efficiency holds exactly
    assert tmc.sum().item() == pytest.approx((table[-1] - table[0]).item(), abs=1e-12)
    # signs agree with the exact values wherever the exact value is clearly nonzero
    big = exact.abs() > 0.005
    assert torch.equal(torch.sign(tmc[big]), torch.sign(exact[big]))
    # truncation zeroes the marginals once a prefix is within tol of U(P_i)
    trunc = build_coalitions(p, num_permutations=8, truncation_tol=1.0, rng=np.random.default_rng(0))
    assert shapley_from_utilities(trunc, _star_utilities(trunc, 0, game)).phi[0, 1:].abs().max().item() == 0.0


def test_tmc_truncation_rule_by_hand():
    """Truncation rule (Ghorbani & Zou 2019, Algorithm 1): walking permutation b, the marginal of the
    L-th partner is U(prefix_L) - U(prefix_{L-1}), and is set to 0 once some earlier prefix (the empty
    one included) is within ``tol`` of U(P_i). Additive game on 6 partners of center 0,
    U(S) = 0.6 + sum_{k in S} w_k, w = (.04, .02, .01, .005, 0, 0): U(P_0) = 0.675. With tol = 0.012 a
    prefix is "close" once it holds 0.063 or more, i.e. once .04, .02 and one of .01 / .005 are in."""
    n = 7
    p = torch.zeros(n, n, dtype=torch.bool)
    p[0, 1:] = p[1:, 0] = True
    w = [0.04, 0.02, 0.01, 0.005, 0.0, 0.0]

    def game(s):
        return 0.6 + sum(w[j - 1] for j in s)

    plan = build_coalitions(p, exact_max=5, num_permutations=3, truncation_tol=0.012, rng=np.random.default_rng(4))
    phi = shapley_from_utilities(plan, _star_utilities(plan, 0, game)).phi[0, 1:]
    perms = plan.tmc_groups[0].perms[0].tolist()  # [B, 6] orders over partners 1..6 (indices 0..5)
    expected = [0.0] * 6
    for order in perms:  # the reference walk, one partner at a time
        total, stop = 0.0, False
        for k in order:
            if abs(0.075 - total) < 0.012:
                stop = True
            expected[k] += 0.0 if stop else w[k]
            total += w[k]
    assert phi.tolist() == pytest.approx([e / 3 for e in expected], abs=1e-12)
    # without truncation an additive game gives every partner exactly its weight, whatever the order
    plain = build_coalitions(p, exact_max=5, num_permutations=3, rng=np.random.default_rng(4))
    assert shapley_from_utilities(plain, _star_utilities(plain, 0, game)).phi[0, 1:].tolist() == pytest.approx(w)
    # some permutation must actually have been truncated, or the test would not test the rule
    assert sum(expected) < 3 * sum(w) - 1e-9


# ---------------------------------------------------------------- matching (Sec. 4.3)


def _random_ucb(n, seed, lo=0.0, hi=1.0):
    g = torch.Generator().manual_seed(seed)
    return lo + (hi - lo) * torch.rand(n, n, generator=g, dtype=F64)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kappa", [1, 3])
def test_matching_symmetric_and_capped(seed, kappa):
    n = 40
    ucb = _random_ucb(n, seed, 0.3, 0.9)
    cand = torch.rand(n, n, generator=torch.Generator().manual_seed(seed + 7)) < 0.5
    m = propose_reject(ucb, cand, kappa, 0.5, 0.1, np.random.default_rng(seed))
    assert torch.equal(m.partners, m.partners.T)
    assert not m.partners.diagonal().any()
    assert int(m.degree.max()) <= kappa
    # a partnership needs the receiver's UCB >= tau_acc: for pair (i, j) one of the two directions was
    # a proposal accepted by the other side, so at least one of ucb[i, j], ucb[j, i] clears tau_acc
    i, j = torch.nonzero(m.partners, as_tuple=True)
    assert bool(((ucb[i, j] >= 0.5) | (ucb[j, i] >= 0.5)).all())
    assert int(m.accepted.sum()) == int(m.partners.sum()) // 2
    assert 0.0 < m.acceptance_rate() <= 1.0
    # same generator state -> same matching
    m2 = propose_reject(ucb, cand, kappa, 0.5, 0.1, np.random.default_rng(seed))
    assert torch.equal(m.partners, m2.partners) and torch.equal(m.order, m2.order)


def test_everyone_rests_when_every_ucb_below_tau():
    n = 12
    ucb = _random_ucb(n, 3, 0.0, 0.49)
    cand = ~torch.eye(n, dtype=torch.bool)
    m = propose_reject(ucb, cand, 3, 0.5, 0.5, np.random.default_rng(0))
    assert m.isolation_rate() == 1.0 and int(m.partners.sum()) == 0
    # only epsilon-swapped tops were proposed to (proposer-side threshold), and all were rejected
    assert torch.equal(m.proposals, m.explored.to(torch.long)) and m.acceptance_rate() == 0.0
    # literal Algorithm 1 (receiver-only check): everybody proposes to all 11 candidates, all rejected
    lit = propose_reject(ucb, cand, 3, 0.5, 0.0, np.random.default_rng(0), proposer_check=False)
    assert lit.isolation_rate() == 1.0 and lit.proposals.tolist() == [11] * n


def test_matching_pairs_mutual_best_and_skips_rejecting_receiver():
    # 0<->1 and 2<->3 value each other (0.9); cross pairs score 0.2, except center 4 which everyone
    # ranks first (0.95) but which scores everybody 0.1 and so rejects every proposal.
    n = 5
    ucb = torch.full((n, n), 0.2, dtype=F64)
    for i, j in ((0, 1), (2, 3)):
        ucb[i, j] = ucb[j, i] = 0.9
    ucb[:, 4] = 0.95
    ucb[4, :] = 0.1
    cand = ~torch.eye(n, dtype=torch.bool)
    for seed in range(5):  # independent of the proposal order
        m = propose_reject(ucb, cand, 1, 0.5, 0.0, np.random.default_rng(seed))
        expect = torch.zeros(n, n, dtype=torch.bool)
        for i, j in ((0, 1), (2, 3)):
            expect[i, j] = expect[j, i] = True
        assert torch.equal(m.partners, expect)
        assert m.resting.tolist() == [False, False, False, False, True]
    # with the candidate filter excluding 1 from C_0 (and 0 from C_1), 0 and 1 rest
    cand[0, 1] = cand[1, 0] = False
    m = propose_reject(ucb, cand, 1, 0.5, 0.0, np.random.default_rng(0))
    assert m.resting.tolist() == [True, True, False, False, True]


def test_full_center_does_not_propose():
    # kappa 1, everyone would accept everyone: a center accepted by an earlier proposer is full and never
    # proposes, so exactly n / 2 centers propose, each ending with one partner; proposals that reach an
    # already-full receiver are rejected (|P_j| < kappa fails)
    n = 10
    ucb = torch.full((n, n), 0.9, dtype=F64)
    for seed in range(4):
        m = propose_reject(ucb, ~torch.eye(n, dtype=torch.bool), 1, 0.5, 0.0, np.random.default_rng(seed))
        assert int(m.degree.min()) == 1 and int(m.degree.max()) == 1
        proposers = m.proposals > 0
        assert int(proposers.sum()) == 5 and torch.equal(m.accepted, proposers.to(torch.long))
        assert int(m.proposals.sum()) >= 5 and m.acceptance_rate() == pytest.approx(5 / int(m.proposals.sum()))
        # the first center in the order proposes once, to a free center, and is accepted
        assert int(m.proposals[m.order[0]]) == 1



def test_deferred_acceptance_trades_up_by_hand():
    """Step 7 of abps.matching: 1 and 2 score each other 0.9; 0 ranks 1 first (0.9) and 1 finds 0 only
    acceptable (0.6 >= tau_acc 0.5). first_come pairs 0-1 whenever 0 proposes first; deferred pairs
    1-2 in every order (1 drops 0 for 2, 0 then proposes to 2, who scores it 0.55 < 0.9 and refuses).
    A center holding a partner keeps proposing to candidates it scores higher (stable-roommates form)."""
    ucb = torch.tensor([[0.0, 0.9, 0.7], [0.6, 0.0, 0.9], [0.55, 0.9, 0.0]], dtype=F64)
    cand = ~torch.eye(3, dtype=torch.bool)
    firsts = []
    for seed in range(12):
        d = propose_reject(ucb, cand, 1, 0.5, 0.0, np.random.default_rng(seed), acceptance="deferred")
        assert d.partners[1, 2] and d.resting.tolist() == [True, False, False]
        f = propose_reject(ucb, cand, 1, 0.5, 0.0, np.random.default_rng(seed))
        if int(f.order[0]) == 0:
            firsts.append(seed)
            assert f.partners[0, 1] and f.resting.tolist() == [False, False, True]
            # 0 proposes to 1 (accepted); then either 2 proposes to 1 (traded in), or 1, full with 0, proposes
            # to 2 whom it scores higher (accepted; 1 drops 0); 0 then proposes to 2 (refused)
            assert int(d.proposals[0]) == 2 and int(d.proposals.sum()) == 3 and int(d.accepted.sum()) == 1
    assert firsts  # the order started with center 0 at least once
    with pytest.raises(ValueError, match="acceptance"):
        propose_reject(ucb, cand, 1, 0.5, 0.0, np.random.default_rng(0), acceptance="best")


@pytest.mark.parametrize("seed", range(6))
def test_deferred_equals_first_come_when_scores_tie(seed):
    """With every score equal no receiver trades, so both rules give the same matching and counts;
    with random scores the deferred matching is still symmetric and capped at kappa."""
    rng = np.random.default_rng(seed)
    n = 14
    cand = torch.from_numpy(rng.random((n, n)) < 0.5)
    for kappa in (1, 2):
        tie = torch.full((n, n), 0.5, dtype=F64)
        a = propose_reject(tie, cand, kappa, 0.5, 0.3, np.random.default_rng(seed))
        b = propose_reject(tie, cand, kappa, 0.5, 0.3, np.random.default_rng(seed), acceptance="deferred")
        assert torch.equal(a.partners, b.partners) and torch.equal(a.proposals, b.proposals)
        assert torch.equal(a.accepted, b.accepted)
        m = propose_reject(torch.from_numpy(rng.random((n, n))), cand, kappa, 0.3, 0.1, np.random.default_rng(seed),
                           acceptance="deferred")
        assert torch.equal(m.partners, m.partners.T) and not bool(m.partners.diagonal().any())
        assert int(m.degree.max()) <= kappa and int(m.accepted.sum()) == int(m.partners.sum()) // 2


def test_fedavg_mixing_hand_values():
    p = torch.zeros(3, 3, dtype=torch.bool)
    p[0, 1] = p[1, 0] = p[0, 2] = p[2, 0] = True
    w = fedavg_mixing(p, torch.tensor([100.0, 300.0, 600.0]))
    assert w[0].tolist() == pytest.approx([0.1, 0.3, 0.6])
    assert w[1].tolist() == pytest.approx([0.25, 0.75, 0.0])
    assert w[2].tolist() == pytest.approx([1 / 7, 0.0, 6 / 7])
    u = fedavg_mixing(p)
    assert u[0].tolist() == pytest.approx([1 / 3] * 3) and u[1].tolist() == pytest.approx([0.5, 0.5, 0.0])
    # a resting center keeps its own model
    q = torch.zeros(3, 3, dtype=torch.bool)
    assert torch.equal(fedavg_mixing(q), torch.eye(3, dtype=F64))


# ---------------------------------------------------------------- goal-aware filter (eq. 3)

V4 = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]], dtype=F64)


def test_goal_scores_eq3_by_hand():
    r = 1 / math.sqrt(2)
    hom = goal_scores(V4, "homogeneity", normalize=False)
    assert hom[0, 1:].tolist() == pytest.approx([r, 0.0, -1.0])
    assert torch.isnan(hom.diagonal()).all()
    div = goal_scores(V4, "diversity", normalize=False)
    assert div[0, 1:].tolist() == pytest.approx([-r, 0.0, 1.0])
    ali = goal_scores(torch.tensor([[0.03, 5.0], [0.10, 6.0], [0.15, 4.0], [0.14, 7.0]], dtype=F64), "alignment")
    assert ali[0, 1:].tolist() == pytest.approx([-0.07, -0.12, -0.11])
    with pytest.raises(ValueError, match="unknown goal"):
        goal_scores(V4, "novelty")


def test_candidate_mask_keeps_top_quarter_by_goal():
    def pairs(mask):
        return {(i, j) for i, j in torch.nonzero(torch.triu(mask, 1)).tolist()}

    # 6 pairs, 25% -> ceil(1.5) = 2 pairs. cosines: 01 .71, 02 0, 03 -1, 12 .71, 13 -.71, 23 0
    hom, tau = candidate_mask(V4, "homogeneity", 0.25, normalize=False)
    assert pairs(hom) == {(0, 1), (1, 2)} and tau.tolist() == pytest.approx([1 / math.sqrt(2)] * 4)
    assert torch.equal(hom, hom.T) and not hom.diagonal().any()
    div, _ = candidate_mask(V4, "diversity", 0.25, normalize=False)
    assert pairs(div) == {(0, 3), (1, 3)}
    meta = torch.tensor([[0.03, 5.0], [0.10, 6.0], [0.15, 4.0], [0.14, 7.0]], dtype=F64)
    ali, _ = candidate_mask(meta, "alignment", 0.25)
    assert pairs(ali) == {(2, 3), (1, 3)}  # |diff| 0.01 and 0.04 are the smallest
    none, tau0 = candidate_mask(V4, None)
    assert torch.equal(none, ~torch.eye(4, dtype=torch.bool)) and tau0.tolist() == [float("-inf")] * 4


@pytest.mark.parametrize("goal", ["homogeneity", "diversity", "alignment"])
def test_candidate_mask_keeps_25_percent_of_pairs(goal):
    n = 60
    g = torch.Generator().manual_seed(5)
    meta = torch.cat([0.03 + 0.12 * torch.rand(n, 1, generator=g), 4 + 3 * torch.rand(n, 1, generator=g),
                      1.04 + 0.04 * torch.rand(n, 1, generator=g), torch.rand(n, 12, generator=g) * 0.3], dim=1)
    mask, tau = candidate_mask(meta.to(F64), goal, 0.25)
    k = math.ceil(0.25 * n * (n - 1) / 2)
    assert int(torch.triu(mask, 1).sum()) == k and int(mask.sum()) == 2 * k
    assert (tau == calibrate_tau_sim(goal_scores(meta, goal), 0.25)).all()


def test_zscore_normalization_spreads_cosines():
    x = torch.tensor([[1.0, 5.0], [2.0, 5.0], [3.0, 5.0]], dtype=F64)
    z = normalize_metadata(x)
    assert z[:, 0].tolist() == pytest.approx([-1.2247449, 0.0, 1.2247449])
    assert z[:, 1].tolist() == [0.0, 0.0, 0.0]  # constant coordinate carries no information
    # realistic base vectors (pos rate, log n_train, year/2030): raw cosines are all ~1, z-scored spread
    g = torch.Generator().manual_seed(0)
    n = 50
    meta = torch.cat([0.03 + 0.12 * torch.rand(n, 1, generator=g), 4 + 3 * torch.rand(n, 1, generator=g),
                      1.04 + 0.04 * torch.rand(n, 1, generator=g)], dim=1).to(F64)
    off = ~torch.eye(n, dtype=torch.bool)
    raw = goal_scores(meta, "homogeneity", normalize=False)[off]
    zs = goal_scores(meta, "homogeneity", normalize=True)[off]
    assert raw.min().item() > 0.99
    assert zs.min().item() < -0.5 and zs.max().item() > 0.5


# ---------------------------------------------------------------- Theorem 2 and Lemma 1 on a bandit


def test_stationary_bandit_finds_best_partners_with_sublinear_regret():
    torch.set_num_threads(1)
    mu = clustered_utilities(n_groups=4, group_size=4, within=0.8, low=0.2, high=0.6, seed=1)
    bandit = StationaryPeerBandit(mu, noise="beta")
    trace = simulate(bandit, rounds=2000, kappa=3, gamma=0.5, epsilon=lambda t: min(1.0, 1.0 / t), seed=3)
    group = torch.arange(16) // 4
    top = torch.topk(trace.counts, 3, dim=1).indices
    for i in range(16):
        assert set(top[i].tolist()) == {j for j in range(16) if group[j] == group[i] and j != i}
    r = trace.cumulative_regret()
    r500, r1000, r2000 = r[499].item(), r[999].item(), r[1999].item()
    assert r2000 < 1.5 * r1000  # far below linear growth (2x)
    assert r2000 / 2000 < 0.5 * r500 / 500  # average regret per round falls
    # late rounds are (nearly) regret free: the oracle matching of the 4-cliques is found
    assert trace.regret[-200:].mean().item() < 0.05 * trace.regret[:50].mean().item()


def test_lemma1_center_ends_up_resting_when_all_peers_harmful():
    torch.set_num_threads(1)
    n = 12
    harmful = StationaryPeerBandit(torch.full((n, n), 0.2, dtype=F64), noise="beta")
    tr = simulate(harmful, rounds=600, kappa=3, gamma=0.5, epsilon=0.1, seed=0)
    iso = tr.isolation.to(F64).mean(dim=1)
    assert iso[:20].mean().item() < 0.1  # under the prior everyone collaborates
    assert iso[-100:].mean().item() > 0.8  # then rest takes over
    assert iso[300:].mean().item() > iso[100:300].mean().item()
    helpful = StationaryPeerBandit(torch.full((n, n), 0.8, dtype=F64), noise="beta")
    tr2 = simulate(helpful, rounds=300, kappa=3, gamma=0.5, epsilon=0.1, seed=0)
    assert tr2.isolation[-100:].to(F64).mean().item() < 0.05


# V5: directions 0, 45, 90, 135 and 270 degrees (raw cosine, no z-scoring); with a = 1 / sqrt 2 the
# cosines are 01 a, 02 0, 03 -a, 04 0, 12 a, 13 0, 14 -a, 23 a, 24 -1, 34 -a (ties are exact in floats)
V5 = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [-1.0, 1.0], [0.0, -1.0]], dtype=F64)


def test_per_center_tau_sim_keeps_top_quarter_of_each_row():
    """n = 5: each center keeps ceil(0.25 * 4) = 1 peer, its most similar one (Sec. 6.5, App. C.2):
    0 -> 1 (a); 1 -> 0 and 2 tie at a (ties at the threshold are kept); 2 -> 1, 3 (a); 3 -> 2 (a);
    4 -> 0 (cos 0, its best)."""
    mask, tau = candidate_mask(V5, "homogeneity", 0.25, normalize=False, tau_mode="per_center")
    c = 1 / math.sqrt(2)
    assert tau.tolist() == pytest.approx([c, c, c, c, 0.0], abs=1e-12)
    rows = {i: set(torch.nonzero(mask[i]).flatten().tolist()) for i in range(5)}
    assert rows == {0: {1}, 1: {0, 2}, 2: {1, 3}, 3: {2}, 4: {0}}
    assert (calibrate_tau_sim_per_center(goal_scores(V5, "homogeneity", normalize=False), 0.25) == tau).all()
    # one-sided: 0 is in C_4 but 4 is not in C_0; "mutual" drops such pairs, 4 keeps no candidate
    mutual, _ = candidate_mask(V5, "homogeneity", 0.25, normalize=False, tau_mode="per_center",
                               candidacy="mutual")
    assert {i: set(torch.nonzero(mutual[i]).flatten().tolist()) for i in range(5)} == {
        0: {1}, 1: {0, 2}, 2: {1, 3}, 3: {2}, 4: set()}
    assert torch.equal(mutual, mutual.T)
    # diversity: each keeps its most dissimilar peer: 0 -> 3 (-a); 1 -> 4 (-a); 2 -> 4 (-1); 3 -> 0, 4 tie
    # (-a); 4 -> 2 (-1)
    div, _ = candidate_mask(V5, "diversity", 0.25, normalize=False, tau_mode="per_center")
    assert {i: set(torch.nonzero(div[i]).flatten().tolist()) for i in range(5)} == {
        0: {3}, 1: {4}, 2: {4}, 3: {0, 4}, 4: {2}}
    # global reading on the same data: ceil(0.25 * 10) = 3 pairs at cos a: (0,1), (1,2), (2,3); 4 has none
    glob, gt = candidate_mask(V5, "homogeneity", 0.25, normalize=False)
    assert {(i, j) for i, j in torch.nonzero(torch.triu(glob, 1)).tolist()} == {(0, 1), (1, 2), (2, 3)}
    assert not glob[4].any() and gt.tolist() == pytest.approx([c] * 5)
    with pytest.raises(ValueError, match="tau_mode"):
        candidate_mask(V5, "homogeneity", tau_mode="local")
    with pytest.raises(ValueError, match="candidacy"):
        candidate_mask(V5, "homogeneity", candidacy="receiver")


def test_per_center_every_center_keeps_its_quarter():
    n = 41
    g = torch.Generator().manual_seed(3)
    meta = torch.rand(n, 15, generator=g, dtype=F64)
    for goal in ("homogeneity", "diversity", "alignment"):
        mask, _ = candidate_mask(meta, goal, 0.25, tau_mode="per_center")
        assert mask.sum(dim=1).tolist() == [10] * n  # ceil(0.25 * 40) = 10, continuous scores: no ties
        assert not mask.diagonal().any()


def test_one_sided_candidacy_proposer_side_decides():
    """Under ``proposer`` candidacy, 4 (whose only candidate is 0) proposes to 0, and 0 accepts when its
    own UCB on 4 clears tau_acc, though 4 is not in C_0: the receiver checks only its UCB and capacity
    (Algorithm 1 line 17). Center 0's UCB on 4 below tau_acc refuses it."""
    mask, _ = candidate_mask(V5, "homogeneity", 0.25, normalize=False, tau_mode="per_center")
    assert mask[4, 0] and not mask[0, 4]
    ucb = torch.full((5, 5), 0.5, dtype=F64)
    first4 = next(s for s in range(50) if int(np.random.default_rng(s).permutation(5)[0]) == 4)
    m = propose_reject(ucb, mask, 1, 0.5, 0.0, np.random.default_rng(first4))
    assert int(m.order[0]) == 4 and m.partners[4, 0] and m.partners[0, 4]
    ucb[0, 4] = 0.4
    m = propose_reject(ucb, mask, 1, 0.5, 0.0, np.random.default_rng(first4))
    assert not m.partners[0, 4] and m.resting[4]  # refused by its only candidate: 4 rests


@pytest.mark.parametrize(
    "alpha,beta,n,t,gamma,expected",
    [
        # mu = 3/5 = 0.6; bonus = 2 sqrt(2 ln 10 / 4) = 2 * 1.0729830 = 2.1459660
        (3.0, 2.0, 3.0, 10, 2.0, 0.6 + 2.1459660),
        # gamma = sqrt 2: 0.6 + sqrt(2) * 1.0729830 = 0.6 + 1.5174271
        (3.0, 2.0, 3.0, 10, math.sqrt(2), 0.6 + 1.5174271),
        # mu = 4/11 = 0.3636364; 50 rounds, 9 pulls: sqrt(2 ln 50 / 10) = 0.8845364; gamma 0.1 -> 0.0884536
        (4.0, 7.0, 9.0, 50, 0.1, 0.3636364 + 0.0884536),
        # t = 1: no bonus whatever gamma
        (2.0, 3.0, 1.0, 1, 2.0, 0.4),
    ],
)
def test_ucb_value_by_hand_for_each_gamma_reading(alpha, beta, n, t, gamma, expected):
    b = BetaBeliefs(torch.tensor([[1.0, alpha], [1.0, 1.0]], dtype=F64), torch.tensor([[1.0, beta], [1.0, 1.0]], dtype=F64),
                    torch.tensor([[0.0, n], [0.0, 0.0]], dtype=F64))
    assert b.ucb(t, gamma)[0, 1].item() == pytest.approx(expected, abs=1e-6)
    assert float(ucb_bonus(t, n, gamma)) == pytest.approx(expected - alpha / (alpha + beta), abs=1e-6)


def test_when_ucb_can_fall_below_tau_acc():
    """Lemma 1's rest rule needs UCB < tau_acc. With the Shapley utilities near 0.5 +- 0.05 of a
    clinical federation (mu about 0.45), the paper's gamma = 2 never allows it in 50 rounds, nor
    does sqrt 2; gamma around 0.1 does once a peer has been pulled about 10 times."""
    # bound = (0.5 - 0.45) / sqrt(2 ln 50 / 50) = 0.05 / 0.3955 = 0.1264
    assert max_resting_gamma(0.45, 50, 49) == pytest.approx(0.05 / math.sqrt(2 * math.log(50) / 50), rel=1e-9)
    assert max_resting_gamma(0.45, 50, 49) == pytest.approx(0.12642, abs=1e-4)
    for gamma in (2.0, math.sqrt(2)):
        assert all(max_resting_gamma(0.45, t, t - 1) < gamma for t in range(2, 51))
    # with gamma = 2 the bonus alone is >= 0.6 up to t = 102 even for a peer pulled every round
    # (n = t - 1, the most a pair can be pulled): 2 sqrt(2 ln t / t) >= 0.6 <=> t <= 22.2 ln t
    assert all(float(ucb_bonus(t, t - 1, 2.0)) >= 0.6 for t in range(3, 103))
    assert float(ucb_bonus(103, 102, 2.0)) < 0.6
    # gamma = 0.1: after 10 pulls at t = 15 a mu = 0.40 peer is refused: 0.40 + 0.1 * 0.7035 = 0.4704 < 0.5
    assert max_resting_gamma(0.40, 15, 10) > 0.1
    # a peer believed useful can never be refused; at t = 1 any gamma works for a harmful one
    assert max_resting_gamma(0.55, 50, 10) == 0.0 and max_resting_gamma(0.3, 1, 0) == math.inf


def test_fidelity_study_choice_rule():
    """benchmarks.bench_fidelity: the distance outside the targets (diversity rests 20-60 %,
    homogeneity / alignment rest <= 5 % with E|P| >= 0.95) and the choice of the closest reading."""
    from benchmarks.bench_fidelity import choose, readings, target_distance

    def rows(div_rest, hom_rest, hom_p, ali_rest, ali_p):
        return {"diversity": {"rest": div_rest, "partners": 1 - div_rest},
                "homogeneity": {"rest": hom_rest, "partners": hom_p},
                "alignment": {"rest": ali_rest, "partners": ali_p}}

    meets = rows(0.41, 0.01, 0.99, 0.02, 0.98)
    assert target_distance(meets) == 0.0
    # diversity 2.5 % (0.175 short), homogeneity 10.4 % rest (0.054 over) with E|P| 0.896 (0.054 short)
    miss = rows(0.025, 0.104, 0.896, 0.017, 0.983)
    assert target_distance(miss) == pytest.approx(0.175 + 0.054 + 0.054)
    assert choose({"a": miss, "b": meets}) == "b"
    # tie on targets: the one closer to the paper (rest 41 %, E|P| 0.59 / 0.99 / 0.99) wins
    assert choose({"far": rows(0.25, 0.0, 0.96, 0.0, 0.96), "near": meets}) == "near"
    assert len(readings([2.0, 1.0, 0.1])) == 18  # (global | per_center x proposer, mutual) x z, raw x 3 gammas

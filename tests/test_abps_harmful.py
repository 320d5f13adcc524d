"""Harmful-center federation: label-flip transform by hand, ABPS against random-partners
(harmful partnerships, healthy AUROC), and rest by the UCB rule (Lemma 1) for a center whose every
candidate is harmful to it."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch

from abps.harmful import (
    belief_trace,
    choose_harmful,
    flip_centers,
    main,
    mean_finite,
    read_harmful,
    study_config,
    study_rows,
)
from etl.errors import InputError
from federation.data.synthetic import generate_fedprox_cohort, write_fedprox_cohort
from federation.data.tensors import FederatedData
from federation.methods.registry import METHODS
from federation.run.runner import run_one


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _federation(n: int, share: float) -> tuple[FederatedData, list[str]]:
    """n small centers sharing one logistic risk function (FedProx-Synthetic, rho = 1), a share flipped."""
    cohort, centers = generate_fedprox_cohort(n, seed=3, mean_size=300.0, alpha=0.0, beta=0.1, shared=1.0)
    harmful = choose_harmful(centers["center_id"].to_list(), share, 0)
    cohort, centers = flip_centers(cohort, centers, harmful)
    return FederatedData.from_frames(cohort, centers), harmful


def test_flip_by_hand():
    cohort = pl.DataFrame({"center_id": ["a", "a", "b", "b", "b"], "label": [1, 0, 0, 0, 1]},
                          schema={"center_id": pl.String, "label": pl.Int8})
    centers = pl.DataFrame({"center_id": ["a", "b"], "pos_rate": [0.5, 1 / 3], "meta_pos_rate": [0.5, 0.25],
                            "n_train": [2, 3]})
    c2, ce2 = flip_centers(cohort, centers, ["b"])
    assert c2["label"].to_list() == [1, 0, 1, 1, 0] and c2.schema == cohort.schema
    assert ce2["pos_rate"].to_list() == pytest.approx([0.5, 2 / 3])
    assert ce2["meta_pos_rate"].to_list() == pytest.approx([0.5, 0.75]) and ce2["n_train"].to_list() == [2, 3]
    with pytest.raises(InputError, match="unknown center_id 'z'"):
        flip_centers(cohort, centers, ["z"])
    c3, ce3 = flip_centers(cohort, centers, ["b"], metadata="kept")  # labels flipped, published rates not
    assert c3["label"].to_list() == [1, 0, 1, 1, 0] and ce3.equals(centers)
    with pytest.raises(InputError, match="--metadata 'x'"):
        flip_centers(cohort, centers, ["b"], metadata="x")
    # round(0.25 * 10) = 2 ids, same seed -> same ids, never all centers, at least one for a positive share
    ids = [f"c{i}" for i in range(10)]
    two = choose_harmful(ids, 0.25, 7)
    assert len(two) == 2 and two == choose_harmful(ids, 0.25, 7) and set(two) <= set(ids)
    assert len(choose_harmful(ids, 0.01, 0)) == 1 and choose_harmful(ids, 0.0, 0) == []
    with pytest.raises(InputError, match="share"):
        choose_harmful(ids, 1.0, 0)


def test_write_harmful_cohort_and_cli(tmp_path, capsys):
    src = write_fedprox_cohort(tmp_path / "src", n_centers=8, seed=1, mean_size=60.0)
    before = pl.read_parquet(src / "cohort.parquet")
    assert main(["--cohort", str(src), "--out", str(tmp_path / "h"), "--share", "0.25", "--seed", "4"]) == 0
    harmful = read_harmful(tmp_path / "h")
    assert len(harmful) == 2 and json.loads((tmp_path / "h" / "harmful.json").read_text())["share"] == 0.25
    after = pl.read_parquet(tmp_path / "h" / "cohort.parquet")
    flipped = before["center_id"].is_in(harmful).to_numpy()
    assert np.array_equal(after["label"].to_numpy()[flipped], 1 - before["label"].to_numpy()[flipped])
    assert np.array_equal(after["label"].to_numpy()[~flipped], before["label"].to_numpy()[~flipped])
    assert after.drop("label").equals(before.drop("label"))
    FederatedData.from_cohort(tmp_path / "h")  # a valid cohort for the runtime
    assert main(["--cohort", str(src), "--out", str(src), "--share", "0.25"]) == 2
    assert "must differ" in capsys.readouterr().err


def test_abps_avoids_harmful_partners_where_random_does_not():
    """The study's criterion at a small size: 6 centers, 2 flipped, kappa 1, 12 rounds, seeds 11 / 22 / 33,
    ABPS as in the study (gamma 0.02, deferred acceptance). On every seed, over rounds 7-12, ABPS's
    share of mixed (healthy-flipped) partnerships is at most half of random-partners' (measured 0.0,
    0.0 and 0.194 against 0.333, 0.556 and 0.667) and the healthy centers' mean test AUROC is not below
    random-partners' (0.663 / 0.698 / 0.662 against 0.635 / 0.682 / 0.629)."""
    data, harmful = _federation(6, 0.34)
    assert len(harmful) == 2
    late = slice(6, 12)
    for seed in (11, 22, 33):
        share, auroc = {}, {}
        for name in ("abps", "random-partners"):
            rows = study_rows(run_one(study_config(name, harmful, 12), data, seed).history)
            share[name] = float(np.mean([r["mixed_share"] for r in rows[late]]))
            auroc[name] = mean_finite([r["healthy_auroc"] for r in rows[late]])
        assert share["random-partners"] > 0.3
        assert share["abps"] <= 0.5 * share["random-partners"], (seed, share)
        assert auroc["abps"] >= auroc["random-partners"], (seed, auroc)


def test_center_with_only_harmful_candidates_rests_by_ucb():
    """Lemma 1 on a federation: 5 centers, 1 flipped. Every candidate of the flipped center is harmful
    to it (and it to them). Once explored, every pair it could form has a UCB below tau_acc on at
    least one side, so it rests by the rule "rest when every UCB < tau_acc", not for lack of capacity."""
    data, harmful = _federation(5, 0.2)
    h = data.center_ids.index(harmful[0])
    cfg = study_config("abps", harmful, 12)
    seen: list[tuple[bool, bool]] = []

    base = METHODS["abps"]

    class Spy(base):  # type: ignore[misc, valid-type]
        def plan_round(self, ctx, round_idx):
            plan = super().plan_round(ctx, round_idx)
            ucb = self.beliefs.ucb(round_idx + 1, self.p.gamma)
            blocked = torch.minimum(ucb[h], ucb[:, h]) < self.p.tau_acc  # own or receiver UCB < tau_acc
            blocked[h] = True
            seen.append((bool(self.last.resting[h]), bool(blocked.all())))
            return plan

    METHODS["abps-lemma1-spy"] = Spy
    try:
        res = run_one(cfg.model_copy(update={"method": "abps-lemma1-spy"}), data, 11)
    finally:
        METHODS.pop("abps-lemma1-spy")
    late = seen[6:]
    assert sum(r for r, _ in late) >= 4  # the flipped center rests in most of rounds 7-12
    assert all(b for r, b in late if r)  # and each time every possible pair is refused by a UCB
    rested = res.method_summary["rounds_rested"]
    # the flipped center rests more often than any healthy one (healthy pairs also refuse each other
    # at times: with gamma 0.05 a noisy negative Shapley value is enough)
    assert rested[harmful[0]] > max(v for k, v in rested.items() if k != harmful[0])


def test_belief_trace_by_hand():
    # centers 0 and 1 healthy, 2 flipped; this round 0 and 2 partner for the first time, 1 rests;
    # 0 and 1 met before; after the update 0 scores 1 at 0.7 and 2 at 0.45, 1 scores 0 at 0.4
    flipped = torch.tensor([False, False, True])
    observed = torch.zeros(3, 3, dtype=torch.bool)
    observed[0, 2] = observed[2, 0] = True
    phi_bar = torch.full((3, 3), float("nan"), dtype=torch.float64)
    phi_bar[0, 2], phi_bar[2, 0] = 0.1, 0.3
    pulls = torch.zeros(3, 3, dtype=torch.float64)
    pulls[0, 1] = pulls[1, 0] = 1.0
    ucb = torch.full((3, 3), 0.6, dtype=torch.float64)
    ucb[0, 1], ucb[1, 0], ucb[0, 2] = 0.7, 0.4, 0.45
    tr = belief_trace(phi_bar, observed, pulls, ucb, untried_next=0.55, flipped=flipped)
    assert tr["first_contact_mixed"] == 1.0  # both directions of the only mixed pair are first contacts
    assert tr["phi_hf"] == pytest.approx(0.1)  # what healthy 0 saw of flipped 2
    assert np.isnan(tr["phi_hh"]) and np.isnan(tr["hh_below_untried"])  # no healthy-healthy observation
    assert tr["protected"] == 0.5  # 0 holds 1 above an untried peer (0.7 > 0.55); 1 holds 0 at 0.4
    assert tr["blocked_hf"] == 1.0  # the one met (healthy, flipped) pair: 0.45 < tau_acc 0.5
    assert tr["untried_left"] == 1.0  # flipped 2 has met 0, not 1

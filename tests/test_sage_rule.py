"""The SAGE rule (arXiv:2609.23773, Sec. IV, Algorithm 1, eq. (28)) and an end-to-end run of all
eight selectors on real Fashion-MNIST."""

from __future__ import annotations

import math

import pytest
import torch

from federation.engine.image_model import FMNIST_SPEC, StackedModel
from federation.methods import sage_rule as sage
from federation.methods import selectors as sel

# --- eq. (7) --------------------------------------------------------------------------------

def test_confidence_radius_eq7_hand_values():
    # r = M sqrt(log(2 d L / delta) / (2 m)); d = 6, L = 4, delta = 0.1: log(480) = 6.17379.
    r = sage.confidence_radius(torch.tensor([16, 32, 64, 128]), 6, 4, 0.1)
    assert r.tolist() == pytest.approx([0.439239, 0.310589, 0.219619, 0.155294], abs=1e-6)
    # M scales the radius linearly; smaller delta widens it.
    assert float(sage.confidence_radius(16, 6, 4, 0.1, loss_bound=2.0)) == pytest.approx(0.878478, abs=1e-6)
    assert float(sage.confidence_radius(16, 6, 4, 0.01)) > 0.4393


# --- eq. (8) and (20) --------------------------------------------------------------------------

def test_runner_up_certificate_eq8():
    risk = torch.tensor([[0.5, 0.1, 0.6]], dtype=torch.float64)
    valid = torch.ones(1, 3, dtype=torch.bool)
    fires, j1 = sage.runner_up_certificate(risk, valid, torch.tensor([0.15]))  # gap 0.4 > 0.30
    assert fires.tolist() == [True] and j1.tolist() == [1]
    fires, _ = sage.runner_up_certificate(risk, valid, torch.tensor([0.2]))   # 0.4 > 0.40 is false
    assert fires.tolist() == [False]
    # A padded (invalid) slot with a low risk is ignored.
    fires, j1 = sage.runner_up_certificate(torch.tensor([[0.5, 0.1, 0.0]]), torch.tensor([[True, True, False]]),
                                           torch.tensor([0.15]))
    assert fires.tolist() == [True] and j1.tolist() == [1]


def test_advantage_certificate_eq19_eq20():
    risk = torch.tensor([[0.1, 0.5, 0.6]], dtype=torch.float64)
    a, j1, r_bar = sage.advantage_over_gossip(risk, torch.ones(1, 3, dtype=torch.bool))
    assert r_bar.tolist() == pytest.approx([0.4]) and a.tolist() == pytest.approx([0.3]) and j1.tolist() == [0]
    assert sage.gossip_certificate(a, torch.tensor([0.1])).tolist() == [True]
    assert sage.gossip_certificate(a, torch.tensor([0.15 + 1e-12])).tolist() == [False]


# --- eq. (22), (24) ------------------------------------------------------------------------

def test_cost_stop_eq24():
    # C_{l+1} = lambda d (m_{l+1} - m_l) = 2e-3 * 6 * 16 = 0.192.
    assert float(sage.probe_stage_cost(2e-3, 6, 32, 16)) == pytest.approx(0.192)
    stop = sage.cost_stop(2e-3, 6, 16, 32, torch.tensor([0.09, 0.10, -0.5]), torch.tensor([0.05, 0.05, 0.15]))
    # [A + 2r]_+ = 0.19 (stop), 0.20 (continue), [-0.2]_+ = 0 (stop).
    assert stop.tolist() == [True, False, True]


# --- Prop. 4 -------------------------------------------------------------------------------

def test_gossip_dominance_threshold_prop4():
    assert sage.gossip_dominance_threshold(2e-3, 6, 16) == pytest.approx(0.192)
    valid = torch.ones(2, 6, dtype=torch.bool)
    risks = torch.tensor([[0.2, 0.3, 0.4, 0.5, 0.6, 0.7],      # G = 0.45 - 0.2 = 0.25 > 0.192
                          [0.3, 0.35, 0.4, 0.45, 0.5, 0.55]])  # G = 0.425 - 0.3 = 0.125
    assert sage.gossip_dominates(risks, valid, 2e-3, 16).tolist() == [False, True]


# --- eq. (28) ------------------------------------------------------------------------------

def test_evidence_saving_eq28_hand_schedule():
    # d = (6, 4, 2), m = (16, 128, 0): 1 - 608 / (128 * 12) = 0.6041667.
    s = sage.evidence_saving(torch.tensor([16, 128, 0]), torch.tensor([6, 4, 2]), 128)
    assert s == pytest.approx(1 - 608 / 1536) and s == pytest.approx(0.6041667, abs=1e-7)


def test_truncate_schedule():
    assert sage.truncate_schedule([16, 32, 64, 128], torch.tensor([5, 16, 40, 100, 128, 900])).tolist() == \
        [0, 1, 2, 3, 4, 4]
    with pytest.raises(ValueError):
        sage.truncate_schedule([16, 16, 32], torch.tensor([100]))


# --- Algorithm 1 and its ablations on a hand-made table ------------------------------------

def _hand_table() -> sel.ProbeTable:
    # Three receivers with six candidates each (ids 10..15), schedule {16, 32, 64, 128}.
    k, d, n_l = 3, 6, 4
    risk = torch.empty(k, d, n_l, dtype=torch.float64)
    risk[0] = torch.tensor([0.0, 0.9, 0.9, 0.9, 0.9, 0.9])[:, None]   # one clearly better peer
    risk[1] = 0.5                                                     # a tied neighbourhood
    risk[2] = 0.5
    cand = torch.arange(10, 16).expand(k, d).clone()
    return sel.ProbeTable(cand, torch.ones(k, d, dtype=torch.bool), torch.full((k,), 6),
                          torch.tensor([16, 32, 64, 128]), torch.tensor([4, 4, 0]), risk,
                          torch.zeros(k, d, dtype=torch.float64))


def test_algorithm1_sage_os_hand_table():
    dec = sel.decide_anchor("sage_os", _hand_table(), 0.1, 2e-3, torch.Generator().manual_seed(0))
    # Receiver 0: A = 0.75 <= 2 r_1 = 0.878 at m = 16, cost 0.192 < 1.63 -> continue;
    #             A = 0.75 > 2 r_2 = 0.621 at m = 32 -> certified, selects peer 10.
    # Receiver 1: A = 0; at m = 64 the next stage costs 2e-3*6*64 = 0.768 >= 2 r_3 = 0.439 -> gossip.
    # Receiver 2: fewer than 16 anchors -> direct RG fallback, no evidence.
    assert dec.peers[0, 0].item() == 10
    assert dec.anchors_used.tolist() == [32, 64, 0]
    assert dec.stop_stage.tolist() == [1, 2, -1]
    assert dec.certified.tolist() == [True, False, False]
    assert dec.cost_gossip.tolist() == [False, True, False]
    assert dec.gossip.tolist() == [False, True, True]
    assert dec.no_anchor.tolist() == [False, False, True]
    assert all(10 <= p <= 15 for p in dec.peers[:, 0].tolist())
    # eq. (28): budget consumed = 6 * (32 + 64) / (128 * 18) = 0.25.
    assert 1 - sage.evidence_saving(dec.anchors_used, torch.full((3,), 6), 128) == pytest.approx(0.25)


def test_ablations_hand_table():
    g = torch.Generator().manual_seed(0)
    van = sel.decide_anchor("vanilla_sage", _hand_table(), 0.1, 2e-3, g)
    # (8): gap 0.9 > 2 r_1 = 0.878 already at m = 16; the tie never separates -> gossip at 128.
    assert van.anchors_used.tolist() == [16, 128, 0]
    assert van.certified.tolist() == [True, False, False] and van.gossip.tolist() == [False, True, True]
    assert van.cost_gossip.tolist() == [False, False, False]
    nf = sel.decide_anchor("sage_nf", _hand_table(), 0.1, 2e-3, g)
    assert nf.anchors_used.tolist() == [16, 128, 0]
    assert nf.gossip.tolist() == [False, False, True]           # commits on the unresolved tie
    assert nf.peers[1, 0].item() == 10
    aq = sel.decide_anchor("aq128", _hand_table(), 0.1, 2e-3, g)
    assert aq.anchors_used.tolist() == [128, 128, 0] and aq.peers[0, 0].item() == 10
    assert aq.certified.tolist() == [False, False, False]
    # Truncated schedule: an anchor pool of 100 -> L_k = 3, AQ-128 uses m = 64.
    t = _hand_table()
    t.n_stages = torch.tensor([3, 3, 3])
    assert sel.decide_anchor("aq128", t, 0.1, 2e-3, g).anchors_used.tolist() == [64, 64, 64]


# --- Theorem 4 (gossip safety) and Remark 1 on synthetic risk tables --------------------------

def _synthetic(true_risk: torch.Tensor, seed: int) -> sel.ProbeTable:
    k, d = true_risk.shape
    g = torch.Generator().manual_seed(seed)
    losses = torch.bernoulli(true_risk[:, :, None].expand(k, d, 128).to(torch.float64), generator=g)
    cum = losses.cumsum(-1)
    sched = torch.tensor([16, 32, 64, 128])
    risk = cum[:, :, sched - 1] / sched.to(torch.float64)
    return sel.ProbeTable(torch.arange(d).expand(k, d).clone(), torch.ones(k, d, dtype=torch.bool),
                          torch.full((k,), d), sched, torch.full((k,), 4), risk,
                          torch.zeros(k, d, dtype=torch.float64))


@pytest.mark.parametrize("kind", ["sage_os", "vanilla_sage"])
def test_gossip_safety_theorem4(kind):
    g = torch.Generator().manual_seed(1)
    k, d, delta = 4000, 6, 0.1
    true = torch.rand(k, d, generator=g, dtype=torch.float64) * torch.rand(k, 1, generator=g, dtype=torch.float64)
    table = _synthetic(true, 2)
    dec = sel.decide_anchor(kind, table, delta, 2e-3, torch.Generator().manual_seed(3))
    r_rg = true.mean(1)
    chosen = true.gather(1, dec.peers[:, :1]).squeeze(1)
    # The policy's expected risk: the certified peer's risk, or R_RG for a uniform draw (eq. (21)).
    policy = torch.where(dec.certified, chosen, r_rg)
    assert float((policy - r_rg).mean()) <= delta * 1.0
    viol = (dec.certified & (chosen > r_rg)).to(torch.float64).mean()
    assert float(viol) <= delta
    assert int(dec.certified.sum()) > 100          # the test exercises the certified branch


def test_always_commit_has_no_safety_remark1():
    # Near-tied neighbourhoods: AQ-128's empirical arg-min lands above R_RG about half the time.
    g = torch.Generator().manual_seed(4)
    k, d = 4000, 6
    true = 0.4 + 0.02 * torch.rand(k, d, generator=g, dtype=torch.float64)
    table = _synthetic(true, 5)
    r_rg = true.mean(1)
    aq = sel.decide_anchor("aq128", table, 0.1, 2e-3, torch.Generator().manual_seed(6))
    worse = (true.gather(1, aq.peers[:, :1]).squeeze(1) > r_rg).to(torch.float64).mean()
    assert float(worse) > 0.3
    os_ = sel.decide_anchor("sage_os", table, 0.1, 2e-3, torch.Generator().manual_seed(6))
    assert float(os_.gossip.to(torch.float64).mean()) > 0.99   # SAGE-OS abstains instead


# --- end to end on real Fashion-MNIST --------------------------------------------------------

def test_all_eight_selectors_end_to_end(tmp_path):
    import json

    from mlflow.tracking import MlflowClient

    from federation.images import cli_run

    torch.set_num_threads(1)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = {"benchmark": "sage", "dataset": "fmnist", "n_clients": 6, "graph": "er", "er_p": 0.5,
           "alpha_dir": 0.3, "train_samples": 3000, "test_samples": 500}
    res = cli_run(cfg, rounds=2, seeds=[0], output=str(tmp_path / "out"), tracking_uri=uri, experiment="sage-test")
    table = {row["selector"]: row for row in res["table"]}
    assert set(table) == {"LOCAL", "RG", "PENS", "PFedDST", "AQ-128", "SAGE-NF", "Vanilla SAGE", "SAGE-OS"}
    assert table["LOCAL"]["comm_oh"] == 0.0 and table["RG"]["comm_oh"] == 1.0
    for s in ("AQ-128", "SAGE-NF", "Vanilla SAGE", "SAGE-OS"):
        row = table[s]
        assert row["comm_oh"] == 1.0
        assert 0.0 < row["budget_consumed"] <= 1.0
        assert sum(row["stop_distribution"].values()) == pytest.approx(1.0)
    assert table["AQ-128"]["rg_fallback_rate"] == 0.0
    assert table["AQ-128"]["budget_consumed"] >= table["SAGE-OS"]["budget_consumed"]
    assert table["AQ-128"]["budget_consumed"] >= table["Vanilla SAGE"]["budget_consumed"]
    assert 1.0 < table["PENS"]["comm_oh"] <= 2.0 and 1.0 < table["PFedDST"]["comm_oh"] <= 2.0
    # Traffic through federation.core.ledger: omega (encoder + decoder) on each undirected edge used;
    # probe bytes = sum d m x (784 image bytes out + 10 float32 logits back).
    assert table["LOCAL"]["model_bytes"] == 0 and table["LOCAL"]["probe_bytes"] == 0
    assert table["RG"]["probe_bytes"] == 0
    omega = 4 * sum(v[0].numel() for n, v in StackedModel(FMNIST_SPEC, 1, 0).params.items()
                    if n.startswith(("encoder.", "decoder.")))
    for name in ("RG", "SAGE-OS", "PENS"):
        hist = res["runs"]["0"][{"RG": "rg", "SAGE-OS": "sage_os", "PENS": "pens"}[name]]["history"]
        assert table[name]["model_bytes"] == sum(h["edges"] for h in hist) * omega
        # each receiver takes >= 1 model; an undirected edge carries at most two of them
        assert all(6 / 2 <= h["edges"] <= h["model_exchanges"] for h in hist)
        assert table[name]["probe_bytes"] == sum(round(h.get("probe_evaluations", 0.0) * (784 + 40))
                                                 for h in hist)
    assert table["SAGE-OS"]["probe_bytes"] > 0
    for row in table.values():
        assert 0.0 <= row["global_acc"] <= 1.0 and 0.0 <= row["macro_f1"] <= 1.0
        assert row["worst_client_acc"] <= row["client_acc"]
    assert json.loads((tmp_path / "out" / "results.json").read_text())["name"] == "sage-fmnist-er-0.3"
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("sage-test")
    runs = client.search_runs([exp.experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(runs) == 9 and len(children) == 8
    os_run = next(r for r in children if r.data.tags.get("selector") == "SAGE-OS")
    hist = client.get_metric_history(os_run.info.run_id, "global_acc")
    assert [m.step for m in sorted(hist, key=lambda m: m.step)] == [1, 2]
    assert len(client.get_metric_history(os_run.info.run_id, "budget_consumed")) == 2
    assert math.isclose(sorted(hist, key=lambda m: m.step)[-1].value, table["SAGE-OS"]["global_acc"])
    # the settings the report pools runs by: every computing option, none of how it ran
    p = os_run.data.params
    assert (p["n_clients"], p["rounds"], p["er_p"], p["train_samples"], p["selector"]) == ("6", "2", "0.5", "3000",
                                                                                           "SAGE-OS")
    assert json.loads(p["pens"]) == {"top_m": 2, "discovery_fraction": 0.1} and "num_threads" not in p


def _triangle_table(ce: list[list[float]]) -> sel.ProbeTable:
    # K = 3 fully connected: receiver k's candidate slots are the two other clients in id order.
    cand = torch.tensor([[1, 2], [0, 2], [0, 1]])
    k = 3
    return sel.ProbeTable(cand, torch.ones(k, 2, dtype=torch.bool), torch.full((k,), 2),
                          torch.tensor([16, 32]), torch.tensor([2, 2, 1]),
                          torch.zeros(k, 2, 2, dtype=torch.float64), torch.tensor(ce, dtype=torch.float64))


def test_pens_choices_match_hand_computation():
    table = _triangle_table([[0.5, 0.2], [0.1, 0.9], [0.3, 0.4]])
    state = sel.PensState(torch.zeros(3, 2, dtype=torch.float64), discovery_rounds=1)
    n_train = torch.tensor([100, 200, 300])
    g = torch.Generator().manual_seed(0)
    # Discovery (top_m = 1): the lowest-CE neighbour: 0 -> 2, 1 -> 0, 2 -> 0.
    dec = sel.decide_pens(table, state, 0, 1, n_train, g)
    assert dec.peers.tolist() == [[-1, 2], [0, -1], [0, -1]]
    assert dec.anchors_used.tolist() == [32, 32, 16]          # m_{L_k}: L = (2, 2, 1)
    assert state.counts.tolist() == [[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]]
    # PENS' sample-size-weighted average of the receiver and its peer.
    W = sel.mixing_matrix(dec, 0.5, n_train, native_average=True)
    torch.testing.assert_close(W, torch.tensor([[0.25, 0.0, 0.75], [1 / 3, 2 / 3, 0.0], [0.25, 0.0, 0.75]]))
    # After discovery: neighbours selected more often than expected (1 * 1 / 2): the same peers.
    after = sel.decide_pens(table, state, 1, 1, n_train, g)
    assert after.peers.tolist() == [[-1, 2], [0, -1], [0, -1]]
    assert state.neighbours.tolist() == [[False, True], [True, False], [True, False]]


def test_pfeddst_choices_match_hand_computation():
    # S_kj = s_p (alpha s_l - s_d + c), alpha = c = 1; heads: 0 and 1 parallel, 2 orthogonal.
    table = _triangle_table([[0.7, 1.5], [0.6, 2.0], [0.9, 0.8]])
    heads = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    own = torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64)
    state = sel.PfeddstState(torch.full((3, 2), -1, dtype=torch.long))
    n_train = torch.tensor([1, 1, 1])
    # Round 0 (s_p = 1/2 everywhere): S_0 = (0.6, 0.5) -> 1; S_1 = (0.55, 0.75) -> 2; S_2 = (0.2, 0.15) -> 0.
    dec = sel.decide_pfeddst(table, state, 0, 1, heads, own, 1.0, 1.0, n_train)
    assert dec.peers.tolist() == [[1, -1], [-1, 2], [0, -1]]
    assert state.last_selected.tolist() == [[0, -1], [-1, 0], [0, -1]]
    # Round 1: the never-selected slot gains recency (s_p = 2/3): S_0 = (0.5 * 1.2, 2/3 * 1.0) -> 2.
    dec1 = sel.decide_pfeddst(table, state, 1, 1, heads, own, 1.0, 1.0, n_train)
    assert dec1.peers[0].tolist() == [-1, 2]
    # Uniform native average of the receiver and its peer.
    W = sel.mixing_matrix(dec, 0.5, None, native_average=True)
    assert W[0].tolist() == pytest.approx([0.5, 0.5, 0.0])


def test_sage_os_cumulative_stage_cost_reading():
    # Reading "cumulative": C_{l+1} = lambda d_k m_{l+1}. Receiver 1 (A = 0, d = 6) stops at m = 32:
    # 2e-3 * 6 * 64 = 0.768 >= 2 r_2 = 0.621, where the literal increment 2e-3 * 6 * 32 = 0.384 does not.
    # Receiver 0 at m = 16: 2e-3 * 6 * 32 = 0.384 < A + 2 r_1 = 0.75 + 0.878 -> continues, certified at 32.
    dec = sel.decide_anchor("sage_os", _hand_table(), 0.1, 2e-3, torch.Generator().manual_seed(0),
                            stage_cost="cumulative")
    assert dec.anchors_used.tolist() == [32, 32, 0]
    assert dec.certified.tolist() == [True, False, False]
    assert dec.cost_gossip.tolist() == [False, True, False]
    assert float(sage.cost_stop(2e-3, 6, 0, 64, torch.tensor(0.0), sage.confidence_radius(32, 6, 4, 0.1)))
    assert not float(sage.cost_stop(2e-3, 6, 32, 64, torch.tensor(0.0), sage.confidence_radius(32, 6, 4, 0.1)))
    # eq. (28): 6 * (32 + 32) / (128 * 18) = 1/6 (literal reading: 0.25, test above).
    assert 1 - sage.evidence_saving(dec.anchors_used, torch.full((3,), 6), 128) == pytest.approx(1 / 6)


# --- the selector registry ---------------------------------------------------------------------

def test_selector_registry_order_names_and_aliases():
    """One registry: the SAGE paper's table order, and every spelling the presets accept."""
    from federation.methods.registry import canonical_selector, get_selector, selector_displays, selector_names
    from federation.methods.selectors import SageConfig

    assert selector_names() == ("local", "rg", "pens", "pfeddst", "aq128", "sage_nf", "vanilla_sage", "sage_os")
    assert selector_displays() == ("LOCAL", "RG", "PENS", "PFedDST", "AQ-128", "SAGE-NF", "Vanilla SAGE", "SAGE-OS")
    spellings = {"AQ-128": "aq128", " sage-os ": "sage_os", "os": "sage_os", "NF": "sage_nf", "Vanilla": "vanilla_sage",
                 "vanilla-sage": "vanilla_sage", "Vanilla SAGE": "vanilla_sage", "PFedDST": "pfeddst", "rg": "rg"}
    assert {s: canonical_selector(s) for s in spellings} == spellings
    assert get_selector("SAGE-OS") is sel.SageOs and get_selector("sage_os").anchor_rule
    with pytest.raises(ValueError, match="unknown selector 'gossip'; known: LOCAL, RG, PENS"):
        canonical_selector("gossip")
    assert SageConfig().selectors == list(selector_names())

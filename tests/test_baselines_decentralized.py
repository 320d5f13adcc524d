"""DeceFL, DeFTA and WPFed (federation.methods.decentralized) on small FedProx-synthetic cohorts."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest
import torch

import federation.methods.decentralized as dec
from federation.core.config import build_config
from federation.core.graphs import adjacency_tensor, metropolis_weights, sparse_connected_graph
from federation.core.ledger import Ledger, undirected_edges
from federation.core.seeding import mix_seed
from federation.data.synthetic import write_fedprox_cohort
from federation.data.tensors import FederatedData
from federation.engine.mlp import AdamState, StackedEngine, exchanged_keys, head_keys, n_params
from federation.methods import Context, get_method
from federation.run.runner import run_one

torch.set_num_threads(1)
N = 12


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fedprox_cohort(tmp_path_factory.mktemp("dec") / "c", n_centers=N, seed=3, mean_size=220,
                                shared=0.8, alpha=0.2, beta=0.2)


@pytest.fixture(scope="module")
def data(cohort: Path) -> FederatedData:
    return FederatedData.from_cohort(cohort)


def make_ctx(data: FederatedData, method: str, seed: int = 11, rounds_trained: int = 1, **params: object) -> Context:
    """The runner's Context after ``rounds_trained`` rounds of local training (no exchange)."""
    cfg = build_config(method, {}, {"params": params} if params else None, 2)
    engine = StackedEngine(data, cfg.engine, seed)
    ex, hd = exchanged_keys(0), head_keys(0)
    ledger = Ledger(data.n_centers, sum(n_params(data.d, engine.hidden).values()), cfg.reference_rounds)
    ctx = Context(cfg=cfg, data=data, engine=engine, seed=seed, ledger=ledger, exchanged=ex, head=hd, bf16=False,
                  rng=torch.Generator().manual_seed(mix_seed(seed, 0x3E7)))
    params = engine.init_params()
    ctx.params = params
    state = AdamState.zeros_like(params)
    for r in range(rounds_trained):
        engine.train_round(params, state, r)
    ctx.round_start = {k: v.clone() for k, v in params.items()}
    ctx.pre_exchange = {k: v.clone() for k, v in params.items()}
    return ctx


def test_methods_registered() -> None:
    assert get_method("decefl") is dec.DeceFL
    assert get_method("DeFTA") is dec.DeFTA
    assert get_method("wpfed") is dec.WPFed


def test_decefl_plan_is_metropolis_over_fixed_graph(data: FederatedData) -> None:
    ctx = make_ctx(data, "decefl", rounds_trained=0, graph="sparse")
    m = dec.DeceFL(dec.DeceFLParams(graph="sparse"))
    m.setup(ctx)
    expected_adj = adjacency_tensor(sparse_connected_graph(N, 11), N)  # graph seed = run seed
    plan0, plan1 = m.plan_round(ctx, 0), m.plan_round(ctx, 1)
    assert torch.equal(plan0.adjacency, expected_adj) and torch.equal(plan1.adjacency, expected_adj)
    torch.testing.assert_close(plan0.w, metropolis_weights(expected_adj))
    torch.testing.assert_close(plan0.w.sum(0), torch.ones(N, dtype=torch.float64))
    assert undirected_edges(plan0.adjacency) == N
    art = m.artifacts(ctx)["graph.json"]
    assert art["edges"] == N and art["components"] == 1.0 and len(art["edge_list"]) == N
    assert {r["center_i"] for r in art["edge_list"]} <= set(data.center_ids)


def test_decefl_default_ring_mixes_each_center_with_its_two_neighbours(data: FederatedData) -> None:
    """The tuned default (graph ring, docs/baselines.md "Remaining grids"): every center has degree 2,
    so Metropolis-Hastings gives 1/3 to itself and to each neighbour, and one exchange replaces each
    center's block by the mean of centers i-1, i, i+1 (indices mod n), computed here by hand."""
    ctx = make_ctx(data, "decefl", rounds_trained=1)
    m = dec.DeceFL()  # the defaults
    m.setup(ctx)
    plan = m.plan_round(ctx, 0)
    assert undirected_edges(plan.adjacency) == N and m.artifacts(ctx)["graph.json"]["kind"] == "ring"
    x = torch.arange(N, dtype=torch.float64) ** 2
    expected = torch.stack([(x[(i - 1) % N] + x[i] + x[(i + 1) % N]) / 3 for i in range(N)])
    torch.testing.assert_close(plan.w @ x, expected)


def test_consensus_distance_hand_computed() -> None:
    p = {"w": torch.tensor([[0.0, 0.0], [2.0, 4.0]]), "b": torch.tensor([[1.0], [3.0]])}
    # mean w = (1, 2), mean b = 2: each center is sqrt(1 + 4 + 1) away -> (6 + 6) / 2
    assert dec.consensus_distance(p, ("w", "b")) == pytest.approx(6.0)


def test_defta_base_weights_are_degree_corrected_sample_counts() -> None:
    adj = adjacency_tensor(sparse_connected_graph(3, 0), 3)  # triangle: every degree 2
    n_train = torch.tensor([30, 60, 90])
    a = dec.defta_base_weights(adj, n_train)
    torch.testing.assert_close(a, torch.tensor([[10.0, 20.0, 30.0]] * 3, dtype=torch.float64))
    # a sender's total weight over its receivers (itself included) is its sample count
    path = adjacency_tensor(nx.path_graph(3), 3)
    b = dec.defta_base_weights(path, n_train)
    torch.testing.assert_close(b.sum(0), n_train.double())


def test_trust_evidence_values() -> None:
    e = dec.trust_evidence(torch.tensor([0.80, 0.75, 0.70, 0.60, float("nan")]), torch.full((5,), 0.80), 0.1)
    torch.testing.assert_close(e[:4], torch.tensor([1.0, 0.5, 0.0, 0.0], dtype=torch.float64))
    assert torch.isnan(e[4])


def test_defta_trust_drops_for_poisoned_neighbour(data: FederatedData) -> None:
    ctx = make_ctx(data, "defta", rounds_trained=3)
    m = dec.DeFTA(dec.DeftaParams())
    m.setup(ctx)
    # the most connected center j and the neighbours that receive j's model
    deg = m.adj.sum(1)
    j = int(deg.argmax())
    receivers = m.adj[:, j].nonzero().flatten()
    assert receivers.numel() >= 2
    g = torch.Generator().manual_seed(0)
    for k in ctx.pre_exchange:
        ctx.pre_exchange[k][j] = 50.0 * torch.randn(ctx.pre_exchange[k][j].shape, generator=g)
    own = ctx.evaluate_mixtures(torch.eye(N, dtype=torch.float64), torch.arange(N))
    plan = m.plan_round(ctx, 0)
    ok = ~torch.isnan(own[receivers])
    assert int(ok.sum()) >= 1
    r_ok = receivers[ok]
    # a noise model scores about 0.5 AUROC on a receiver's validation split
    noise_auc = ctx.evaluate_mixtures(torch.nn.functional.one_hot(torch.full((r_ok.numel(),), j), N).double(), r_ok)
    hurt = noise_auc <= own[r_ok] - m.p.tolerance
    assert bool(hurt.any())
    for i in r_ok[hurt].tolist():
        assert plan.w[i, j].item() == 0.0  # the poisoned model gets no weight
        assert m.trust[i, j].item() == pytest.approx(m.p.trust_decay)  # 1 -> lambda * 1 + (1 - lambda) * 0
    # the poisoned center's trust is the lowest trust its receivers hold after two more rounds
    m.plan_round(ctx, 1)
    m.plan_round(ctx, 2)
    for i in r_ok[hurt].tolist():
        assert m.trust[i, j].item() == pytest.approx(m.p.trust_decay**3)
        nb = m.adj[i].nonzero().flatten()
        assert m.trust[i, j] == m.trust[i, nb].min()
    torch.testing.assert_close(plan.w.sum(1), torch.ones(N, dtype=torch.float64))
    assert bool(((plan.w > 0) <= (m.adj | torch.eye(N, dtype=torch.bool))).all())


def test_defta_default_round_weights_by_hand(data: FederatedData) -> None:
    """The tuned defaults (tolerance 0.1, trust_decay 0.9; docs/baselines.md "DeFTA tuned on held-out
    train rows") in round 0 on trained models, recomputed by hand from the receivers' validation
    AUROCs: a neighbour whose model is 0.1 AUROC or more below the receiver's own gets weight 0; every
    other neighbour gets a_ij * T_ij with T_ij = 0.9 + 0.1 * clip(1 + (u_ij - u_ii) / 0.1, 0, 1)."""
    ctx = make_ctx(data, "defta", rounds_trained=2)
    m = dec.DeFTA()
    m.setup(ctx)
    plan = m.plan_round(ctx, 0)
    recv, send = m.recv, m.send
    own = ctx.evaluate_mixtures(torch.eye(N, dtype=torch.float64), torch.arange(N))
    u_nb = ctx.evaluate_mixtures(torch.nn.functional.one_hot(send, N).double(), recv)
    w = torch.diag(torch.diagonal(m.base)).clone()
    dropped = 0
    for e_idx, (i, j) in enumerate(zip(recv.tolist(), send.tolist())):
        gap = float(u_nb[e_idx] - own[i])
        if gap != gap:  # NaN: one-class split, no evidence, trust stays 1
            w[i, j] = m.base[i, j]
        elif gap <= -0.1:
            dropped += 1
        else:
            w[i, j] = m.base[i, j] * (0.9 + 0.1 * min(1.0, 1.0 + gap / 0.1))
    w = w / w.sum(1, keepdim=True)
    torch.testing.assert_close(plan.w, w)
    assert dropped >= 1 and dropped == round(m._dropped * recv.numel())  # the tolerance bites here


def test_lsh_filter_keeps_similar_drops_dissimilar() -> None:
    g = torch.Generator().manual_seed(1)
    d = 200
    v = torch.randn(d, generator=g)
    emb = torch.stack([
        v,                                              # 0: the querying center
        v + 0.1 * torch.randn(d, generator=g),          # 1: near-identical model
        v + 0.3 * torch.randn(d, generator=g),          # 2: similar model
        torch.randn(d, generator=g),                    # 3: unrelated (about 90 degrees)
        -v + 0.1 * torch.randn(d, generator=g),         # 4: opposite
    ])
    planes = torch.randn(d, 256, generator=g, dtype=torch.float64)
    codes = dec.simhash_codes(emb, planes)
    sim = dec.hamming_similarity(codes)
    # SimHash: E[sim] = 1 - angle / pi
    cos = torch.nn.functional.cosine_similarity(emb[0:1], emb, dim=1).double()
    expected = 1.0 - torch.arccos(cos.clamp(-1, 1)) / torch.pi
    assert float((sim[0] - expected).abs().max()) < 0.1
    cand = dec.lsh_candidates(sim, n_candidates=3, min_similarity=0.75)
    assert cand[0].tolist() == [False, True, True, False, False]
    assert cand.diagonal().sum() == 0
    # hamming similarity is exact on hand-made codes
    c = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 1]], dtype=torch.bool)
    torch.testing.assert_close(dec.hamming_similarity(c)[0], torch.tensor([1.0, 0.75, 0.0], dtype=torch.float64))


def test_select_one_edge_each_resolves_mutual_picks() -> None:
    inf = float("-inf")
    s = torch.tensor([
        [0.0, 0.9, 0.5, 0.1],
        [0.9, 0.0, 0.8, 0.2],   # 0 and 1 pick each other: 1 (larger index) moves to 2
        [0.3, 0.7, 0.0, 0.6],   # 2 picks 1; 1 now picks 2: mutual, 2 moves to 3
        [0.4, inf, 0.2, 0.0],
    ], dtype=torch.float64)
    pick = dec.select_one_edge_each(s)
    assert pick.tolist() == [1, 2, 3, 0]
    edges = {frozenset((i, int(j))) for i, j in enumerate(pick.tolist())}
    assert len(edges) == 4


def test_wpfed_round_has_n_edges_and_valid_weights(data: FederatedData) -> None:
    ctx = make_ctx(data, "wpfed", rounds_trained=1)
    m = dec.WPFed(dec.WpfedParams())
    m.setup(ctx)
    for r in range(3):
        plan = m.plan_round(ctx, r)
        assert undirected_edges(plan.adjacency) == N
        torch.testing.assert_close(plan.w.sum(1), torch.ones(N, dtype=torch.float64))
        assert bool(((plan.w > 0) == (plan.adjacency | torch.eye(N, dtype=torch.bool))).all())
        assert plan.metadata_bytes == N * 8 + 8 * 2 * N  # codes (64 bits) + one report per direction
    assert bool((m.quality != 0.5).any())  # peer reports moved the quality scores
    probe = dec.WPFed(dec.WpfedParams(embedding="probe", probe_rows=16))
    probe.setup(ctx)
    assert undirected_edges(probe.plan_round(ctx, 0).adjacency) == N


def test_wpfed_default_weights_by_hand(data: FederatedData) -> None:
    """The tuned default lambda = 0.25 (docs/baselines.md "Remaining grids") in round 1, after the
    peer reports of round 0 moved the quality scores q: on each picked edge
    W_ij / W_ii = (0.25 sim_ij + 0.75 q_j) / (0.25 + 0.75 q_i), with sim_ij the Hamming similarity
    of the centers' SimHash codes (omega_ii = lambda + (1 - lambda) q_i)."""
    ctx = make_ctx(data, "wpfed", rounds_trained=1)
    m = dec.WPFed()
    m.setup(ctx)
    sim = dec.hamming_similarity(dec.simhash_codes(m.embedding(ctx), m.planes))
    m.plan_round(ctx, 0)
    q = m.quality.clone()
    plan = m.plan_round(ctx, 1)
    i, j = plan.adjacency.nonzero(as_tuple=True)
    ratio = plan.w[i, j] / plan.w[i, i]
    torch.testing.assert_close(ratio, (0.25 * sim[i, j] + 0.75 * q[j]) / (0.25 + 0.75 * q[i]))
    # the ratio depends on lambda: it is not 1 where the two centers' quality scores differ
    assert float((ratio - 1.0).abs().max()) > 1e-3


@pytest.mark.parametrize("method", ["decefl", "defta", "wpfed"])
def test_bandwidth_matches_ledger_arithmetic(data: FederatedData, method: str) -> None:
    # R_ref = rounds: after R_ref rounds a method with n model-carrying edges per round is at 1.00x
    cfg = build_config(method, {}, {"reference_rounds": 2}, 2)
    res = run_one(cfg, data, seed=11)
    payload = sum(n_params(data.d, (128, 64)).values())
    for h in res.history:
        assert h["edges"] == N
        assert h["round_bytes"] == N * payload * 4
    assert res.rel_bandwidth == pytest.approx(1.0, abs=1e-12)
    assert res.model_bytes == 2 * N * payload * 4


def test_fifty_rounds_cost_exactly_fedavg(data: FederatedData) -> None:
    # the three plans over 50 rounds (no training needed for the byte count): 1.00x
    payload = sum(n_params(data.d, (128, 64)).values())
    for cls in (dec.DeceFL, dec.DeFTA, dec.WPFed):
        ctx = make_ctx(data, cls.name, rounds_trained=0)
        m = cls()
        m.setup(ctx)
        for r in range(50):
            plan = m.plan_round(ctx, r)
            ctx.ledger.record(r, plan.adjacency, plan.server_links, payload, 4, plan.probe_bytes,
                              plan.metadata_bytes)
        assert ctx.ledger.relative_bandwidth == pytest.approx(1.0, abs=1e-12), cls.name


def test_same_seed_same_result(data: FederatedData) -> None:
    cfg = build_config("defta", {}, None, 2)
    a, b = run_one(cfg, data, 5), run_one(cfg, data, 5)
    assert a.final_auroc_mean == b.final_auroc_mean and a.history == b.history


def test_cli_train_end_to_end(cohort: Path, tmp_path: Path) -> None:
    from cli.app import main

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    for method in ("decefl", "defta", "wpfed"):
        out = tmp_path / f"{method}.json"
        main(["train", "--method", method, "--cohort", str(cohort), "--rounds", "2", "--seeds", "11",
              "--output", str(out), "--tracking-uri", uri, "--no-progress",
              "--config", str(Path(__file__).resolve().parents[1] / "configs" / f"{method}.yaml")])
        doc = json.loads(out.read_text())
        assert doc["method"] == method and doc["seeds"]["11"]["rounds_run"] == 2
        assert doc["seeds"]["11"]["rel_bandwidth"] == pytest.approx(2 / 50)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(cohort.resolve().name)  # the default experiment: the cohort's folder
    runs = client.search_runs([exp.experiment_id], "tags.method = 'wpfed' and tags.`abps.kind` = 'run'")
    assert runs and runs[0].data.metrics["rel_bandwidth"] == pytest.approx(2 / 50)
    assert "quality_mean" in runs[0].data.metrics
    (decefl_run,) = client.search_runs([exp.experiment_id], "tags.method = 'decefl' and tags.`abps.kind` = 'run'")
    names = {a.path for a in client.list_artifacts(decefl_run.info.run_id)}
    assert "graph.json" in names
    graph = json.loads(Path(client.download_artifacts(decefl_run.info.run_id, "graph.json", str(tmp_path))).read_text())
    assert graph["edges"] == N and len(graph["edge_list"]) == N


def test_wpfed_refuses_an_undefined_mixing_row() -> None:
    """similarity_weight = 0 and quality_prior = 0: omega = 0 everywhere and W_ii = 0 in round 1."""
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="0/0 mixing row"):
        dec.WpfedParams(similarity_weight=0.0, quality_prior=0.0)
    assert dec.WpfedParams(similarity_weight=0.0, quality_prior=0.1).quality_prior == 0.1
    assert dec.WpfedParams(similarity_weight=0.2, quality_prior=0.0).similarity_weight == 0.2

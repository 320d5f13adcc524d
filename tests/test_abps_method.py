"""ABPS as a runtime method: presets, ledger arithmetic of Table 1, Shapley credit consistent with the
exchange, one batched coalition evaluation per round, isolation under the diversity goal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from abps.method import PRESETS, AbpsMethod, AbpsParams
from etl.errors import InputError
from federation.core.config import build_config, load_yaml
from federation.core.ledger import Ledger
from federation.core.metrics import batched_auroc
from federation.data.synthetic import generate_fedprox_cohort
from federation.data.tensors import FederatedData
from federation.engine.mixing import mix_params
from federation.engine.mlp import StackedEngine, exchanged_keys, head_keys, n_params
from federation.methods import Context, get_method
from federation.run.runner import run_one

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _data(n: int, seed: int = 0) -> FederatedData:
    cohort, centers = generate_fedprox_cohort(n, seed=seed, mean_size=200.0)
    return FederatedData.from_frames(cohort, centers)


@pytest.fixture(scope="module")
def four() -> FederatedData:
    return _data(4)


@pytest.fixture(scope="module")
def small() -> FederatedData:
    return _data(24, seed=1)


def _ctx(data: FederatedData, cfg) -> Context:
    """A Context on freshly initialized parameters (no training)."""
    engine = StackedEngine(data, cfg.engine, 5)
    params = engine.init_params()
    ex, hd = exchanged_keys(cfg.exchange.head_layers), head_keys(cfg.exchange.head_layers)
    return Context(cfg=cfg, data=data, engine=engine, seed=5, ledger=Ledger(data.n_centers, 1), exchanged=ex,
                   head=hd, bf16=cfg.exchange.bf16_wire, params=params,
                   round_start={k: v.clone() for k, v in params.items()},
                   pre_exchange={k: v.clone() for k, v in params.items()})


def _run_spy(spy: type, cfg, data: FederatedData, seed: int):
    """run_one with ``spy`` (a subclass of a registered method) registered under a temporary name."""
    from federation.methods.registry import METHODS

    METHODS["abps-spy-test"] = spy
    try:
        return run_one(cfg.model_copy(update={"method": "abps-spy-test"}), data, seed)
    finally:
        METHODS.pop("abps-spy-test")


def _cfg(name: str, rounds: int):
    return build_config(name, get_method(name).default_config, None, rounds=rounds)


def test_presets_registered_with_table1_settings():
    for name in ("abps", "abps+p", "abps+q", "abps+p+q+k1", "abps-hom", "abps-div", "abps-align", "abps-x"):
        assert get_method(name) is PRESETS[name] and issubclass(PRESETS[name], AbpsMethod)
    base = AbpsParams.model_validate(_cfg("abps", 1).params)
    assert (base.kappa, base.epsilon, base.gamma, base.tau_acc, base.goal, base.metadata_dim) == (3, 0.1, 2.0, 0.5, None, 3)
    div = _cfg("abps-div", 1)
    assert (div.exchange.head_layers, div.exchange.bf16_wire) == (1, True)
    assert AbpsParams.model_validate(div.params).goal == "diversity"
    assert AbpsParams.model_validate(div.params).metadata_dim == 15
    x = _cfg("abps-x", 100)
    assert (x.exchange.head_layers, x.exchange.bf16_wire, x.exchange.server_momentum) == (2, True, 0.5)
    assert (x.early_stopping.enabled, x.early_stopping.patience, x.max_rounds) == (True, 10, 100)
    px = AbpsParams.model_validate(x.params)
    assert (px.kappa, px.goal, px.metadata_dim) == (1, "homogeneity", 15)
    # `--goal diversity` on the base preset: the goal switches the filter to the 15-dim vector
    assert AbpsParams(goal="diversity").metadata_dim == 15


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("abps*.yaml")), ids=lambda p: p.name)
def test_yaml_presets_equal_registered_presets(path):
    doc = load_yaml(path)
    name = doc["method"]
    from_file = build_config(name, get_method(name).default_config, doc)
    plain = build_config(name, get_method(name).default_config, None)
    file_params = AbpsParams.model_validate(from_file.params)
    assert file_params == AbpsParams.model_validate(plain.params)
    assert from_file.exchange == plain.exchange and from_file.early_stopping == plain.early_stopping


def test_bandwidth_matches_ledger_arithmetic(four):
    """n = 4: at kappa 3 every center holds all 3 peers (K4, 6 edges = 1.5 n); at kappa 1 a perfect
    matching (2 edges). Per round, relative to FedAvg's n full fp32 payloads:
    abps 1.5, abps+q 0.75, abps+p 1.5 x trunk share, abps+p+q+k1 0.25 x trunk share."""
    sizes = n_params(four.d, (128, 64))
    full = sum(sizes.values())
    trunk1 = sum(sizes[k] for k in exchanged_keys(1))
    trunk2 = sum(sizes[k] for k in exchanged_keys(2))
    fedavg_round = run_one(_cfg("fedavg", 2), four, 11).history[0]["round_bytes"]
    assert fedavg_round == 4 * full * 4
    expect = {
        "abps": 1.5,
        "abps+q": 0.75,
        "abps+p": 1.5 * trunk1 / full,
        "abps+p+q+k1": 0.25 * trunk1 / full,
    }
    for name, ratio in expect.items():
        res = run_one(_cfg(name, 2), four, 11)
        for h in res.history:
            assert h["round_bytes"] / fedavg_round == pytest.approx(ratio, rel=1e-12), name
        assert res.history[0]["isolation_rate"] == 0.0
    # abps-x: 2-layer head, bf16, kappa 1 -> at most 2 edges of the w1/b1 trunk at 2 bytes
    res = run_one(_cfg("abps-x", 2), four, 11)
    for h in res.history:
        assert h["round_bytes"] == h["partnerships"] * trunk2 * 2
        assert h["edges"] == h["partnerships"] <= 2
    # goal presets keep 25 % of the 6 pairs (2 pairs): never more than 2 edges; metadata sent once
    res = run_one(_cfg("abps-div", 2), four, 11)
    for h in res.history:
        assert h["round_bytes"] == h["partnerships"] * trunk1 * 2 and h["partnerships"] <= 2
    assert res.metadata_bytes == 4 * 15 * 4


@pytest.mark.parametrize("name", ["abps", "abps+p+q+k1", "abps-x"])
def test_shapley_coalitions_consistent_with_exchange(small, name, monkeypatch):
    """U_i(P_i) from the batched coalition evaluation equals the AUROC of the model the exchange
    builds (W row i over the exchanged block, own head, bf16 wire); U_i(empty) equals the local model's;
    Shapley efficiency (eq. 19) holds per center; evaluate_mixtures is called once."""
    cfg = _cfg(name, 1)
    engine = StackedEngine(small, cfg.engine, 5)
    params = engine.init_params()
    g = torch.Generator().manual_seed(3)
    params = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in params.items()}  # centers differ
    ex, hd = exchanged_keys(cfg.exchange.head_layers), head_keys(cfg.exchange.head_layers)
    ctx = Context(cfg=cfg, data=small, engine=engine, seed=5, ledger=Ledger(small.n_centers, 1), exchanged=ex,
                  head=hd, bf16=cfg.exchange.bf16_wire, params=params,
                  round_start={k: v.clone() for k, v in params.items()},
                  pre_exchange={k: v.clone() for k, v in params.items()})
    cls = get_method(name)
    method = cls(cls.Params.model_validate(cfg.params))
    method.setup(ctx)
    plan = method.plan_round(ctx, 0)
    calls = []
    orig = Context.evaluate_mixtures
    monkeypatch.setattr(Context, "evaluate_mixtures", lambda self, *a, **k: calls.append(1) or orig(self, *a, **k))
    extras = method.after_exchange(ctx, 0, plan)
    assert len(calls) == 1
    val = small.splits["val"]
    mixed = {**params, **mix_params(plan.w, params, ex, ctx.bf16)}
    auroc_mixed = batched_auroc(engine.predict(mixed, "val"), val.y, val.mask)
    auroc_local = batched_auroc(engine.predict(params, "val"), val.y, val.mask)
    res = method.last_credit
    active = ~method.last.resting & torch.isfinite(auroc_mixed)
    assert active.sum() > 0
    assert torch.allclose(res.u_full[active], auroc_mixed[active], atol=1e-6)
    assert torch.allclose(res.u_local[active], auroc_local[active], atol=1e-6)
    phi_sum = torch.where(res.observed, res.phi, torch.zeros_like(res.phi)).sum(1)
    assert torch.allclose(phi_sum[active], (res.u_full - res.u_local)[active], atol=1e-9)
    # beliefs moved by exactly one clipped observation per partnership (eq. 6)
    assert torch.equal(method.beliefs.pulls > 0, res.observed)
    assert extras["coalitions_evaluated"] == float(sum(2 ** int(d) for d in method.last.degree if d > 0))


def test_short_runs_log_isolation_and_are_deterministic(small, monkeypatch):
    calls = []
    orig = Context.evaluate_mixtures
    monkeypatch.setattr(Context, "evaluate_mixtures", lambda self, *a, **k: calls.append(1) or orig(self, *a, **k))
    base = run_one(_cfg("abps", 3), small, 11)
    assert len(calls) == 3  # one batched coalition evaluation per round
    for h in base.history:
        assert 0.0 <= h["isolation_rate"] <= 1.0 and h["mean_partners"] <= 3.0
        assert h["edges"] == h["partnerships"] == h["mean_partners"] * small.n_centers / 2
        assert 0.0 < h["acceptance_rate"] <= 1.0
    div = run_one(_cfg("abps-div", 3), small, 11)
    iso = [h["isolation_rate"] for h in div.history]
    assert max(iso) > 0.0  # the diversity filter leaves centers without an accepted partner
    assert all(h["mean_partners"] <= 1.0 for h in div.history)
    again = run_one(_cfg("abps-div", 3), small, 11)
    assert again.history == div.history
    # per-seed isolation figures (results.json "method_summary") agree with the per-round history
    ms = div.method_summary
    assert ms["rest_share_mean"] == pytest.approx(sum(iso) / 3)
    assert ms["partners_mean"] == pytest.approx(sum(h["mean_partners"] for h in div.history) / 3)
    props = sum(h["proposals"] for h in div.history)
    acc = sum(h["acceptance_rate"] * h["proposals"] for h in div.history)
    assert ms["run_acceptance_rate"] == pytest.approx(acc / props)
    rested = ms["rounds_rested"]
    assert set(rested) <= set(small.center_ids) and all(1 <= v <= 3 for v in rested.values())
    assert sum(rested.values()) == round(sum(iso) * small.n_centers)
    assert ms["centers_ever_rested"] == len(rested)
    assert div.summary()["method_summary"] == ms


def test_belief_artifact_center_ids_only(small):
    cfg = _cfg("abps", 2)
    captured = {}

    class Spy(AbpsMethod):
        def after_exchange(self, ctx, round_idx, plan):
            out = super().after_exchange(ctx, round_idx, plan)
            captured["art"] = self.artifacts(ctx)
            return out

    _run_spy(Spy, cfg, small, 11)
    rows = captured["art"]["abps_beliefs.json"]
    assert [r["center_id"] for r in rows] == small.center_ids
    allowed = {"center_id", "rounds_rested", "rest_share", "mean_partners", "mean_belief", "max_belief",
               "best_peer", "pulls", "peers_observed", "candidates"}
    assert all(set(r) == allowed for r in rows)
    assert all(r["best_peer"] is None or r["best_peer"] in small.center_ids for r in rows)
    assert sum(r["pulls"] for r in rows) > 0
    json.dumps(rows)  # serializable as an MLflow JSON artifact


def test_random_partners_ablation(small):
    """random-partners: same filter and capacity as ABPS, uniformly random partners, no Shapley."""
    from abps.method import RandomPartnersMethod, SelectionParams

    cls = get_method("random-partners")
    assert cls is RandomPartnersMethod and cls.Params is SelectionParams
    doc = load_yaml(CONFIGS / "random-partners.yaml")
    cfg = build_config("random-partners", cls.default_config, doc, rounds=4)
    assert (cfg.exchange.head_layers, cfg.exchange.bf16_wire) == (1, True)
    assert SelectionParams.model_validate(cfg.params).kappa == 1
    table1 = load_yaml(CONFIGS / "table1.yaml")
    assert {"method": "random-partners", "config": "random-partners.yaml"} in table1["methods"]
    with pytest.raises(Exception, match="gamma"):
        SelectionParams.model_validate({"gamma": 2.0})  # no beliefs: no UCB parameters
    res = run_one(cfg, small, 11)
    for h in res.history:
        assert "mean_phi" not in h and "coalitions_evaluated" not in h
        # no threshold: only full receivers refuse, and each accepted proposal is one partnership
        assert h["acceptance_rate"] * h["proposals"] == pytest.approx(h["partnerships"])
        assert h["mean_partners"] <= 1.0
    # kappa 1, no filter: the matching is maximal (two unmatched centers would be each other's free
    # candidates), so at most one center rests per round
    assert all(h["isolation_rate"] <= 1 / small.n_centers for h in res.history)
    assert res.method_summary["partners_mean"] == pytest.approx(sum(h["mean_partners"] for h in res.history) / 4)
    assert run_one(cfg, small, 11).history == res.history
    # with the diversity goal, the candidate sets are ABPS's (same filter code)
    div = build_config("random-partners", cls.default_config, {"params": {"goal": "diversity"}}, rounds=1)
    m = cls(SelectionParams.model_validate(div.params))
    ab = AbpsMethod(AbpsParams(goal="diversity", kappa=1))
    ctx = _ctx(small, div)
    m.setup(ctx)
    ab.setup(ctx)
    assert torch.equal(m.candidates, ab.candidates)
    plan = m.plan_round(ctx, 0)
    assert bool((plan.adjacency <= m.candidates | m.candidates.T).all())


def test_watched_centers_share_and_auroc(small):
    watched = list(small.center_ids[:6])
    cfg = build_config("abps+p+q+k1", get_method("abps+p+q+k1").default_config,
                       {"params": {"watch_centers": watched}}, rounds=2)
    res = run_one(cfg, small, 11)
    for h in res.history:
        assert 0.0 <= h["watched_partnership_share"] <= 1.0
        assert 0.5 < h["unwatched_test_auroc_mean"] <= 1.0
    with pytest.raises(InputError, match="unknown center_id"):
        bad = build_config("abps", {}, {"params": {"watch_centers": ["nope"]}}, rounds=1)
        run_one(bad, small, 11)


def test_tmc_shapley_kappa_above_five_against_exact():
    """kappa 6 on 7 centers: every center holds all 6 peers, so |P_i| = 6 > 5 takes the TMC path
    (paper: B = 8, no truncation). On the same round's coalition utilities, TMC with B = 8 keeps
    efficiency exactly (eq. 19) and with B = 400 permutations is within 0.01 of exact Shapley."""
    from abps.shapley import build_coalitions, shapley_from_utilities

    data = _data(7, seed=2)
    got = {}
    for b in (8, 400):
        cfg = build_config("abps", {}, {"params": {"kappa": 6, "tmc_permutations": b}}, rounds=1)

        class Spy(AbpsMethod):
            def after_exchange(self, ctx, round_idx, plan):
                out = super().after_exchange(ctx, round_idx, plan)
                exact = build_coalitions(self.last.partners, self.weights, exact_max=6)
                util = ctx.evaluate_mixtures(exact.mixing, exact.targets, split="val").double()
                got[b] = (self.last_credit, shapley_from_utilities(exact, util), self.last.degree.clone())
                return out

        _run_spy(Spy, cfg, data, 11)
    tmc8, exact, deg = got[8]
    assert deg.tolist() == [6] * 7
    ok = torch.isfinite(exact.u_full)
    assert ok.sum() >= 5
    eff = torch.nansum(tmc8.phi, dim=1)[ok]
    assert torch.allclose(eff, (exact.u_full - exact.u_local)[ok], atol=1e-9)
    tmc400, exact400, _ = got[400]
    both = torch.isfinite(tmc400.phi) & torch.isfinite(exact400.phi)
    assert both.sum() >= 30
    assert (tmc400.phi[both] - exact400.phi[both]).abs().max().item() < 0.01


def test_report_shows_rest_share():
    """`abps report`'s Table 1 carries the per-seed isolation rate (final MLflow metric rest_share_mean)."""
    from federation.report import CellRun, table1, table1_markdown

    def cell(method, seed, rest):
        return CellRun(run_id=f"{method}{seed}", label=method, method=method, seed=seed, cohort="c", config_hash=None,
                       start_time=0, final_auroc_mean=0.7, model_bytes=100.0, rel_bandwidth=1.0, rounds_run=3.0,
                       rest_share=rest)

    rows = table1([cell("fedavg", 11, float("nan")), cell("abps-div", 11, 0.3), cell("abps-div", 22, 0.4)])
    by = {r.label: r for r in rows}
    assert by["abps-div"].rest_share == pytest.approx(0.35) and by["fedavg"].rest_share != by["fedavg"].rest_share
    md = table1_markdown(rows)
    assert "| Isolation |" in md and "35.0 %" in md and "| –" in md


def test_report_shows_isolation_per_seed(tmp_path):
    """`abps report` has a per-seed isolation section whose figures are the ones in results.json
    (``method_summary`` of each seed): isolation rate, E|P_i|, acceptance rate, centers ever rested."""
    import json

    from federation.data.synthetic import write_fedprox_cohort
    from federation.report import write_report
    from federation.run.runner import run_training

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    cohort = write_fedprox_cohort(tmp_path / "c", n_centers=6, seed=1, mean_size=60, shared=0.8)
    run_training(_cfg("abps-div", 2), cohort, [11, 22], output=tmp_path / "results.json", tracking_uri=uri,
                 experiment="iso", progress=False)
    seeds = {int(k): v["method_summary"] for k, v in json.loads((tmp_path / "results.json").read_text())["seeds"].items()}
    doc = write_report("iso", tmp_path / "rep", tracking_uri=uri, log_to_mlflow=False)
    rows = doc["sections"]["isolation"]["rows"]
    assert [(r["label"], r["seed"]) for r in rows] == [("abps-div", 11), ("abps-div", 22)]
    for r in rows:
        ms = seeds[r["seed"]]
        assert r["rest_share"] == pytest.approx(ms["rest_share_mean"])
        assert r["partners_mean"] == pytest.approx(ms["partners_mean"])
        assert r["acceptance_rate"] == pytest.approx(ms["run_acceptance_rate"])
        assert r["centers_ever_rested"] == ms["centers_ever_rested"] == len(ms["rounds_rested"])
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Isolation per seed" in md
    assert f"| abps-div | 22 | {100 * seeds[22]['rest_share_mean']:.1f} % |" in md

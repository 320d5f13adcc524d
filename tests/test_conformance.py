"""Conformance checks run on every registered method (as scikit-learn's common estimator checks).

Each method trains two rounds on a tiny real cohort (the MIMIC-IV demo, IID partition into 4
centers, built once per session) through the one round loop, and must:

* plan mixing matrices ``W`` that are ``[n, n]``, finite, non-negative and row-stochastic; a
  method that never exchanges logs zero model bytes;
* give the identical result (history, per-center AUROC, final parameters) for the same seed,
  and different parameters for another seed;
* ship ``configs/<name>.yaml`` that equals its ``default_config`` (after filling defaults);
* appear in ``configs/table1.yaml`` (Table 1 order; the non-rows in ``configs/table1-extras.yaml``)
  and in the report's Table 1 names and Figure 3 colour families; plus the registry's own rules.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from etl.mimic import EtlOptions, run_etl
from federation.core.config import build_config, load_yaml
from federation.data.tensors import FederatedData
from federation.methods import METHODS, Method, all_methods, method_names, paper_order
from federation.methods.registry import register
from federation.run.runner import run_one

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
NAMES = method_names()


@pytest.fixture(scope="session")
def tiny_data(mimic_demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> FederatedData:
    """The MIMIC-IV demo as 4 IID centers (what ``abps etl --partition iid --n-centers 4
    --min-center-stays 1`` writes)."""
    out = tmp_path_factory.mktemp("conformance") / "cohort"
    rep = run_etl(mimic_demo_dir, out, EtlOptions(partition="iid", n_centers=4, min_center_stays=1, threads=1))
    assert rep["centers"] == 4
    return FederatedData.from_cohort(out)


def _run(name: str, data: FederatedData, seed: int, monkeypatch: pytest.MonkeyPatch):
    """Two rounds of ``name``; returns (result, the W of each round)."""
    cls = all_methods()[name]
    plans: list[torch.Tensor | None] = []

    def spy(self, ctx, r):
        plan = cls.plan_round(self, ctx, r)
        plans.append(None if plan.w is None else plan.w.clone())
        return plan

    monkeypatch.setitem(METHODS, name, type(cls.__name__ + "Spy", (cls,), {"plan_round": spy}))
    cfg = build_config(name, cls.default_config, None, rounds=2)
    cfg = cfg.model_copy(update={"early_stopping": cfg.early_stopping.model_copy(update={"enabled": False})})
    try:
        return run_one(cfg, data, seed, keep_params=True), plans
    finally:
        monkeypatch.setitem(METHODS, name, cls)


@pytest.mark.parametrize("name", NAMES)
def test_method_conforms(name: str, tiny_data: FederatedData, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    n = tiny_data.n_centers
    res, plans = _run(name, tiny_data, 5, monkeypatch)
    assert res.rounds_run == 2 and len(plans) == 2
    for w in plans:
        if w is None:
            continue
        assert tuple(w.shape) == (n, n)
        assert bool(torch.isfinite(w).all()) and float(w.min()) >= 0.0
        torch.testing.assert_close(w.double().sum(1), torch.ones(n, dtype=torch.float64), rtol=0, atol=1e-6)
    if all(w is None for w in plans):
        assert res.model_bytes == 0
    else:
        assert res.model_bytes > 0
    for h in res.history:
        assert all(math.isfinite(v) for k, v in h.items() if "auroc" not in k), h
        assert all(0.0 <= h[k] <= 1.0 for k in ("val_auroc_mean", "test_auroc_mean") if math.isfinite(h[k]))
    assert res.params is not None and all(bool(torch.isfinite(v).all()) for v in res.params.values())

    again, plans_again = _run(name, tiny_data, 5, monkeypatch)
    assert repr(again.history) == repr(res.history) and repr(again.per_center) == repr(res.per_center)
    assert all(torch.equal(res.params[k], again.params[k]) for k in res.params)
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(plans, plans_again))
    other, _ = _run(name, tiny_data, 6, monkeypatch)
    assert any(not torch.equal(res.params[k], other.params[k]) for k in res.params)


@pytest.mark.parametrize("name", NAMES)
def test_preset_file_equals_default_config(name: str) -> None:
    cls = all_methods()[name]
    path = CONFIGS / f"{name}.yaml"
    assert path.is_file(), f"{name}: no configs/{name}.yaml"
    doc = load_yaml(path)
    assert doc["method"] == name
    from_file = build_config(name, cls.default_config, doc)
    # the file may fix the number of rounds (the paper's 50 / 100); all else must be the defaults
    builtin = build_config(name, cls.default_config, None, rounds=doc.get("rounds"))

    def norm(c):
        return c.model_copy(update={"params": cls.Params.model_validate(c.params).model_dump()})

    assert norm(from_file) == norm(builtin)


def test_table1_and_report_list_every_method() -> None:
    from federation import report

    doc = load_yaml(CONFIGS / "table1.yaml")
    listed = [e["method"] if isinstance(e, dict) else e for e in doc["methods"]]
    extras = [e["method"] if isinstance(e, dict) else e for e in load_yaml(CONFIGS / "table1-extras.yaml")["methods"]]
    assert sorted(listed + extras) == sorted(NAMES), \
        "configs/table1.yaml and table1-extras.yaml together must list every registered method once"
    # Table 1 rows in the paper's order, the others after
    assert [m for m in listed if m in paper_order()] == list(paper_order())
    assert paper_order()[0] == "local" and paper_order()[-1] == "centralized" and len(paper_order()) == 20
    for name in NAMES:
        assert report.DISPLAY[name] == all_methods()[name].display_name
        assert report.FAMILY[name] in report._COLOURS
    assert report.PAPER_ORDER == paper_order()
    assert report.DISPLAY["abps-x"] == "ABPS-X (ours, full)" and report.FAMILY["decefl"] == "decentralized"


def test_register_rules() -> None:
    with pytest.raises(ValueError, match="own `name`"):
        @register(display_name="X", family="star")
        class Unnamed(Method):
            pass

    with pytest.raises(ValueError, match="family"):
        @register(family="nope")
        class BadFamily(Method):
            name = "conformance-bad-family"

    with pytest.raises(ValueError, match="already registered"):
        @register
        class Clash(Method):
            name = "fedavg"

    with pytest.raises(ValueError, match="paper_order 2 already taken"):
        @register(paper_order=2)
        class SameRow(Method):
            name = "conformance-same-row"

    try:
        base = all_methods()["fedavg"]

        @register
        class Child(base):  # type: ignore[valid-type, misc]
            name = "conformance-child"

        # a subclass never inherits its parent's Table 1 row
        assert (Child.display_name, Child.family, Child.paper_order) == ("conformance-child", "other", None)
        assert (base.display_name, base.family, base.paper_order) == ("FedAvg", "star", 2)
        # unordered methods (e.g. random-partners) follow the Table 1 rows, by name
        names = method_names()
        assert "conformance-child" not in paper_order() and names.index("conformance-child") >= len(paper_order())
        unordered = names[len(paper_order()):]
        assert unordered == sorted(unordered)
    finally:
        METHODS.pop("conformance-child", None)
    assert not any(k.startswith("conformance-") for k in METHODS)

"""The SAGE selectors on clinical federations through the runtime (federation/methods/sage_selector.py).

A hand-built 4-center case whose choices follow from the SAGE paper's equations by hand, and a real
run on the MIMIC-IV demo through the one round loop and ledger.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from federation.core.config import build_config
from federation.core.ledger import Ledger
from federation.data.tensors import FederatedData, SplitTensors
from federation.engine.mlp import StackedEngine, exchanged_keys, head_keys, init_params
from federation.methods import Context, get_method
from federation.run.runner import run_one

D = 3          # features
VAL = 64       # validation rows per center = its anchor pool
# center k's validation labels (constant per center, so every stage's risk is exact whatever the anchor draw)
LABELS = (0.0, 1.0, 1.0, 0.0)
# center j's model predicts the constant class PRED[j] (all weights 0, b3 = +-5)
PRED = (0, 0, 1, 1)


def _four_centers() -> FederatedData:
    n = 4
    g = torch.Generator().manual_seed(0)

    def split(rows: int, labels: tuple[float, ...]) -> SplitTensors:
        y = torch.tensor(labels).unsqueeze(1).expand(n, rows).clone()
        return SplitTensors(torch.randn(n, rows, D, generator=g), y, torch.ones(n, rows, dtype=torch.bool),
                            torch.full((n,), rows, dtype=torch.int64))

    splits = {"train": split(8, (0.0, 1.0, 1.0, 0.0)), "val": split(VAL, LABELS), "test": split(8, LABELS)}
    meta = torch.zeros(n, 15)
    return FederatedData([f"c{i}" for i in range(n)], [f"f{i}" for i in range(D)], splits, meta, meta[:, :3].clone())


def _plan(selector: str, seed: int = 3):
    data = _four_centers()
    cls = get_method("sage")
    cfg = build_config("sage", cls.default_config,
                       {"method": "sage", "params": {"selector": selector, "schedule": [32, 64]}}, rounds=1)
    params = init_params(D, (4, 4), 4, 0)
    for k in params:
        params[k].zero_()
    params["b3"] = torch.tensor([[5.0 if p else -5.0] for p in PRED])
    ledger = Ledger(4, 1, 50)
    ctx = Context(cfg=cfg, data=data, engine=StackedEngine(data, cfg.engine, seed), seed=seed, ledger=ledger,
                  exchanged=exchanged_keys(2), head=head_keys(2), bf16=False, params=params)
    m = cls(cls.Params.model_validate(cfg.params))
    m.setup(ctx)
    plan = m.plan_round(ctx, 0)
    return m.last, plan


def test_sage_choices_on_four_centers_by_hand() -> None:
    """Complete graph, d_k = 3, schedule (32, 64), delta 0.1: radius (7) r = sqrt(ln(2*3*2/0.1) / (2 m)),
    2r = 0.547 at m = 32 and 0.387 at m = 64. The 0-1 risks R_kj are 0 or 1
    (constant labels, constant predictions): receiver 0 (labels 0) sees risks (c1, c2, c3) = (0, 1, 1),
    receiver 1 (labels 1) (c0, c2, c3) = (1, 0, 0), receiver 2 (labels 1) (c0, c1, c3) = (1, 1, 0),
    receiver 3 (labels 0) (c0, c1, c2) = (0, 0, 1)."""
    r = lambda m: math.sqrt(math.log(2 * 3 * 2 / 0.1) / (2 * m))  # noqa: E731
    assert 2 * r(32) == pytest.approx(0.5470, abs=1e-4) and 2 * r(64) == pytest.approx(0.3868, abs=1e-4)

    # Vanilla SAGE, certificate (8): best vs runner-up gap 1 > 2r(32) for receivers 0 and 2 (-> c1, c3 at
    # m = 32); receivers 1 and 3 have two zero-risk candidates (gap 0): never certified, RG after m = 64
    dec, plan = _plan("vanilla_sage")
    assert dec.certified.tolist() == [True, False, True, False]
    assert dec.gossip.tolist() == [False, True, False, True]
    assert dec.anchors_used.tolist() == [32, 64, 32, 64]
    assert int(dec.peers[0, 0]) == 1 and int(dec.peers[2, 0]) == 3
    assert int(dec.peers[1, 0]) in (0, 2, 3) and int(dec.peers[3, 0]) in (0, 1, 2)
    # eq. (2) with alpha_mix 0.5: W[0] = 0.5 e_0 + 0.5 e_1
    assert plan.w[0].tolist() == [0.5, 0.5, 0.0, 0.0] and plan.w[2].tolist() == [0.0, 0.0, 0.5, 0.5]
    # probe bytes: sum_k d_k m_k anchors, each D float32 features out and one float32 logit back
    assert plan.probe_bytes == 3 * (32 + 64 + 32 + 64) * (4 * D + 4)

    # SAGE-OS, certificate (20): advantage A = mean risk - best risk = 2/3 (receivers 0, 2) > 0.547 at m = 32;
    # 1/3 (receivers 1, 3): below 2r at both stages; cost stop (24) at m = 32: lambda d (64 - 32) = 0.192 <
    # A + 2r, so it probes on and falls back to RG at the last stage
    dec, _ = _plan("sage_os")
    assert dec.certified.tolist() == [True, False, True, False]
    assert dec.cost_gossip.tolist() == [False, False, False, False]
    assert dec.anchors_used.tolist() == [32, 64, 32, 64]
    assert int(dec.peers[0, 0]) == 1 and int(dec.peers[2, 0]) == 3

    # AQ: the empirical best at the last stage, ties to the lowest candidate index: c1, c2, c3, c0
    dec, _ = _plan("aq128")
    assert dec.peers[:, 0].tolist() == [1, 2, 3, 0]
    assert dec.anchors_used.tolist() == [64, 64, 64, 64] and not bool(dec.gossip.any())


def test_sage_selector_runs_on_the_mimic_demo(mimic_demo_dir: Path, tmp_path: Path) -> None:
    """Two rounds of SAGE-OS on the MIMIC-IV demo (4 IID centers): anchors from each center's validation
    rows, the ledger's model bytes = undirected edges x omega's parameters x 4 bytes, AUROC in [0, 1]."""
    from etl.mimic import EtlOptions, run_etl

    out = tmp_path / "cohort"
    run_etl(mimic_demo_dir, out, EtlOptions(partition="iid", n_centers=4, min_center_stays=1, threads=1))
    data = FederatedData.from_cohort(out)
    cls = get_method("sage")
    cfg = build_config("sage", cls.default_config,
                       {"method": "sage", "params": {"schedule": [2, 4, 8]}}, rounds=2)
    res = run_one(cfg, data, 7)
    omega = data.d * 128 + 128  # head_layers 2: only w1, b1 cross the network
    edges = [int(h["edges"]) for h in res.history]
    assert res.model_bytes == sum(edges) * omega * 4 and all(1 <= e <= 4 for e in edges)
    assert res.probe_bytes > 0 and res.metadata_bytes == data.encoding_bytes  # no ABPS metadata
    assert all(0.0 <= h["test_auroc_mean"] <= 1.0 for h in res.history if math.isfinite(h["test_auroc_mean"]))
    assert 0.0 <= res.method_summary["rg_fallback_rate_mean"] <= 1.0

"""The eICU hospital federation learns: real eICU demo, federated encoding, FedAvg vs local.

Guards the fix of the 0.33 / 0.48 / 0.51 mean per-center test AUROC of Local / FedAvg / ABPS with the
paper's per-center encoding and local schedule on 5-33 train rows per hospital (docs/eicu.md): the
federated encoding and the eICU preset's local training (configs/eicu-table.yaml). One seed of the
docs' three, 30 rounds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from etl.eicu import run_eicu_etl
from etl.mimic import EtlOptions
from federation.core.config import DataConfig, build_config, load_yaml
from federation.data.tensors import FederatedData
from federation.methods import get_method
from federation.run.runner import run_one

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture(scope="module")
def eicu(eicu_demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("eicu-fl") / "cohort"
    run_eicu_etl(eicu_demo_dir, out, EtlOptions(min_center_stays=10))  # `abps etl --source eicu` defaults
    return FederatedData.from_cohort(out)


def _entry(method: str) -> dict:
    doc = load_yaml(CONFIGS / "eicu-table.yaml")
    (entry,) = [m for m in doc["methods"] if m["method"] == method]
    return entry.get("overrides", {})


def test_auto_encoding_is_federated_on_small_hospitals(eicu):
    assert float(eicu.n_train.double().median()) < DataConfig().min_center_rows
    assert eicu.preprocessing == "federated" and eicu.encoding_bytes > 0
    with pytest.warns(UserWarning, match="fewer than 30 train rows"):
        eicu.with_preprocessing(DataConfig(preprocessing="per-center"))


def test_federated_methods_learn_on_real_hospitals_and_beat_local(eicu):
    """The eICU table's settings (30 rounds, configs/eicu-table.yaml) on one seed of the three."""
    rounds = 30
    out = {}
    for m in ("fedavg", "abps", "local"):
        cfg = build_config(m, get_method(m).default_config, {"method": m, **_entry(m)}, rounds)
        out[m] = run_one(cfg, eicu, seed=11).final_auroc_mean
    # measured (seed 11, 30 rounds): FedAvg 0.834, ABPS 0.820, Local 0.482; means over seeds 11 22 33:
    # 0.830 / 0.795 / 0.482 (docs/eicu.md, the preset chosen on validation only). At the paper's local
    # training and kappa 3 (2 local epochs, batch 128): FedAvg 0.737 / ABPS 0.704 over the three seeds;
    # with the per-center encoding 0.478 / 0.51.
    assert out["fedavg"] >= 0.75, out
    assert out["abps"] >= 0.72, out  # ABPS spreads 0.75-0.82 over the three seeds (mean 0.795)
    assert min(out["fedavg"], out["abps"]) > out["local"] + 0.15, out

"""The eICU hospital federation learns (issue 21): real eICU demo, federated encoding, FedAvg vs local.

Guards the fix of the 0.33 / 0.48 mean per-center test AUROC of Local / FedAvg with the paper's
per-center encoding on 5-33 train rows per hospital (docs/eicu.md). Small on purpose: one seed and
fewer rounds than the docs' table (30 rounds, 3 seeds), hence a lower bound than its 0.75.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from etl.eicu import run_eicu_etl
from etl.mimic import EtlOptions
from federation.config import DataConfig, build_config, load_yaml
from federation.data import FederatedData
from federation.methods import get_method
from federation.runner import run_one

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


def test_fedavg_learns_on_real_hospitals_and_beats_local(eicu):
    rounds = 20
    out = {}
    for m in ("fedavg", "local"):
        cfg = build_config(m, get_method(m).default_config, {"method": m, **_entry(m)}, rounds)
        out[m] = run_one(cfg, eicu, seed=11).final_auroc_mean
    # measured: FedAvg 0.687, Local 0.538 (seed 11, 20 rounds); the old per-center encoding gave
    # FedAvg 0.478 and Local 0.330 after 30 rounds (3 seeds)
    assert out["fedavg"] >= 0.65, out
    assert out["fedavg"] > out["local"] + 0.1, out

"""The SAGE benchmark's image clients as a federation of the runtime (federation/data/images.py):
ABPS, FedAvg, DeFTA, random partners and the SAGE selectors through one round loop and one ledger on a
small real Fashion-MNIST federation (4 clients, Dirichlet 0.1, 2,000 images)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from etl.errors import InputError
from etl.images import FASHION_MNIST_DIR
from federation.core.config import build_config
from federation.data.images import ImageFederation, image_federation_id
from federation.data.load import federation_id, load_federation
from federation.engine.build import build_engine
from federation.methods import get_method
from federation.run.runner import run_one

pytestmark = pytest.mark.skipif(not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
                                reason="Fashion-MNIST not installed at /usr/share/datasets/fashion-mnist")

# parameters per client of the SAGE Fashion-MNIST model (SAGE paper Sec. V-A; models.FMNIST_SPEC),
# by hand: conv 1->16 (3x3) + bias, conv 16->32 (3x3) + bias, linear 32*7*7 -> 64, decoder linear 64 -> 1568,
# conv-transpose 32->16 (4x4) + bias, conv-transpose 16->1 (4x4) + bias, head 64 -> 64 -> 10
ENC = (1 * 16 * 9 + 16) + (16 * 32 * 9 + 32) + (32 * 7 * 7 * 64 + 64)
DEC = (64 * 1568 + 1568) + (32 * 16 * 16 + 16) + (16 * 1 * 16 + 1)
HEAD = (64 * 64 + 64) + (64 * 10 + 10)


@pytest.fixture(scope="module")
def fmnist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fmnist") / "fm4"
    d.mkdir()
    (d / "images.yaml").write_text("dataset: fmnist\nn_clients: 4\nalpha_dir: 0.1\npartition_seed: 0\n"
                                   "train_samples: 2000\n")
    return d


@pytest.fixture(scope="module")
def data(fmnist: Path) -> ImageFederation:
    torch.set_num_threads(1)
    d = load_federation(fmnist)
    assert isinstance(d, ImageFederation)
    return d


def _cfg(method: str, rounds: int, **extra):
    cls = get_method(method)
    raw = {"method": method, **extra}
    cfg = build_config(method, cls.default_config, raw, rounds=rounds)
    return cfg


def test_image_federation_is_a_cohort(fmnist: Path, data: ImageFederation) -> None:
    """The partition's 80 / 10 / 10 splits, the metadata from the train labels, the content id."""
    sh = data.shards
    total = data.n_train + data.splits["val"].n + data.splits["test"].n
    assert int(total.sum()) == 2000 and data.n_centers == 4
    for k in range(4):  # SAGE split of a shard of n_k images: a = round(0.1 n_k) anchor, e = round(0.1 n_k) eval
        n_k = int(total[k])
        assert int(data.splits["val"].n[k]) == round(0.1 * n_k) == int(data.splits["test"].n[k])
    y = sh.y_train[sh.train_index[0, : int(sh.n_train[0])]].numpy()
    shares = np.bincount(y, minlength=10) / len(y)
    assert float(data.meta_base[0, 0]) == pytest.approx(shares.max(), rel=1e-6)
    assert float(data.meta_base[0, 1]) == pytest.approx(np.log(len(y)), rel=1e-6)
    assert data.meta[0, 3:13].numpy() == pytest.approx(shares, abs=1e-6)
    assert federation_id(fmnist) == image_federation_id(fmnist) and len(federation_id(fmnist)) == 16
    with pytest.raises(InputError, match="centralized"):
        data.pooled()


def test_fedavg_ledger_and_accuracy_by_hand(data: ImageFederation) -> None:
    """One FedAvg round: 4 center-server links x 220,411 fp32 parameters x 4 bytes; the runner's
    accuracy equals scikit-learn's on each client's own local-evaluation split."""
    from sklearn.metrics import accuracy_score

    from federation.core.ledger import Ledger
    from federation.methods import Context

    assert ENC + DEC + HEAD == 220_411
    res = run_one(_cfg("fedavg", 1), data, 5, keep_params=True)
    assert res.model_bytes == 4 * 220_411 * 4 == 3_526_576
    assert res.rel_bandwidth == pytest.approx(1 / 50)
    engine = build_engine(data, _cfg("fedavg", 1), 5)
    logits = engine.predict(res.params, "test")
    s = data.splits["test"]
    ref = [accuracy_score(s.y[k, : int(s.n[k])].long().numpy(), logits[k, : int(s.n[k])].argmax(-1).numpy())
           for k in range(4)]
    assert [v["test_auroc"] for v in res.per_center.values()] == pytest.approx(ref)
    assert res.final_auroc_mean == pytest.approx(float(np.mean(ref)))
    # a mixture row with weight 1 on the target itself is that client's own model
    ex, hd, _ = engine.layout(0)
    ctx = Context(cfg=_cfg("fedavg", 1), data=data, engine=engine, seed=5, ledger=Ledger(4, 1), exchanged=ex,
                  head=hd, bf16=False, pre_exchange=res.params)
    own = ctx.evaluate_mixtures(torch.eye(4), torch.arange(4), split="test")
    assert own.tolist() == pytest.approx(ref)


def test_abps_x_and_sage_ledger_on_images(data: ImageFederation) -> None:
    """Payload per edge = the exchanged block: ABPS-X keeps the 2-layer head local and sends bf16
    (2 bytes); the SAGE selector sends omega (encoder + decoder) in fp32; probe bytes = sum_k d_k m_k
    anchors x (784 uint8 pixels out + 10 float32 logits back)."""
    res = run_one(_cfg("abps-x", 2, early_stopping={"enabled": False}), data, 3)
    assert res.model_bytes == sum(int(h["edges"]) for h in res.history) * (ENC + DEC) * 2
    sage = run_one(_cfg("sage", 2, params={"selector": "aq128", "schedule": [8, 16, 32]}), data, 3)
    edges = [int(h["edges"]) for h in sage.history]
    assert sage.model_bytes == sum(edges) * (ENC + DEC) * 4
    # AQ always probes every neighbour (d_k = 3) at its last feasible stage: here every pool holds >= 32 anchors
    assert min(int(n) for n in data.splits["val"].n) >= 32
    assert sage.probe_bytes == 2 * 4 * 3 * 32 * (784 + 40)


@pytest.mark.parametrize("method,extra", [("random-partners", {}), ("defta", {}),
                                          ("sage", {"params": {"selector": "rg"}})])
def test_accuracy_above_chance_after_a_few_rounds(data: ImageFederation, method: str, extra: dict) -> None:
    """Three rounds: mean client accuracy well above the 10-class chance level (0.1), every round's
    accuracy a valid fraction; the same seed gives the same history (checked once)."""
    res = run_one(_cfg(method, 3, **extra), data, 11)
    accs = [h["test_auroc_mean"] for h in res.history]
    assert all(0.0 <= a <= 1.0 for a in accs)
    assert res.final_auroc_mean > 0.3, accs
    if method == "sage":
        again = run_one(_cfg(method, 3, **extra), data, 11)
        assert repr(again.history) == repr(res.history)


def test_image_engine_refuses_clinical_engine_settings(data: ImageFederation) -> None:
    with pytest.raises(InputError, match="engine"):
        run_one(_cfg("fedavg", 1, engine={"batch_size": 32}), data, 0)
    with pytest.raises(InputError, match="local loss"):
        run_one(_cfg("fedprox", 1), data, 0)

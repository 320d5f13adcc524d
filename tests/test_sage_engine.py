"""Stacked SAGE engine against per-client references; data, graphs, metrics, configs, CIFAR-10 path."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from sklearn.metrics import f1_score

from etl.errors import InputError
from etl.images import ImageDataset
from federation.core.graphs import neighbour_table
from federation.core.image_metrics import accuracy, confusion_matrices, macro_f1
from federation.data.image_shards import make_graph, make_shards
from federation.engine.image_model import (
    EncoderDecoderClassifier,
    ModelSpec,
    StackedAdam,
    StackedModel,
    batch_plan,
    to_float,
)
from federation.images.run import cli_run
from federation.methods import selectors as sel
from federation.methods.selectors import parse_config

TINY = ModelSpec(in_channels=1, image_size=28, base_width=4, latent_dim=8)


def _data(n: int = 200, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 10, (n,), generator=g)
    return x, y


def test_stacked_training_matches_per_client_loop():
    torch.manual_seed(0)
    x, y = _data()
    k, bs = 3, 16
    n_train = torch.tensor([40, 7, 55])
    index = torch.stack([torch.randperm(200)[:60] for _ in range(k)])
    model = StackedModel(TINY, k, seed=3, lr=1e-3, recon_weight=0.5)
    init = {n: p.clone() for n, p in model.params.items()}
    g = torch.Generator().manual_seed(1)
    plans = [batch_plan(n_train, index.shape[1], bs, g) for _ in range(2)]   # two rounds
    for plan in plans:
        model.train_steps(x, y, index, plan, bs)
    for c in range(k):
        ref = EncoderDecoderClassifier(TINY)
        ref.load_state_dict({n: p[c] for n, p in init.items()})
        opt = torch.optim.Adam(ref.parameters(), lr=1e-3)
        for plan in plans:
            pos = plan[c][plan[c] >= 0]
            for s in range(0, pos.numel(), bs):
                rows = index[c, pos[s:s + bs]]
                xb = to_float(x[rows])
                logits, recon = ref(xb)
                loss = torch.nn.functional.cross_entropy(logits, y[rows]) + \
                    0.5 * torch.nn.functional.mse_loss(recon, xb)
                opt.zero_grad()
                loss.backward()
                opt.step()
        for n, p in ref.named_parameters():
            torch.testing.assert_close(model.params[n][c], p.detach(), atol=2e-5, rtol=1e-4)
    # Client 1 (7 samples) did one step per round, client 2 four.
    assert model.opt.step_count.tolist() == [6.0, 2.0, 8.0]


def test_batch_plan_is_a_permutation_per_client():
    plan = batch_plan(torch.tensor([5, 0, 9]), 12, 4, torch.Generator().manual_seed(0))
    assert plan.shape == (3, 12)
    assert sorted(plan[0][plan[0] >= 0].tolist()) == list(range(5))
    assert (plan[1] < 0).all()
    assert sorted(plan[2][plan[2] >= 0].tolist()) == list(range(9))


def test_pair_probe_matches_per_pair_reference():
    x, _ = _data(100)
    model = StackedModel(TINY, 4, seed=0)
    # Make the four clients different.
    with torch.no_grad():
        for p in model.params.values():
            p.add_(0.05 * torch.randn_like(p))
    models = torch.tensor([2, 0, 3, 1, 2])
    rows = torch.randint(0, 100, (5, 9))
    pred = model.predict_pairs(x, models, rows, chunk=2)
    for p in range(5):
        ref = EncoderDecoderClassifier(TINY)
        ref.load_state_dict({n: v[models[p]] for n, v in model.params.items()})
        with torch.no_grad():
            assert pred[p].tolist() == ref.classify(to_float(x[rows[p]])).argmax(-1).tolist()
    shared = model.predict_shared_inputs(x[:7])
    assert shared[2].tolist() == model.predict_pairs(x, torch.tensor([2]), torch.arange(7)[None])[0].tolist()


def test_mixing_eq2_touches_only_the_representation():
    model = StackedModel(TINY, 3, seed=0)
    with torch.no_grad():
        for p in model.params.values():
            p.copy_(torch.arange(3, dtype=torch.float32).view(-1, *([1] * (p.dim() - 1))).expand_as(p))
    dec = sel.Decision(torch.tensor([[1], [2], [-1]]), torch.tensor([[1.0], [1.0], [0.0]]),
                       **sel._blank(3))
    W = sel.mixing_matrix(dec, 0.5)
    assert W.tolist() == [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.0, 0.0, 1.0]]
    model.mix_shared(W)
    enc = model.params["encoder.0.weight"]
    assert enc[:, 0, 0, 0, 0].tolist() == [0.5, 1.5, 2.0]
    assert model.params["head.0.weight"][:, 0, 0].tolist() == [0.0, 1.0, 2.0]   # phi stays local


def test_native_average_pens_weights():
    dec = sel.Decision(torch.tensor([[1, 2], [0, -1], [-1, -1]]),
                       torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.0, 0.0]]), **sel._blank(3))
    n = torch.tensor([10, 30, 60])
    W = sel.mixing_matrix(dec, 0.5, n, native_average=True)
    # PENS: sample-size weighted average over {k} and its peers; no peer -> keep own.
    assert W[0].tolist() == pytest.approx([0.1, 0.3, 0.6])
    assert W[1].tolist() == pytest.approx([0.25, 0.75, 0.0])
    assert W[2].tolist() == pytest.approx([0.0, 0.0, 1.0])
    # PFedDST: uniform average.
    assert sel.mixing_matrix(dec, 0.5, None, native_average=True)[0].tolist() == pytest.approx([1 / 3] * 3)


def test_macro_f1_and_accuracy_match_sklearn():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 10, (300,), generator=g)
    pred = torch.randint(0, 10, (4, 300), generator=g)
    pred[1] = torch.where(pred[1] > 6, 3, pred[1])        # some classes never predicted
    pred[2] = y                                             # perfect
    f1 = macro_f1(confusion_matrices(y, pred, 10))
    for c in range(4):
        assert float(f1[c]) == pytest.approx(f1_score(y.numpy(), pred[c].numpy(), average="macro"), abs=1e-12)
    # Subset with absent classes (sklearn averages over labels present in y_true or y_pred).
    ys = torch.tensor([[0, 0, 1, 1, 1]])
    ps = torch.tensor([[0, 1, 1, 1, 0]])
    assert float(macro_f1(confusion_matrices(ys, ps, 10))[0]) == pytest.approx(
        f1_score([0, 0, 1, 1, 1], [0, 1, 1, 1, 0], average="macro"))
    mask = torch.tensor([[True, True, False, False, True]])
    assert accuracy(ys, ps, mask).tolist() == pytest.approx([1 / 3])


def test_shards_are_disjoint_80_10_10():
    rng = np.random.default_rng(0)
    ds = ImageDataset(rng.integers(0, 255, (2000, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 2000),
                      np.zeros((10, 1, 28, 28), np.uint8), np.zeros(10, np.int64), 10, "fake")
    sh = make_shards(ds, 5, 0.5, seed=1)
    all_rows = []
    for k in range(5):
        tr = sh.train_index[k, :sh.n_train[k]].tolist()
        an = sh.anchor_index[k, :sh.n_anchor[k]].tolist()
        ev = sh.eval_index[k, :sh.n_eval[k]].tolist()
        n = len(tr) + len(an) + len(ev)
        assert len(an) == round(0.1 * n) and len(ev) == round(0.1 * n)
        all_rows += tr + an + ev
    assert sorted(all_rows) == list(range(2000))


def test_graphs_connected_seeded_and_ba_degree():
    g1, g2 = make_graph("er", 50, 7), make_graph("er", 50, 7)
    assert sorted(g1.edges) == sorted(g2.edges)
    import networkx as nx
    assert nx.is_connected(g1)
    ba = make_graph("ba", 50, 0)
    _, _, deg = neighbour_table(ba)
    # BA with m = 3 on 50 nodes has (50 - 3) * 3 = 141 edges: mean degree 5.64 (Sec. V-A).
    assert float(deg.to(torch.float64).mean()) == pytest.approx(5.64)
    with pytest.raises(InputError, match="graph"):
        make_graph("ring", 10, 0)


def test_config_presets_and_errors():
    root = Path(__file__).resolve().parents[1] / "configs"
    # the benchmark presets (configs/sage-selector.yaml is the runtime method's preset)
    presets = {p: yaml.safe_load(p.read_text()) for p in root.glob("sage-*.yaml")}
    presets = {p: doc for p, doc in presets.items() if doc.get("benchmark") == "sage"}
    assert len(presets) == 12
    for p, doc in presets.items():
        cfg = parse_config(doc)
        assert cfg.benchmark == "sage" and cfg.n_clients == 50 and cfg.rounds == 250
        assert p.stem == f"sage-{cfg.dataset}-{cfg.graph}-{cfg.alpha_dir:g}"
    with pytest.raises(InputError, match="option 'n_client'"):
        parse_config({"benchmark": "sage", "n_client": 5})
    with pytest.raises(InputError, match="selectors"):
        parse_config({"benchmark": "sage", "selectors": ["best"]})
    with pytest.raises(InputError, match="data_root"):
        cli_run({"benchmark": "sage", "dataset": "cifar10"}, rounds=1, tracking_uri="none")


def test_a_setting_is_taken_where_a_listed_selector_or_the_graph_reads_it():
    cfg = parse_config({"benchmark": "sage", "graph": "ba", "ba_m": 2, "er_p": 0.15, "selectors": ["RG", "PENS"],
                        "pens": {"top_m": 3}, "alpha_mix": 0.3})
    assert (cfg.ba_m, cfg.pens.top_m, cfg.alpha_mix) == (2, 3, 0.3)   # er_p at its default: no choice
    assert parse_config({"benchmark": "sage", "selectors": ["SAGE-OS"], "delta": 0.2, "lambda_cost": 0.01,
                         "stage_cost": "cumulative"}).stage_cost == "cumulative"
    with pytest.raises(InputError, match=r"^sage config: lambda_cost is used only with selectors 'SAGE-OS', "
                                         r"not \['SAGE-NF'\]: drop it or change selectors$"):
        parse_config({"benchmark": "sage", "selectors": ["SAGE-NF"], "delta": 0.2, "lambda_cost": 0.01})


def test_the_runtime_sage_method_refuses_a_setting_its_graph_or_selector_does_not_read():
    from federation.methods.sage_selector import SageSelectorParams

    assert SageSelectorParams(selector="pens", graph="er", er_p=0.5, pens={"top_m": 3}).er_p == 0.5
    for params, words in [({"er_p": 0.5}, "params.er_p is used only with graph 'er', not 'complete'"),
                          ({"selector": "rg", "pens": {"top_m": 3}},
                           "params.pens is used only with selector 'PENS', not 'RG': drop it or change params.selector"),
                          ({"selector": "aq128", "delta": 0.2}, "params.delta is used only with selector 'SAGE-NF'")]:
        with pytest.raises(ValueError, match=re.escape(words)):
            SageSelectorParams(**params)


def test_cifar10_path_on_fake_batches(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with (folder / name).open("wb") as fh:
            pickle.dump({b"data": rng.integers(0, 255, (60, 3072), dtype=np.uint8),
                         b"labels": rng.integers(0, 10, 60).tolist()}, fh)
    cfg = {"benchmark": "sage", "dataset": "cifar10", "data_root": str(tmp_path), "n_clients": 3,
           "graph": "ba", "ba_m": 1, "alpha_dir": 5.0, "selectors": ["RG", "SAGE-OS"]}
    res = cli_run(cfg, rounds=1, seeds=[0], output=tmp_path / "res.json", tracking_uri="none")
    assert [r["selector"] for r in res["table"]] == ["RG", "SAGE-OS"]
    assert json.loads((tmp_path / "res.json").read_text())["config"]["dataset"] == "cifar10"
    assert res["name"] == "sage-cifar10-ba-5"
    # 300 training images over 3 clients -> anchor pools of about 10 < 16: direct RG fallback.
    assert res["table"][1]["stop_distribution"]["no_anchor"] == 1.0


def test_same_seed_same_result(capsys):
    from etl.images import FASHION_MNIST_DIR
    assert FASHION_MNIST_DIR.is_dir(), "dataset-fashion-mnist missing (the Makefile installs it)"
    cfg = {"benchmark": "sage", "n_clients": 4, "graph": "ba", "ba_m": 2, "alpha_dir": 0.5,
           "train_samples": 1200, "test_samples": 200, "selectors": ["SAGE-OS"]}
    a = cli_run(cfg, rounds=2, seeds=[3], tracking_uri="none")
    assert capsys.readouterr().out == ""
    b = cli_run(cfg, rounds=2, seeds=[3], tracking_uri="none", progress=True)   # the bar changes nothing
    strip = lambda h: [{k: v for k, v in r.items() if k != "seconds_round"} for r in h]  # noqa: E731
    assert strip(a["runs"]["3"]["sage_os"]["history"]) == strip(b["runs"]["3"]["sage_os"]["history"])
    shown = capsys.readouterr().out
    assert "sage-fmnist-ba-0.5 runs" in shown and "1/1" in shown            # the (seed, selector) runs
    assert "seed 3 SAGE-OS rounds" in shown and "2/2" in shown              # the last one's rounds


def test_a_selector_alone_equals_it_in_the_preset(tmp_path):
    """A selector run on its own gives the figures it gives beside the others (its random draws
    depend on (seed, selector), the rest on the seed), which is what lets the paper-size grids run
    one selector at a time (benchmarks/sage_grid.py); and the grid's table reads such a result."""
    from benchmarks import sage_grid
    from etl.images import FASHION_MNIST_DIR
    assert FASHION_MNIST_DIR.is_dir(), "dataset-fashion-mnist missing (the Makefile installs it)"
    cfg = {"benchmark": "sage", "n_clients": 4, "graph": "er", "er_p": 0.9, "alpha_dir": 0.5,
           "train_samples": 800, "test_samples": 100, "eval_every": 2}
    both = cli_run({**cfg, "selectors": ["RG", "SAGE-OS"]}, rounds=3, seeds=[1], tracking_uri="none")
    alone = cli_run({**cfg, "selectors": ["SAGE-OS"]}, rounds=3, seeds=[1], tracking_uri="none",
                    output=tmp_path / "sage-os.json")
    strip = lambda h: [{k: v for k, v in r.items() if k != "seconds_round"} for r in h]  # noqa: E731
    assert strip(both["runs"]["1"]["sage_os"]["history"]) == strip(alone["runs"]["1"]["sage_os"]["history"])
    assert both["runs"]["1"]["sage_os"]["summary"]["global_acc"] == alone["runs"]["1"]["sage_os"]["summary"]["global_acc"]
    dst = sage_grid.result_path("er", "SAGE-OS", tmp_path)
    dst.parent.mkdir(parents=True)
    (tmp_path / "sage-os.json").rename(dst)
    lines = sage_grid.table("er", tmp_path).splitlines()
    s = alone["runs"]["1"]["sage_os"]["summary"]
    assert len(lines) == 3 and lines[2].startswith(f"| SAGE-OS | {s['global_acc']:.4f} | {s['macro_f1']:.4f} |")
    assert "| 0.4121 |" in lines[2]  # Table I's SAGE-OS accuracy beside it
    assert sage_grid.table("ba", tmp_path) == ""
    bad = sage_grid.result_path("ba", "RG", tmp_path)
    bad.parent.mkdir()
    bad.write_text("{}")
    with pytest.raises(ValueError, match="rg.json: not the results.json of a finished selector"):
        sage_grid.table("ba", tmp_path)


def test_stacked_adam_step_equals_per_client_torch_adam():
    """StackedAdam.step_rows on rows of a [K, P] buffer == torch.optim.Adam per client."""
    g = torch.Generator().manual_seed(0)
    k, width = 3, 7
    p = torch.randn(k, width, generator=g)
    opt = StackedAdam({"w": p}, lr=1e-2)
    refs = [torch.nn.Parameter(p[c].clone()) for c in range(k)]
    fused = [torch.optim.Adam([r], lr=1e-2, fused=True) for r in refs]
    plain_p = [torch.nn.Parameter(p[c].clone()) for c in range(k)]
    plain = [torch.optim.Adam([r], lr=1e-2) for r in plain_p]
    # clients 0..a-1 step (a prefix, as in train_steps): 3, 3, 1, 2 clients -> steps 4, 3, 2
    for a in (3, 3, 1, 2):
        grad = torch.randn(k, width, generator=g)
        opt.step_rows(p[:a], grad[:a], opt.m[:a], opt.v[:a], opt.steps[:a])
        for c in range(a):
            for ref, o in ((refs[c], fused[c]), (plain_p[c], plain[c])):
                ref.grad = grad[c].clone()
                o.step()
    assert opt.step_count.tolist() == [4.0, 3.0, 2.0]
    for c in range(k):
        assert torch.equal(p[c], refs[c].detach())                       # the same fused kernel
        torch.testing.assert_close(p[c], plain_p[c].detach(), atol=1e-7, rtol=1e-6)
        torch.testing.assert_close(opt.m[c], fused[c].state[refs[c]]["exp_avg"])


def test_a_batch_wider_than_every_shard_trains_as_that_shard():
    """batch_size 10^6 (one step of each client's whole shard, padding weighing 0) gives the very
    parameters of batch_size = the largest shard, without the padding's memory."""
    x, y = _data(60)
    index = torch.stack([torch.arange(30), torch.cat([torch.arange(30, 50), torch.zeros(10, dtype=torch.long)])])
    n_train = torch.tensor([30, 20])
    got = []
    for batch in (30, 10**6):
        model = StackedModel(TINY, 2, seed=0)
        model.local_epoch(x, y, index, n_train, batch, torch.Generator().manual_seed(0))
        got.append(model.params)
    for name in got[0]:
        assert torch.equal(got[0][name], got[1][name]), name


def test_train_steps_rejects_a_plan_with_a_gap():
    x, y = _data(50)
    model = StackedModel(TINY, 2, seed=0)
    plan = torch.tensor([[0, 1, -1, -1, 2, 3], [0, 1, 2, 3, 4, 5]])     # client 0: step, gap, step
    with pytest.raises(ValueError, match="non-empty batches must come first"):
        model.train_steps(x, y, torch.arange(50).repeat(2, 1), plan, 2)


def test_int8_evaluation_agrees_with_fp32_on_trained_fmnist_clients():
    """The int8 evaluation path counts only if >= 99.5 % of predictions equal fp32's (docs/sage.md)."""
    from etl.images import FASHION_MNIST_DIR, load_idx_dataset
    from federation.data.image_shards import subsample
    from federation.engine.image_model import FMNIST_SPEC
    from federation.images.int8 import predict_shared_int8

    torch.set_num_threads(1)
    assert FASHION_MNIST_DIR.is_dir(), "dataset-fashion-mnist missing (the Makefile installs it)"
    ds = subsample(load_idx_dataset(FASHION_MNIST_DIR, "fashion-mnist"), 2400, 1000, 0)
    sh = make_shards(ds, 4, 0.5, 0)
    model = StackedModel(FMNIST_SPEC, 4, seed=0)
    model.local_epoch(sh.x_train, sh.y_train, sh.train_index, sh.n_train, 64, torch.Generator().manual_seed(0))
    ref = model.predict_shared_inputs(sh.x_test)
    got = predict_shared_int8({n: v for n, v in model.params.items() if not n.startswith("decoder.")},
                              sh.x_test, chunk=300)
    assert got.shape == ref.shape == (4, 1000)
    assert float((got == ref).double().mean()) >= 0.995
    assert len(set(ref.flatten().tolist())) > 3          # trained clients, not a constant predictor
    cfg = parse_config({"benchmark": "sage", "eval_precision": "int8"})
    assert cfg.eval_precision == "int8"
    with pytest.raises(InputError, match="eval_precision"):
        parse_config({"benchmark": "sage", "eval_precision": "int4"})


def test_int8_weight_codes_cannot_saturate_int16_pairs():
    """u8 255 x the largest weight codes, all of one sign per input channel: the convolution is exact.

    Non-VNNI kernels (vpmaddubsw) add two u8 x s8 products into an int16 with saturation; codes
    |q| <= 63 keep a pair at 2 * 255 * 63 = 32130 <= 32767 (codes of 127 give ~1 % of the true sum
    there, 2 instead of 204 here).
    """
    import warnings

    from federation.images import int8

    groups, a = 2, 0.8 / 36                         # interior output 9 taps x (8 - 4) channels x a = 0.8
    w = torch.zeros(64, 16, 3, 3)
    w[:, :8] = a                                    # positive pairs
    w[:, 8::2] = -a                                 # negative products beside zeros
    previous, torch.backends.quantized.engine = torch.backends.quantized.engine, int8.ENGINE
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            mod = int8._qconv(w, torch.zeros(64), stride_groups=(1, groups))
            assert int(mod.weight().int_repr().abs().max()) == int8.WEIGHT_QMAX <= 32767 // (2 * 255)
            x = torch._make_per_tensor_quantized_tensor(torch.full((1, 32, 6, 6), 255, dtype=torch.uint8),
                                                        1.0 / 255.0, 0)
            out = mod(x.contiguous(memory_format=torch.channels_last)).int_repr()
    finally:
        torch.backends.quantized.engine = previous
    # exact: int32 sum 9 * 4 * 255 * 63 = 578340, times (1/255) (a/63) = 0.8 = 204 / 255, far from a rounding tie
    assert out[0, :, 1:-1, 1:-1].unique().tolist() == [204]


#: the emulated AVX2 machine (no AVX-512, no VNNI): ATen, oneDNN and MKL each capped
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def test_int8_evaluation_agrees_with_fp32_under_emulated_avx2():
    """The two int8 checks above, rerun in a fresh interpreter capped at AVX2: the non-VNNI kernels on any CPU.

    oneDNN's verbose log shows which kernel ran the u8 convolutions: an AVX2 one, never a VNNI one.
    """
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("DNNL_MAX_CPU_ISA", "DNNL_VERBOSE")}
    env.update(AVX2_ENV, ONEDNN_VERBOSE="1")
    here = Path(__file__).resolve()
    tests = [f"{here}::test_int8_evaluation_agrees_with_fp32_on_trained_fmnist_clients",
             f"{here}::test_int8_weight_codes_cannot_saturate_int16_pairs"]
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *tests],
                       cwd=here.parents[1], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    kernels = {ln.split(",")[6] for ln in p.stdout.splitlines()
               if ln.startswith("onednn_verbose") and ",exec,cpu,convolution," in ln and "src:u8" in ln}
    assert kernels and all("avx2" in k and "vnni" not in k for k in kernels), kernels
    assert "2 passed" in p.stdout


def test_flop_counts_match_torch_flop_counter():
    """The FLOP floor's counts (hand-derived in ``layer_macs``) equal torch's FlopCounterMode on the module."""
    from torch.utils.flop_counter import FlopCounterMode

    from federation.engine.image_model import (
        CIFAR10_SPEC,
        FMNIST_SPEC,
        layer_macs,
        predict_flops_per_image,
        train_flops_per_image,
    )

    assert sum(layer_macs(FMNIST_SPEC).values()) == 911_040
    assert predict_flops_per_image(FMNIST_SPEC) == 2 * 359_104
    for spec in (FMNIST_SPEC, CIFAR10_SPEC, TINY):
        model = EncoderDecoderClassifier(spec)
        x = torch.rand(3, spec.in_channels, spec.image_size, spec.image_size)
        with FlopCounterMode(display=False) as train:
            logits, recon = model(x)
            (logits.sum() + recon.sum()).backward()
        with FlopCounterMode(display=False) as predict:
            model.classify(x)
        assert train.get_total_flops() == 3 * train_flops_per_image(spec)
        assert predict.get_total_flops() == 3 * predict_flops_per_image(spec)

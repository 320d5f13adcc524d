"""The peer benchmark's workload and its Flower-free path (no timing is asserted)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from benchmarks import bench_flower as bf


@pytest.fixture(autouse=True)
def _keep_threads():
    """The benchmarks set torch's thread count; restore it for the other tests."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_workload_is_the_issue_one_and_deterministic():
    a, b = bf.client_data(4, seed=1), bf.client_data(4, seed=1)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["x_train"], bf.client_data(5, seed=1)["x_train"])
    assert a["x_train"].shape == (250, 60) and a["x_val"].shape == (30, 60) and a["x_train"].dtype == np.float32
    # positive rate: E[sigmoid(z - 2.2)], z ~ N(0, 0.5^2), by quadrature over the normal density
    z = np.linspace(-4, 4, 4001)
    expect = np.trapezoid(1 / (1 + np.exp(-(0.5 * z - 2.2))) * np.exp(-z * z / 2) / math.sqrt(2 * math.pi), z)
    ys = np.concatenate([bf.client_data(i)["y_train"] for i in range(40)])  # 10,000 labels
    assert abs(ys.mean() - expect) < 4 * math.sqrt(expect * (1 - expect) / ys.size)
    data = bf.federated_data(3, seed=1)
    assert torch.equal(data.splits["train"].x[2], torch.from_numpy(bf.client_data(2, seed=1)["x_train"]))
    assert data.n_train.tolist() == [250, 250, 250] and bool(data.splits["val"].mask.all())


def test_benchmark_skips_flower_cleanly(monkeypatch):
    monkeypatch.setattr(bf, "flower_available", lambda: False)
    doc = bf.main(["--clients", "3", "--loop-rounds", "2", "--ours-rounds", "2", "--threads", "1"])
    assert doc["flower"] is None and "not installed" in doc["flower_skipped"]
    assert "abps_x_vs_flower" not in doc
    # both passes of each implementation ran on the same rows: same seed -> same AUROC
    assert doc["abps"]["final_val_auroc_mean"][0] == doc["abps"]["final_val_auroc_mean"][1]
    assert doc["loop"]["final_val_auroc_mean"][0] == doc["loop"]["final_val_auroc_mean"][1]
    assert math.isclose(doc["loop_x_vs_abps"], doc["loop"]["median_s_per_round"] / doc["abps"]["median_s_per_round"])


def test_scale_worker_runs_both_methods_small():
    """The scale benchmark's per-method worker on a tiny federation (in this process)."""
    from benchmarks.bench_scale import _worker

    out = _worker(["fedavg", "abps"], 12, 2, seed=1, threads=1)
    assert [r["method"] for r in out] == ["fedavg", "abps"]
    for r in out:
        assert r["centers"] == 12 and r["rounds"] == 2 and len(r["rounds_s"]) == 2
        assert r["peak_rss_gb"] >= r["rss_after_data_gb"] > 0 and r["end_of_run_s"] >= 0
        assert 0.0 <= r["final_val_auroc_mean"] <= 1.0


def test_peer_client_auroc_equals_sklearn_and_data_is_cached():
    """The peers' per-client AUROC (rank-based) equals scikit-learn's on the workload's rows,
    ties included, and a client's rows are built once per process."""
    from sklearn.metrics import roc_auc_score

    torch.manual_seed(0)
    model = bf.make_model()
    for i in range(6):
        c = bf.client_tensors(i, 3)
        assert c is bf.client_tensors(i, 3)  # cached, not regenerated
        y = c["y_val"]
        with torch.no_grad():
            s = model.eval()(c["x_val"]).squeeze(-1)
        got = bf.client_auroc(model, c["x_val"], y)
        if y.min() == y.max():
            assert math.isnan(got)
        else:
            assert got == pytest.approx(roc_auc_score(y.numpy(), s.numpy()), abs=1e-12)
    # ties: scores rounded to one decimal (many equal values)
    x = bf.client_tensors(0, 3)["x_train"][:40]
    y = torch.tensor([0.0, 1.0] * 20)

    class Rounded(torch.nn.Module):
        def forward(self, v):
            return torch.round(v[:, :1] * 2) / 2

    assert bf.client_auroc(Rounded(), x, y) == pytest.approx(
        roc_auc_score(y.numpy(), (torch.round(x[:, 0] * 2) / 2).numpy()), abs=1e-12)


def test_run_forwards_arguments_after_double_dash(monkeypatch, tmp_path, capsys):
    """``python -m benchmarks.run engine -- --centers 6 --rounds 1``: a reduced run of the selected
    benchmark only, whose printout names the target, the ratio and that n = 6 is not its workload."""
    from benchmarks import run

    monkeypatch.chdir(tmp_path)  # bench_engine writes bench_out/ in the working directory
    assert run.main(["engine", "--", "--centers", "6", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "== benchmarks.bench_engine" in out and "== benchmarks.bench_abps" not in out
    assert "target <= 0.145 s" in out and "not the target's workload: n = 6, 1 thread(s)" in out
    assert (tmp_path / "bench_out" / "bench_engine.json").exists()


def test_a_benchmark_named_exactly_is_selected_alone():
    """``sage`` is bench_sage only, not also bench_sage_kernels (whose options differ); a word that
    names no benchmark selects every module containing it."""
    from benchmarks import run

    names = run.discover()
    assert run.select(names, ["sage"]) == ["benchmarks.bench_sage"]
    assert run.select(names, ["sage_kernels", "etl"]) == ["benchmarks.bench_etl", "benchmarks.bench_sage_kernels"]
    assert run.select(names, ["sag"]) == ["benchmarks.bench_sage", "benchmarks.bench_sage_kernels"]
    assert run.select(names, []) == names


def test_table1_benchmark_refuses_unknown_methods_before_any_work(tmp_path):
    from benchmarks import bench_table1

    with pytest.raises(SystemExit, match="not in .*table1.yaml: no-such-method"):
        bench_table1.main(["--methods", "fedavg,no-such-method", "--workdir", str(tmp_path / "w")])
    assert not (tmp_path / "w").exists()  # nothing was built


def test_im2col_candidate_equals_per_model_convolutions():
    """The candidate formulation bench_sage_kernels times is the same function as the engine's
    layers: per model, F.conv2d / F.conv_transpose2d and their gradients (float64, summation order
    only), and the whole SAGE model and LeNet-5 as the grouped engine computes them."""
    import torch.nn.functional as F

    from benchmarks import bench_sage_kernels as bk
    from federation.engine.image_model import FMNIST_SPEC, grouped_forward, init_stacked_params
    from federation.gossip.model import LENET5_LAYOUT, forward_stacked, init_stacked

    g = torch.Generator().manual_seed(0)
    d = torch.float64
    for cin, cout, size, k, stride, pad in [(1, 4, 28, 3, 2, 1), (4, 8, 14, 3, 2, 1), (3, 5, 12, 5, 1, 0)]:
        x = torch.randn(3, 2, size, size, cin, dtype=d, generator=g, requires_grad=True)
        w = torch.randn(3, cout, cin, k, k, dtype=d, generator=g, requires_grad=True)
        b = torch.randn(3, cout, dtype=d, generator=g, requires_grad=True)
        got = bk.bmm_conv2d(x, w, b, stride, pad)
        ref = torch.stack([F.conv2d(x[i].permute(0, 3, 1, 2), w[i], b[i], stride=stride, padding=pad).permute(0, 2, 3, 1)
                           for i in range(3)])
        go = torch.randn(ref.shape, dtype=d, generator=g)
        for u, v in zip((got, *torch.autograd.grad(got, (x, w, b), go)), (ref, *torch.autograd.grad(ref, (x, w, b), go))):
            torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)
    x = torch.randn(3, 2, 7, 7, 4, dtype=d, generator=g, requires_grad=True)
    w = torch.randn(3, 4, 2, 4, 4, dtype=d, generator=g, requires_grad=True)
    b = torch.randn(3, 2, dtype=d, generator=g, requires_grad=True)
    got = bk.bmm_conv_transpose2d(x, w, b, 2, 1)
    ref = torch.stack([F.conv_transpose2d(x[i].permute(0, 3, 1, 2), w[i], b[i], stride=2, padding=1).permute(0, 2, 3, 1)
                       for i in range(3)])
    go = torch.randn(ref.shape, dtype=d, generator=g)
    for u, v in zip((got, *torch.autograd.grad(got, (x, w, b), go)), (ref, *torch.autograd.grad(ref, (x, w, b), go))):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)
    p = {k: v.double() + 0.01 * torch.randn(v.shape, dtype=d, generator=g)
         for k, v in init_stacked_params(FMNIST_SPEC, 3, 0).items()}
    xs = torch.rand(3, 4, 28, 28, 1, dtype=d, generator=g)
    logits, recon = bk.bmm_sage_forward(p, xs)
    ref_logits, ref_recon = grouped_forward(p, xs.permute(1, 0, 4, 2, 3).reshape(4, 3, 28, 28))
    torch.testing.assert_close(logits, ref_logits, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(recon, ref_recon.view(4, 3, 28, 28, 1).transpose(0, 1), rtol=1e-12, atol=1e-12)
    views = LENET5_LAYOUT.views(init_stacked(3, g, dtype=d))
    xl = torch.rand(3, 4, 1, 28, 28, dtype=d, generator=g)
    torch.testing.assert_close(bk.bmm_lenet_forward(views, xl), forward_stacked(views, xl), rtol=1e-12, atol=1e-12)


def test_device_benchmark_without_the_device_measures_nothing_and_refuses_a_bad_name(capsys, tmp_path):
    from benchmarks import bench_device

    out = tmp_path / "device.json"
    if not torch.cuda.is_available():
        assert bench_device.main(["--device", "cuda", "--out", str(out)]) == {}
        assert "no CUDA device" in capsys.readouterr().out and not out.exists()
    with pytest.raises(SystemExit) as err:
        bench_device.main(["--device", "gpu0"])
    assert err.value.code == 2 and "--device: 'gpu0' is not a torch device" in capsys.readouterr().err

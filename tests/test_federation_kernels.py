"""Fused CPU kernels of the engine step (federation/engine/kernels.py) against the eager PyTorch ops
they replace, the engine's fused step against its eager step, and the fallback selection.

Element-wise outputs are the same float operations in the same order as the eager ops, so they
are compared bit for bit (``torch.equal``); the bias gradients add the rows in another order
than ``torch.sum`` (which sums in vectorised partial sums), so they are compared within float
rounding of a sum of at most 128 terms.
"""

from __future__ import annotations

import platform
import warnings

import pytest
import torch

from federation.core.config import EngineConfig
from federation.data.synthetic import write_fedprox_cohort
from federation.data.tensors import FederatedData
from federation.engine import kernels
from federation.engine.mlp import AdamState, RandomStreams, StackedEngine, keep_from_bits
from tests.numerics import assert_adam_tracks

K_DROP = round(0.2 * 65536)
SCALE = 65536 / (65536 - K_DROP)

needs_kernels = pytest.mark.skipif(
    not kernels.available(), reason="engine kernels do not build here (fallback tested below)")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("kern") / "c"
    write_fedprox_cohort(d, n_centers=7, alpha=0.5, beta=0.5, seed=3, mean_size=150, size_sigma=1.0, shared=0.8)
    return FederatedData.from_cohort(d)


def _tensors(c=5, w=37, h1=24, h2=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    z1 = torch.randn(c, w, h1, generator=g)
    z2 = torch.randn(c, w, h2, generator=g)
    b1, b2 = torch.randn(c, h1, generator=g), torch.randn(c, h2, generator=g)
    # the step's draws are [a, rows, h1 + h2]; a segment is a strided slice of them
    bits = RandomStreams(4).dropout_bits(0, 1, 2, c + 2, w + 5, h1 + h2)[1 : c + 1, :w]
    return z1, z2, b1, b2, bits


@needs_kernels
def test_bias_relu_drop_equals_eager_ops_bit_for_bit():
    z1, z2, b1, b2, bits = _tensors()
    keep1, keep2 = keep_from_bits(bits, (z1.shape[-1], z2.shape[-1]), K_DROP)
    thr = K_DROP - 32768
    for z, b, col, keep in ((z1, b1, 0, keep1), (z2, b2, z1.shape[-1], keep2)):
        eager = (z + b.unsqueeze(1)).relu_().mul_(keep)
        fused = kernels.bias_relu_drop_(z.clone(), b, bits, col, thr)[0]
        assert torch.equal(fused, eager)
        assert 0.15 < float((keep == 0).float().mean()) < 0.25  # the draws really drop ~20 %
        no_drop = kernels.bias_relu_drop_(z.clone(), b)[0]
        assert torch.equal(no_drop, (z + b.unsqueeze(1)).relu_())
    # NaN propagates as in the eager ops (relu(NaN) = NaN, NaN * 0 = NaN): divergence stays visible
    z = z1.clone()
    z[0, 0, :] = float("nan")
    out = kernels.bias_relu_drop_(z, b1, bits, 0, thr)[0]
    assert bool(out[0, 0].isnan().all()) and not bool(out[1:].isnan().any())


@needs_kernels
def test_backward_kernels_equal_threshold_backward_and_sums():
    z1, z2, b1, b2, bits = _tensors(seed=1)
    thr = K_DROP - 32768
    h1 = kernels.bias_relu_drop_(z1, b1, bits, 0, thr)[0]
    h2 = kernels.bias_relu_drop_(z2, b2, bits, z1.shape[-1], thr)[0]
    g = torch.Generator().manual_seed(2)
    dl = torch.randn(h2.shape[:2], generator=g)
    v = torch.randn(h2.shape[0], h2.shape[2], generator=g)
    q, gb2, none = kernels.outer_relu_grad(dl, v, h2, SCALE)
    assert none is None
    q_ref = torch.ops.aten.threshold_backward(dl.unsqueeze(-1) * v.unsqueeze(1), h2, 0.0)
    assert torch.equal(q, q_ref)
    assert torch.allclose(gb2, q_ref.sum(1) / SCALE, rtol=1e-5, atol=1e-5)
    q2, gb2b, gw3 = kernels.outer_relu_grad(dl, v, h2, SCALE, out_grad=True)
    assert torch.equal(q2, q) and torch.equal(gb2b, gb2)
    assert torch.allclose(gw3, torch.bmm(h2.transpose(1, 2), dl.unsqueeze(-1)).squeeze(-1) * SCALE,
                          rtol=1e-5, atol=1e-5)
    # by hand for one center and unit: only units with h2 > 0 contribute
    c, j = 2, 3
    on = h2[c, :, j] > 0
    assert float(gb2[c, j]) == pytest.approx(float((dl[c] * v[c, j] * on).double().sum() / SCALE), rel=1e-5)
    gin = torch.randn(h1.shape, generator=g)
    g_ref = torch.ops.aten.threshold_backward(gin, h1, 0.0)
    gb1 = kernels.relu_grad_(gin, h1)
    assert torch.equal(gin, g_ref)
    assert torch.allclose(gb1, g_ref.sum(1), rtol=1e-5, atol=1e-5)


@needs_kernels
def test_pcg64_words_equal_numpy_random_raw():
    """The dropout draws: the kernels' PCG64 gives NumPy's ``random_raw`` words exactly."""
    import numpy as np

    for seed, n in ((0, 1), (12345, 1000), (2**62 + 7, 4097)):
        bg = np.random.PCG64(seed)
        st = bg.state["state"]
        assert np.array_equal(kernels.pcg64_words(st["state"], st["inc"], n), bg.random_raw(n))


@needs_kernels
def test_kernels_refuse_wrong_layouts():
    z1, _, b1, _, bits = _tensors()
    with pytest.raises(ValueError, match="contiguous float32"):
        kernels.bias_relu_drop_(z1.transpose(0, 1), b1)
    with pytest.raises(ValueError, match="bits"):
        kernels.bias_relu_drop_(z1.clone(), b1, bits.to(torch.int32), 0, 0)
    with pytest.raises(ValueError, match="b: expected shape"):
        kernels.bias_relu_drop_(z1.clone(), b1[:, :3].contiguous())


@needs_kernels
def test_fused_step_equals_eager_step(data, step_inputs):
    """The engine's fused step gives the eager step's gradients (partial rows, dropout, none)."""
    eng = StackedEngine(data, EngineConfig(), seed=4)
    s = step_inputs(eng, data)
    p, x, y, real, rows, c, w, units = s.p, s.x, s.y, s.real, s.rows, s.c, s.w, s.units
    bits = eng.streams.dropout_bits(0, 0, 0, c, w, units)
    keep = keep_from_bits(bits, eng.hidden, K_DROP)
    for r, use_drop in ((rows, True), (None, True), (rows, False)):
        re = real if r is not None else torch.full((c,), w)
        ref = eng._grads(p, x, y, r, re, keep if use_drop else None, SCALE)
        fused = eng._grads_fused(p, x, y, r, re, bits if use_drop else None, K_DROP, SCALE)
        for k in p:  # the logits, bias and w3 sums add their terms in another order: float rounding
            assert torch.allclose(fused[k], ref[k], atol=1e-7, rtol=1e-5), (k, float((fused[k] - ref[k]).abs().max()))
        # the logits (fused into layer 2's pass) by hand for one center and row
        h2, logits = kernels.bias_relu_drop_(
            torch.bmm(kernels.bias_relu_drop_(torch.bmm(x, p["w1"]), p["b1"])[0], p["w2"]), p["b2"], None, 0, 0,
            p["w3"].squeeze(-1).contiguous(), p["b3"])
        ref_logit = float((h2[1, 2].double() * p["w3"][1, :, 0].double()).sum() + p["b3"][1, 0].double())
        assert float(logits[1, 2]) == pytest.approx(ref_logit, rel=1e-5, abs=1e-6)


def _train(data, rounds=2, seed=6):
    eng = StackedEngine(data, EngineConfig(batch_size=64), seed=seed)
    p = eng.init_params()
    s = AdamState.zeros_like(p)
    for r in range(rounds):
        eng.train_round(p, s, r)
    return p


@needs_kernels
def test_fused_and_eager_training_agree_and_repeat(data, monkeypatch):
    """Same seed, same result on each path; after two rounds the two paths agree as Adam lets two
    gradients that differ by float rounding agree (tests/numerics.py)."""
    monkeypatch.setenv("ABPS_KERNELS", "cpp")
    a, b = _train(data), _train(data)
    assert all(torch.equal(a[k], b[k]) for k in a)
    monkeypatch.setenv("ABPS_KERNELS", "torch")
    e = _train(data)
    cfg = EngineConfig()
    steps = 2 * cfg.local_epochs * StackedEngine(data, EngineConfig(batch_size=64), seed=3).steps_per_epoch()
    assert_adam_tracks(a, e, steps, cfg.lr, cfg.betas)
    assert not torch.equal(a["w1"], _train(data, seed=7)["w1"])


def test_fallback_when_the_build_fails(data, monkeypatch, tmp_path):
    """No compiler: ``auto`` warns once and trains on the eager path (same parameters as
    ``torch``); ``cpp`` refuses with the reason; a bad ``ABPS_KERNELS`` value is refused."""
    monkeypatch.setenv("ABPS_KERNELS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    kernels.reset()
    try:
        monkeypatch.setenv("ABPS_KERNELS", "auto")
        with pytest.warns(RuntimeWarning, match="no C..? compiler|PyTorch path"):
            assert kernels.library() is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warned once, not again
            assert not kernels.available()
            fallback = _train(data)
        monkeypatch.setenv("ABPS_KERNELS", "torch")
        eager = _train(data)
        assert all(torch.equal(fallback[k], eager[k]) for k in eager)
        monkeypatch.setenv("ABPS_KERNELS", "cpp")
        with pytest.raises(RuntimeError, match="ABPS_KERNELS=cpp.*compiler"):
            kernels.library()
        monkeypatch.setenv("ABPS_KERNELS", "fast")
        with pytest.raises(ValueError, match="ABPS_KERNELS='fast'"):
            kernels.library()
        assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.so"))
    finally:
        monkeypatch.undo()
        kernels.reset()


def test_build_is_cached_and_atomic(monkeypatch, tmp_path):
    """A build lands in the cache under a key and is reused (no second compile); a failing
    compiler leaves no library behind. Needs a compiler; without one, build() must say so."""
    monkeypatch.setenv("ABPS_KERNELS_CACHE", str(tmp_path))
    if kernels._compiler() is None:
        with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
            kernels.build()
        return
    lib = kernels.build()
    assert lib.parent.parent == tmp_path and lib.exists()
    stamp = lib.stat().st_mtime_ns
    assert kernels.build() == lib and lib.stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert [p.name for p in lib.parent.iterdir() if p.suffix == ".so"] == [lib.name]  # no temp files
    monkeypatch.setenv("CXX", "false")  # a "compiler" that fails
    with pytest.raises(RuntimeError):
        kernels.build(force=True)
    assert lib.stat().st_mtime_ns == stamp


def test_signature_drift_does_not_compile(monkeypatch, tmp_path):
    """The generated header declares every function of kernels.SIGNATURES, so a definition in the
    .cpp whose parameters differ from the table the ctypes calls use is a compile error."""
    src = kernels.SOURCE_PATH.read_text()
    drifted = src.replace("int64_t cs, int64_t rs, int32_t thr", "int64_t cs, int64_t rs, int64_t thr", 1)
    assert drifted != src, "the source no longer has the signature this test edits"
    path = tmp_path / "abps_kernels.cpp"
    path.write_text(drifted)
    monkeypatch.setattr(kernels, "SOURCE_PATH", path)
    monkeypatch.setenv("ABPS_KERNELS_CACHE", str(tmp_path / "cache"))
    # without a compiler the build must say so instead (the no-compiler CI pass checks that path)
    expected = "conflicting declaration|abps_bias_relu_drop" if kernels._compiler() else "no C\\+\\+ compiler"
    with pytest.raises(RuntimeError, match=expected):
        kernels.build()
    assert kernels.header().count("(") == len(kernels.SIGNATURES)
    for name in kernels.SIGNATURES:
        assert f" {name}(" in kernels.header() and f"{name}(" in src


@needs_kernels
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 micro-architecture levels only")
def test_portable_build_gives_the_same_values(data, monkeypatch, tmp_path):
    """``ABPS_KERNELS_MARCH=x86-64-v3`` (one build for every AVX2 machine) computes the same
    floats as the native build: no fused multiply-add and the lanes summed in one fixed order, so
    a wider vector unit changes no rounding."""
    monkeypatch.setenv("ABPS_KERNELS", "cpp")
    native = _train(data)
    monkeypatch.setenv("ABPS_KERNELS_MARCH", "x86-64-v3")
    monkeypatch.setenv("ABPS_KERNELS_CACHE", str(tmp_path))
    kernels.reset()
    try:
        info = kernels.build_info()
        assert "-march=x86-64-v3" in info["kernel_flags"] and info["engine_step"] == "fused"
        portable = _train(data)
        assert all(torch.equal(native[k], portable[k]) for k in native)
        monkeypatch.setenv("ABPS_KERNELS_MARCH", "x86-64-v3; rm -rf /")
        with pytest.raises(ValueError, match="ABPS_KERNELS_MARCH"):
            kernels.flags()
    finally:
        monkeypatch.undo()
        kernels.reset()

"""Stacked engine vs the per-center loop; per-center streams; masking; determinism."""

from __future__ import annotations

import json
import math

import pytest
import torch

from federation.core.config import EngineConfig
from federation.data.synthetic import write_fedprox_cohort
from federation.data.tensors import FederatedData
from federation.engine.mlp import AdamState, RandomStreams, StackedEngine
from federation.engine.reference import LoopTrainer
from tests.numerics import assert_adam_tracks


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("eng") / "c"
    # sizes spread from 40 to several hundred rows: several steps, partial last batches
    write_fedprox_cohort(d, n_centers=9, alpha=0.5, beta=0.5, seed=7, mean_size=180, size_sigma=1.0, shared=0.8)
    return FederatedData.from_cohort(d)


@pytest.mark.parametrize("path", ["auto", "torch"])
def test_stacked_equals_per_center_loop(data, path, monkeypatch):
    """Both step paths (fused kernels where they build: ``auto``; eager PyTorch: ``torch``)
    equal the per-center loop."""
    monkeypatch.setenv("ABPS_KERNELS", path)
    torch.manual_seed(0)
    cfg = EngineConfig(batch_size=64)
    eng = StackedEngine(data, cfg, seed=3)
    params = eng.init_params()
    state = AdamState.zeros_like(params)
    loop = LoopTrainer(eng, params)
    for r in range(2):
        eng.train_round(params, state, r)
        loop.train_round(r)
    ref = loop.stacked()
    for k in params:
        assert torch.allclose(params[k], ref[k], atol=2e-5, rtol=1e-4), (k, float((params[k] - ref[k]).abs().max()))
    # each center made exactly ceil(n_i / B) Adam steps per epoch, 2 epochs, 2 rounds
    expect = torch.tensor([2 * 2 * math.ceil(int(n) / 64) for n in data.n_train])
    assert torch.equal(state.t, expect)
    # every loop optimizer agrees on its step count
    assert [int(o.state[o.param_groups[0]["params"][0]]["step"]) for o in loop.opts] == expect.tolist()


def test_permutations_are_per_center_and_valid():
    rs = RandomStreams(5)
    n_rows = torch.tensor([5, 3, 7])
    perm = rs.permutations(n_rows, 7, round_idx=2, epoch=1)
    for i, n in enumerate(n_rows.tolist()):
        assert sorted(perm[i, :n].tolist()) == list(range(n))
        assert perm[i, n:].tolist() == list(range(n, 7))
    # center 1's stream does not depend on which other centers exist
    alone = rs.permutations(torch.tensor([3]), 7, 2, 1, centers=torch.tensor([1]))
    assert torch.equal(alone[0], perm[1])
    assert not torch.equal(rs.permutations(n_rows, 7, 3, 1), perm)


def test_permutations_equal_the_dense_key_sort():
    """The packed computation (keys of real rows only) gives the dense definition's result: every
    position of center i keyed hash(c_i ^ r) if real, 2^32 + r if padding, stably sorted."""
    from federation.core.seeding import M32, hash32, mix_seed

    rs = RandomStreams(3)
    g = torch.Generator().manual_seed(0)
    n_rows = (torch.rand(40, generator=g) ** 3 * 300).long()
    n_rows[0], n_rows[5], n_rows[6] = 300, 0, 1
    centers = torch.randperm(40, generator=g)
    base = hash32(torch.tensor([mix_seed(3, 2, 1) & M32], dtype=torch.int64))
    c = hash32(base ^ centers)
    r = torch.arange(300)
    key = hash32(hash32(c.unsqueeze(1) ^ r.unsqueeze(0)) ^ 0x5BD1E995)
    key = torch.where(r.unsqueeze(0) >= n_rows.unsqueeze(1), (1 << 32) + r.unsqueeze(0), key)
    dense = torch.argsort(key, dim=1, stable=True)
    assert torch.equal(rs.permutations(n_rows, 300, 2, 1, centers=centers), dense)


def test_dropout_rate_and_scale():
    d = RandomStreams(1).dropout_scale(0, 0, 0, 4, 128, 192, 0.2)
    k = round(0.2 * 65536)
    assert torch.unique(d).tolist() == [0.0, pytest.approx(65536 / (65536 - k))]
    assert abs(float((d == 0).double().mean()) - k / 65536) < 0.005
    assert abs(float(d.double().mean()) - 1.0) < 0.01  # inverted dropout keeps the mean


def test_engine_is_deterministic(data):
    def run():
        eng = StackedEngine(data, EngineConfig(), seed=9)
        p = eng.init_params()
        s = AdamState.zeros_like(p)
        eng.train_round(p, s, 0)
        return p

    a, b = run(), run()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = StackedEngine(data, EngineConfig(), seed=10)
    pc = c.init_params()
    c.train_round(pc, AdamState.zeros_like(pc), 0)
    assert not torch.equal(a["w1"], pc["w1"])


def test_hand_gradients_equal_autograd(data, step_inputs):
    """The no-autograd step (ReLU/dropout folded, scale moved into the weights) gives autograd's
    gradients, with partial rows and dropout."""
    eng = StackedEngine(data, EngineConfig(), seed=4)
    s = step_inputs(eng, data)
    p, x, y, real, rows, c, w, units = s.p, s.x, s.y, s.real, s.rows, s.c, s.w, s.units
    keep = eng.streams.keep_masks(0, 0, 0, c, w, eng.hidden, 0.2)
    scale = 65536 / (65536 - round(0.2 * 65536))
    # the 0/1 masks are the non-zeros of the dropout multipliers the per-center loop uses
    assert torch.equal(torch.cat(keep, -1) * scale, eng.streams.dropout_scale(0, 0, 0, c, w, units, 0.2))
    for r, dr in ((rows, keep), (None, keep), (rows, None)):
        re = real if r is not None else torch.full((c,), w)
        hand = eng._grads(p, x, y, r, re, dr, scale)
        ref = eng._grads_autograd(p, x, y, r, re, dr, scale)
        for k in p:
            assert torch.allclose(hand[k], ref[k], atol=1e-6, rtol=1e-4), (k, float((hand[k] - ref[k]).abs().max()))


def _round(data, hook=None, seed=5):
    eng = StackedEngine(data, EngineConfig(batch_size=64), seed=seed)
    p = eng.init_params()
    s = AdamState.zeros_like(p)
    eng.train_round(p, s, 0, hook)
    return p, s


def _zero_loss(p, b):
    return torch.zeros(b.x.shape[0])


def test_local_loss_path_matches_plain_path(data, monkeypatch):
    """A zero local loss (autograd path) trains exactly as no local loss: with the same gradient
    function on both sides the round is bit-identical on any CPU (adding an exact 0 changes no
    float), so the local-loss plumbing (batches, masks, Adam) is the plain path's."""
    monkeypatch.setenv("ABPS_KERNELS", "torch")
    monkeypatch.setattr(StackedEngine, "_grads", lambda self, p, x, y, rows, real, keep, scale:
                        self._grads_autograd(p, x, y, rows, real, keep, scale))
    a, b = _round(data)[0], _round(data, _zero_loss)[0]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_hand_gradient_round_tracks_autograd_round(data):
    """A whole round on the hand-written step (fused or eager) vs the autograd step: their
    gradients differ by float32 rounding (test_hand_gradients_equal_autograd), which Adam turns
    into what :func:`tests.numerics.assert_adam_tracks` allows."""
    (a, sa), (b, _) = _round(data), _round(data, _zero_loss)
    cfg = EngineConfig()
    assert_adam_tracks(a, b, int(sa.t.max()), cfg.lr, cfg.betas)
    assert not torch.equal(a["w1"], _round(data, seed=6)[0]["w1"])   # the check can tell runs apart


def test_segment_cap_does_not_change_training(data):
    """Splitting a step into more batched computations (``max_segment``, for memory at large n)
    gives the same parameters: masks and rows are per center, not per segment."""
    out = []
    for cap in (2048, 2):
        eng = StackedEngine(data, EngineConfig(batch_size=64), seed=8)
        eng.max_segment = cap
        p = eng.init_params()
        eng.train_round(p, AdamState.zeros_like(p), 0)
        out.append(p)
    for k in out[0]:
        assert torch.allclose(out[0][k], out[1][k], atol=1e-6, rtol=1e-5), k


def _padded_copy(fd: FederatedData) -> FederatedData:
    """The same federation with every split built padded (``SplitTensors(x, y, mask, n, raw)``),
    as before the packed layout: the engine then reads the padded ``x``."""
    from dataclasses import replace

    from federation.data.tensors import SplitTensors

    splits = {k: SplitTensors(s.x.clone(), s.y.clone(), s.mask.clone(), s.n.clone(), s.raw.clone())
              for k, s in fd.splits.items()}
    return replace(fd, splits=splits)


def test_packed_layout_holds_the_padded_values(data):
    for s in data.splits.values():
        n_real = int(s.n.sum())
        assert s.packed_x.shape == (n_real + 1, data.d) and not s.packed_x[-1].any()
        x = s.x  # padded view built from the packed rows
        assert torch.equal(x[s.mask], s.packed_x[:-1]) and not x[~s.mask].any()
        assert torch.equal(s.raw_packed[:-1].nan_to_num(-1e300), s.raw[s.mask].nan_to_num(-1e300))  # NaN = missing
        assert s.raw[~s.mask].isnan().all() and s.raw_packed[-1].isnan().all()
        centers = torch.tensor([4, 0, 8, 4])
        for width in (1, 17, s.mask.shape[1]):
            s._x = None  # gather from the packed rows ...
            packed = s.rows(centers, width)
            _ = s.x  # ... and from the padded tensor
            assert torch.equal(packed, s.rows(centers, width))
            assert torch.equal(packed, x[centers, :width])


def test_packed_and_padded_runs_are_identical(data):
    from federation.core.config import build_config
    from federation.methods import get_method
    from federation.run.runner import run_one

    padded = _padded_copy(data)
    for s in padded.splits.values():
        assert s._x is not None and s._packed is None
    for name in ("fedavg", "abps"):
        cfg = build_config(name, get_method(name).default_config, None, rounds=2)
        a, b = run_one(cfg, data, 5), run_one(cfg, padded, 5)
        # bit for bit, an undefined figure (NaN: a calibration fit on too few events) as well
        assert json.dumps([a.history, a.per_center], sort_keys=True) == json.dumps([b.history, b.per_center],
                                                                                 sort_keys=True)


def test_blockwise_numeric_fit_equals_whole_split(data):
    """Per-center statistics fitted on blocks of centers (each padded to its own largest center)
    equal the fit on the whole padded split, bit for bit; so does the blockwise encoding."""
    import numpy as np

    from federation.core.config import DataConfig
    from federation.data.tensors import _fit_numeric, encode_numeric, numeric_statistics

    tr = data.splits["train"]
    whole = numeric_statistics(tr.raw, tr.mask, DataConfig(), "per-center")
    blocks = list(tr.padded_blocks(max_cells=300))
    assert len(blocks) > 3 and blocks[-1][1] == data.n_centers
    assert all(m.shape[1] == int(tr.n[lo:hi].max()) for lo, hi, _, m in blocks)
    orig = tr.padded_blocks.__func__.__defaults__
    try:
        type(tr).padded_blocks.__defaults__ = (300,)
        fit = _fit_numeric(tr, DataConfig(), "per-center")
    finally:
        type(tr).padded_blocks.__defaults__ = orig
    for a, b in zip(whole[:3], fit[:3]):
        assert np.array_equal(a, b)
    k = whole[0].shape[1]
    enc = encode_numeric(tr.raw, tr.mask, *whole[:3])[tr.mask]
    assert torch.equal(enc, tr.packed_x[:-1, :k])


def test_bootstrap_blocks_give_the_single_draw_interval():
    """The clinical bootstraps draw their replicates in blocks (bounded memory at many
    centers); the intervals equal those of one draw of all replicates."""
    import federation.core.clinical as C

    g = torch.Generator().manual_seed(0)
    n, rows = 30, 50
    mask = torch.arange(rows)[None] < torch.randint(12, rows + 1, (n,), generator=g)[:, None]
    s = torch.randn(n, rows, generator=g)
    y = (torch.rand(n, rows, generator=g) < 0.3).float() * mask
    grp = torch.randint(-1, 3, (n, rows), generator=g).masked_fill(~mask, -1)
    out = []
    saved = C.BOOT_BLOCK_CELLS
    try:
        for cells in (1 << 30, 7 * n * rows):  # one block of 40 replicates / blocks of 7
            C.BOOT_BLOCK_CELLS = cells
            assert len(list(C._resample_within_center(mask, 40, 3))) == (1 if cells > 1e9 else 6)
            out.append((C.bootstrap_mean_auroc(s, y, mask, n_boot=40, seed=3),
                        C.subgroup_gaps(s, y, mask, grp, ["a", "b", "c"], n_boot=40, seed=3, min_size=5,
                                        min_events=1)))
    finally:
        C.BOOT_BLOCK_CELLS = saved
    assert out[0] == out[1]
    assert all(math.isfinite(v) for v in out[0][0])
    # and they are the single draw: replicate indices of one [B, n, rows] generator call
    u = torch.rand(40, n, rows, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ref = (u * mask.sum(1)[None, :, None].double()).floor().long().clamp_max(rows - 1)
    C.BOOT_BLOCK_CELLS = 7 * n * rows
    try:
        assert torch.equal(torch.cat(list(C._resample_within_center(mask, 40, 3))), ref)
    finally:
        C.BOOT_BLOCK_CELLS = saved


def test_non_finite_count_fast_path_is_exact():
    """The per-round finite check sums first (one reduction): a finite sum proves every element
    finite, a non-finite one falls back to the exact count, so finite values whose sum overflows
    still count 0 and +inf / -inf pairs (sum NaN) count 2."""
    from federation.core.checks import count_non_finite

    big = torch.full((4, 3), 3e38)  # finite, but the float32 sum overflows to inf
    assert not bool(torch.isfinite(big.sum())) and count_non_finite(big) == 0
    x = torch.randn(50, 7)
    assert count_non_finite(x) == 0
    x[3, 2], x[10, 0], x[11, 1] = float("nan"), float("inf"), -float("inf")
    assert count_non_finite(x) == 3
    assert count_non_finite(torch.tensor([float("inf"), -float("inf")])) == 2
    assert count_non_finite(torch.empty(0, 3)) == 0
    assert count_non_finite(torch.tensor([1.0, float("nan")], dtype=torch.bfloat16)) == 1


def test_dropout_helper_thread_gives_identical_training(data, monkeypatch):
    """Masks drawn one step ahead in the helper thread equal masks drawn in place: same
    parameters bit for bit, with and without a local loss, over two rounds."""
    def run(prefetch: int, local_loss=None):
        monkeypatch.setattr(StackedEngine, "prefetch_bytes", prefetch)
        eng = StackedEngine(data, EngineConfig(batch_size=64), seed=4)
        p = eng.init_params()
        s = AdamState.zeros_like(p)
        for r in range(2):
            eng.train_round(p, s, r, local_loss)
        return p, s

    prox = lambda p, b: 0.01 * sum((v ** 2).flatten(1).sum(1) for v in p.values())  # noqa: E731
    for ll in (None, prox):
        (a, sa), (b, sb) = run(0, ll), run(2**30, ll)
        assert all(torch.equal(a[k], b[k]) for k in a) and torch.equal(sa.t, sb.t)


def test_allocator_tuning_is_once_per_process_and_can_be_refused(monkeypatch):
    """``tune_allocator`` sets glibc's malloc parameters once per process (engines call it), and
    ``ABPS_MALLOC_TUNE=0`` leaves the allocator alone in a process not yet tuned."""
    import federation.engine.mlp as eng_mod

    monkeypatch.setattr(eng_mod, "_TUNED", None)
    monkeypatch.setenv("ABPS_MALLOC_TUNE", "0")
    assert eng_mod.tune_allocator() is False and eng_mod._TUNED is None
    monkeypatch.delenv("ABPS_MALLOC_TUNE")
    import ctypes.util

    glibc = ctypes.util.find_library("c") is not None and __import__("platform").libc_ver()[0] == "glibc"
    assert eng_mod.tune_allocator() is glibc
    if glibc:
        import os

        assert eng_mod._TUNED == os.getpid() and eng_mod.tune_allocator() is True


def test_mlp_engine_implements_the_engine_protocol(data):
    """The runner and the methods see the MLP through :class:`Engine` only: its layout counts the
    parameters of the (d, 128, 64, 1) MLP by hand, and a mixture row with weight 1 on the target
    itself scores that center's own model (its AUROC from the engine's own predictions)."""
    from federation.core.metrics import batched_auroc
    from federation.engine.protocol import Engine

    eng = StackedEngine(data, EngineConfig(), 3)
    assert isinstance(eng, Engine)
    ex, head, sizes = eng.layout(1)
    d = data.d
    assert ex == ("w1", "b1", "w2", "b2") and head == ("w3", "b3")
    assert sizes == {"w1": d * 128, "b1": 128, "w2": 128 * 64, "b2": 64, "w3": 64, "b3": 1}
    params = eng.init_params()
    s = data.splits["val"]
    own = eng.evaluate_mixtures(params, torch.eye(eng.n), torch.arange(eng.n), "val", ex, False)
    ref = batched_auroc(eng.predict(params, "val"), s.y, s.mask)
    torch.testing.assert_close(own, ref.to(torch.float64))
    model, shards = eng.probe_view(params)
    assert shards.x_train.shape == (eng.n * s.y.shape[1], d) and torch.equal(shards.n_anchor, s.n)
    assert eng.probe_bytes_per_anchor() == 4 * d + 4 and set(eng.probe_heads(params)) == {"head.w3", "head.b3"}

"""Formulations of the stacked image models' layers, side by side in one process on 2 CPU cores.
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.options import parser
from etl.io import atomic_write_text
from federation.engine.image_model import (
    FMNIST_SPEC,
    StackedModel,
    _grouped_head,
    grouped_classify,
    grouped_forward,
    init_stacked_params,
    predict_flops_per_image,
    train_flops_per_image,
)
from federation.gossip.model import LENET5_LAYOUT, forward_stacked, init_stacked


# --- candidate: im2col + bmm, client-major channels-last activations [G, B, H, W, C] ----------------
def _im2col(x: Tensor, k: int, stride: int, pad: int) -> Tensor:
    g, b, h, w, c = x.shape
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    xp = F.pad(x, (0, 0, pad, pad, pad, pad)) if pad else x.contiguous()
    s = xp.stride()
    view = xp.as_strided((g, b, ho, wo, k, k, c), (s[0], s[1], stride * s[2], stride * s[3], s[2], s[3], s[4]))
    return view.reshape(g, b * ho * wo, k * k * c)


def _col2im(cols: Tensor, shape: tuple[int, ...], k: int, stride: int, pad: int) -> Tensor:
    g, b, h, w, c = shape
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    gv = cols.view(g, b, ho, wo, k, k, c)
    out = cols.new_zeros(g, b, h + 2 * pad, w + 2 * pad, c)
    for ky in range(k):
        for kx in range(k):
            out[:, :, ky:ky + stride * (ho - 1) + 1:stride, kx:kx + stride * (wo - 1) + 1:stride] += gv[:, :, :, :, ky, kx]
    return out[:, :, pad:pad + h, pad:pad + w]


class _Im2col(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k, stride, pad):
        ctx.geom = (tuple(x.shape), k, stride, pad)
        return _im2col(x, k, stride, pad)

    @staticmethod
    def backward(ctx, grad):
        return _col2im(grad, *ctx.geom), None, None, None


class _Col2im(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cols, shape, k, stride, pad):
        ctx.geom = (k, stride, pad)
        return _col2im(cols, shape, k, stride, pad)

    @staticmethod
    def backward(ctx, grad):
        return _im2col(grad, *ctx.geom), None, None, None, None


def bmm_conv2d(x: Tensor, weight: Tensor, bias: Tensor, stride: int, pad: int) -> Tensor:
    """G stacked ``F.conv2d`` as im2col + ``baddbmm``: x [G, B, H, W, Cin], weight [G, Cout, Cin, k, k]."""
    g, cout, cin, k, _ = weight.shape
    b, h, w = x.shape[1:4]
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    wm = weight.permute(0, 3, 4, 2, 1).reshape(g, k * k * cin, cout)
    return torch.baddbmm(bias.unsqueeze(1), _Im2col.apply(x, k, stride, pad), wm).view(g, b, ho, wo, cout)


def bmm_conv_transpose2d(x: Tensor, weight: Tensor, bias: Tensor, stride: int, pad: int) -> Tensor:
    """G stacked ``F.conv_transpose2d`` as ``bmm`` to each input pixel's k k Cout contributions + col2im."""
    g, cin, cout, k, _ = weight.shape
    b, h, w = x.shape[1:4]
    ho, wo = (h - 1) * stride - 2 * pad + k, (w - 1) * stride - 2 * pad + k
    cols = torch.bmm(x.reshape(g, b * h * w, cin), weight.permute(0, 1, 3, 4, 2).reshape(g, cin, k * k * cout))
    return _Col2im.apply(cols, (g, b, ho, wo, cout), k, stride, pad) + bias.view(g, 1, 1, 1, cout)


def _cl_cols(w: Tensor, channels: int, side: int) -> Tensor:
    """A dense weight's input columns from PyTorch's flatten order (c, y, x) to channels-last (y, x, c)."""
    g, out = w.shape[:2]
    return w.view(g, out, channels, side, side).permute(0, 1, 3, 4, 2).reshape(g, out, -1)


def bmm_sage_forward(p: dict[str, Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
    """The SAGE encoder-decoder of G clients on x [G, B, H, W, C]: (logits [G, B, classes], recon like x)."""
    h = bmm_conv2d(x, p["encoder.0.weight"], p["encoder.0.bias"], 2, 1).relu()
    h = bmm_conv2d(h, p["encoder.2.weight"], p["encoder.2.bias"], 2, 1).relu()
    g, b, s, _, c = h.shape
    z = torch.baddbmm(p["encoder.5.bias"].unsqueeze(1), h.reshape(g, b, -1),
                      _cl_cols(p["encoder.5.weight"], c, s).transpose(1, 2))
    wd = _cl_cols(p["decoder.0.weight"].transpose(1, 2), c, s)
    d = torch.baddbmm(_cl_cols(p["decoder.0.bias"].unsqueeze(1), c, s), z, wd).relu().view(g, b, s, s, c)
    d = bmm_conv_transpose2d(d, p["decoder.3.weight"], p["decoder.3.bias"], 2, 1).relu()
    r = bmm_conv_transpose2d(d, p["decoder.5.weight"], p["decoder.5.bias"], 2, 1)
    return _grouped_head(p, z), r.sigmoid()


def bmm_lenet_forward(p: dict[str, Tensor], x: Tensor) -> Tensor:
    """Caffe LeNet-5 of n nodes on x [n, B, 1, 28, 28] -> logits [n, B, 10]."""
    def pool(h):
        g, b, hh, ww, c = h.shape
        out = F.max_pool2d(h.view(g * b, hh, ww, c).permute(0, 3, 1, 2), 2)
        return out.permute(0, 2, 3, 1).reshape(g, b, hh // 2, ww // 2, c)
    h = pool(bmm_conv2d(x.view(*x.shape[:2], 28, 28, 1), p["conv1.weight"], p["conv1.bias"], 1, 0))
    h = pool(bmm_conv2d(h, p["conv2.weight"], p["conv2.bias"], 1, 0))
    g, b = h.shape[:2]
    h = torch.baddbmm(p["ip1.bias"].unsqueeze(1), h.reshape(g, b, -1), _cl_cols(p["ip1.weight"], 50, 4).transpose(1, 2))
    return torch.baddbmm(p["ip2.bias"].unsqueeze(1), h.relu(), p["ip2.weight"].transpose(1, 2))


# --- the measurements -------------------------------------------------------------------------
def _timed(fns: dict[str, Any], repeats: int) -> dict[str, dict[str, float]]:
    """Best wall and CPU seconds of each callable, the candidates interleaved (warm-up first)."""
    for f in fns.values():
        f()
    best = {k: [float("inf"), float("inf")] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            f()
            best[k] = [min(best[k][0], time.perf_counter() - t0), min(best[k][1], time.process_time() - c0)]
    return {k: {"wall_s": w, "cpu_s": c} for k, (w, c) in best.items()}


def _rel(a: list[Tensor], b: list[Tensor]) -> float:
    return max(float((u - v).abs().max() / u.abs().max().clamp(min=1e-30)) for u, v in zip(a, b))


def _compiled(loss, grads, reference) -> tuple[Any, dict[str, float]]:
    """``grads`` of ``torch.compile(loss)`` (inductor; the convolutions stay oneDNN's, the rest is
    fused) as a candidate, with its compile time and its largest relative gradient difference."""
    fn = torch.compile(loss)
    t0 = time.perf_counter()
    got = grads(fn)
    return (lambda: grads(fn)), {"compile_s": time.perf_counter() - t0, "max_rel_grad_diff": _rel(reference, got)}


def sage_training_step(clients: int, batch: int, repeats: int, compiled: bool = False) -> dict[str, Any]:
    """Forward + backward of the SAGE loss (CE + reconstruction MSE) of ``clients`` x ``batch`` images
    (``compiled``: also the grouped form under ``torch.compile``)."""
    g = torch.Generator().manual_seed(0)
    p = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in init_stacked_params(FMNIST_SPEC, clients, 0).items()}
    x = torch.rand(clients, batch, 28, 28, 1, generator=g)
    y = torch.randint(0, 10, (clients, batch), generator=g)
    x_grouped = x.permute(1, 0, 4, 2, 3).reshape(batch, clients, 28, 28).contiguous(memory_format=torch.channels_last)

    def loss_of(forward, xin):
        def loss(leaf):
            logits, recon = forward(leaf, xin)
            return F.cross_entropy(logits.flatten(0, 1), y.flatten()) + (recon - xin).square().mean()
        return loss

    def grads(loss):
        leaf = {k: v.detach().requires_grad_(True) for k, v in p.items()}
        return list(torch.autograd.grad(loss(leaf), list(leaf.values())))

    grouped = loss_of(grouped_forward, x_grouped)
    fns = {"grouped_onednn": lambda: grads(grouped), "im2col_bmm": lambda: grads(loss_of(bmm_sage_forward, x))}
    out: dict[str, Any] = {"workload": f"{clients} clients x {batch} images, one training step",
                           "gflop": train_flops_per_image(FMNIST_SPEC) * clients * batch / 1e9,
                           "max_rel_grad_diff": _rel(fns["grouped_onednn"](), fns["im2col_bmm"]())}
    if compiled:
        fns["torch_compile"], out["torch_compile_build"] = _compiled(grouped, grads, fns["grouped_onednn"]())
    out.update(_timed(fns, repeats))
    return out


def sage_shared_encoder(clients: int, images: int, repeats: int) -> dict[str, Any]:
    """All predictors on the same one-channel images: planar strides (what ``contiguous(channels_last)``
    leaves for C = 1) against explicit channels-last strides (the engine's ``channels_last``)."""
    g = torch.Generator().manual_seed(1)
    p = {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in init_stacked_params(FMNIST_SPEC, clients, 0).items()
         if not k.startswith("decoder.")}
    x = torch.rand(images, 1, 28, 28, generator=g)

    def planar():
        w1, b1, w2, b2 = p["encoder.0.weight"], p["encoder.0.bias"], p["encoder.2.weight"], p["encoder.2.bias"]
        h = F.conv2d(x, w1.flatten(0, 1), b1.flatten(), stride=2, padding=1).relu()
        h = F.conv2d(h, w2.flatten(0, 1), b2.flatten(), stride=2, padding=1, groups=clients).relu()
        h = h.reshape(images, clients, -1).transpose(0, 1)
        z = torch.baddbmm(p["encoder.5.bias"].unsqueeze(1), h, p["encoder.5.weight"].transpose(1, 2))
        return _grouped_head(p, z)

    fns = {"planar": torch.no_grad()(planar),
           "channels_last": torch.no_grad()(lambda: grouped_classify(p, x, shared_input=True))}
    out: dict[str, Any] = {"workload": f"{clients} predictors x {images} shared images",
                           "gflop": predict_flops_per_image(FMNIST_SPEC) * clients * images / 1e9,
                           "same_predictions": float((fns["planar"]().argmax(-1) == fns["channels_last"]().argmax(-1)).double().mean())}
    out.update(_timed(fns, repeats))
    return out


def shared_evaluation_chunks(clients: int, images: int, repeats: int) -> dict[str, Any]:
    """The evaluation of every client on the same images (fp32 and int8) in the engine's default
    chunks against chunks of 1,000 images; the predictions must be the same."""
    import inspect

    from federation.images.int8 import predict_shared_int8

    model = StackedModel(FMNIST_SPEC, clients, seed=3)
    g = torch.Generator().manual_seed(3)
    model.params = {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in model.params.items()}
    enc = {k: v for k, v in model.params.items() if not k.startswith("decoder.")}
    x = torch.randint(0, 256, (images, 1, 28, 28), dtype=torch.uint8, generator=g)
    fp32 = inspect.signature(StackedModel.predict_shared_inputs).parameters["chunk"].default
    int8 = inspect.signature(predict_shared_int8).parameters["chunk"].default
    fns = {f"fp32_chunk_{fp32}": lambda: model.predict_shared_inputs(x),
           "fp32_chunk_1000": lambda: model.predict_shared_inputs(x, chunk=1000),
           f"int8_chunk_{int8}": lambda: predict_shared_int8(enc, x),
           "int8_chunk_1000": lambda: predict_shared_int8(enc, x, chunk=1000)}
    same = {"fp32": float((fns[f"fp32_chunk_{fp32}"]() == fns["fp32_chunk_1000"]()).double().mean()),
            "int8": float((fns[f"int8_chunk_{int8}"]() == fns["int8_chunk_1000"]()).double().mean())}
    timed = _timed(fns, repeats)
    out: dict[str, Any] = {}
    for kind, default in (("fp32", fp32), ("int8", int8)):
        out[f"{kind}_evaluation"] = {"workload": f"{clients} predictors x {images} shared images, {kind}",
                                     "same_predictions": same[kind],
                                     f"chunk_{default}": timed[f"{kind}_chunk_{default}"],
                                     "chunk_1000": timed[f"{kind}_chunk_1000"]}
    return out


def gossip_training_step(nodes: int, batch: int, repeats: int, compiled: bool = False) -> dict[str, Any]:
    """Forward + backward of n LeNet-5 nodes' cross-entropy, each on its own batch (``compiled``:
    also the grouped form under ``torch.compile``)."""
    gen = torch.Generator().manual_seed(2)
    flat = init_stacked(nodes, gen)
    x = torch.rand(nodes, batch, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (nodes, batch), generator=gen)

    def loss_of(forward):
        return lambda leaf: F.cross_entropy(forward(leaf, x).flatten(0, 1), y.flatten())

    def grads(loss):
        leaf = {k: v.detach().requires_grad_(True) for k, v in LENET5_LAYOUT.views(flat).items()}
        return list(torch.autograd.grad(loss(leaf), list(leaf.values())))

    grouped = loss_of(forward_stacked)
    fns = {"grouped_onednn": lambda: grads(grouped), "im2col_bmm": lambda: grads(loss_of(bmm_lenet_forward))}
    out: dict[str, Any] = {"workload": f"{nodes} nodes x {batch} images, one training step",
                           "max_rel_grad_diff": _rel(fns["grouped_onednn"](), fns["im2col_bmm"]())}
    if compiled:
        fns["torch_compile"], out["torch_compile_build"] = _compiled(grouped, grads, fns["grouped_onednn"]())
    out.update(_timed(fns, repeats))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command-line entry: run the comparisons, print JSON and one line per candidate
    (``--compile 1`` adds ``torch.compile`` of the grouped training steps: about 100 s to compile)."""
    ap = parser(__doc__, clients=50, batch=64, images=1000, repeats=3, threads=2, compile=0)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    res = {"threads": a.threads, "torch": torch.__version__,
           "sage_training_step": sage_training_step(a.clients, a.batch, a.repeats, bool(a.compile)),
           "sage_shared_encoder": sage_shared_encoder(a.clients, a.images, a.repeats),
           **shared_evaluation_chunks(a.clients, a.images, a.repeats),
           "gossip_training_step": gossip_training_step(a.clients, a.batch, a.repeats, bool(a.compile))}
    print(json.dumps(res, indent=1))
    for name, r in res.items():
        if isinstance(r, dict):
            (k1, t1), *others = [(k, v) for k, v in r.items() if isinstance(v, dict) and "wall_s" in v]
            for k2, t2 in others:
                print(f"{name} ({r['workload']}): {k1} {t1['wall_s']:.3f} s ({t1['cpu_s']:.3f} CPU-s), {k2} "
                      f"{t2['wall_s']:.3f} s ({t2['cpu_s']:.3f} CPU-s); time {k1} / {k2} = "
                      f"{t1['wall_s'] / t2['wall_s']:.2f} wall, {t1['cpu_s'] / t2['cpu_s']:.2f} CPU")
    if a.out:
        atomic_write_text(a.out, json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()

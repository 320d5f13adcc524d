"""int8 evaluation of K stacked SAGE predictors on a shared test set (evaluation speed).

Design notes: docs/sage.md, "Module notes".
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.ao.nn.intrinsic.quantized import ConvReLU2d

from federation.engine.image_model import _grouped_head, channels_last, to_float

#: quantized engine of the grouped convolutions, named explicitly (``x86`` would pick FBGEMM on CPUs
#: without AVX512-VNNI).
ENGINE = "onednn"
#: largest |int8 weight code|: 2 * 255 * 63 <= 32767, so no u8 x s8 pair saturates an int16 on any ISA.
WEIGHT_QMAX = 63


def _channel_max(h: Tensor) -> Tensor:
    """Per-channel maximum float [C] of an activation [N, C, H, W], at least 1e-6."""
    return h.amax(dim=(0, 2, 3)).clamp(min=1e-6)


@torch.no_grad()
def predict_shared_int8(p: dict[str, Tensor], x: Tensor, chunk: int = 64, calibration: int = 256) -> Tensor:
    """Class predictions of K stacked predictors on the same uint8 images, int8 convolutions.

    Args:
        p: stacked encoder / head parameters ``{name: [K, ...]}`` (decoder entries are ignored).
        x: uint8 images [N, C, H, W] (every predictor sees all of them).
        chunk: images per quantized pass (64: the passes' activations stay in the CPU's cache;
            1.3-1.5x faster than 1,000 on a 2-core CPU, docs/benchmarks.md, "Image evaluation").
        calibration: the first ``calibration`` images set the per-channel equalisation.
    Returns:
        long [K, N] predicted classes.
    Raises:
        RuntimeError: the torch build has no ``onednn`` quantized engine.
    """
    if ENGINE not in torch.backends.quantized.supported_engines:
        raise RuntimeError(f"int8 evaluation needs torch's '{ENGINE}' quantized engine, which this build lacks "
                           f"(it has {torch.backends.quantized.supported_engines}); use eval_precision: fp32")
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = ENGINE
    try:
        with warnings.catch_warnings():   # torch >= 2.10 marks quantized tensor creation as deprecated
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            return _predict(p, x, chunk, calibration)
    finally:
        torch.backends.quantized.engine = previous


def _predict(p: dict[str, Tensor], x: Tensor, chunk: int, calibration: int) -> Tensor:
    w1, b1 = p["encoder.0.weight"].flatten(0, 1), p["encoder.0.bias"].flatten()   # [K w, C, 3, 3]
    w2, b2 = p["encoder.2.weight"], p["encoder.2.bias"]                           # [K, 2w, w, 3, 3]
    k, c2, c1 = w2.shape[:3]
    # Equalise on fp32 activations of the calibration slice.
    xc = channels_last(to_float(x[:calibration]))
    h1 = F.conv2d(xc, w1, b1, stride=2, padding=1).relu_()
    s1 = _channel_max(h1)                                                         # [K w]
    w1e, b1e = w1 / s1.view(-1, 1, 1, 1), b1 / s1
    w2s = (w2 * s1.view(k, 1, c1, 1, 1)).flatten(0, 1)                            # input channels rescaled
    h2 = F.conv2d(h1 / s1.view(1, -1, 1, 1), w2s, b2.flatten(), stride=2, padding=1, groups=k).relu_()
    s2 = _channel_max(h2)                                                         # [K 2w]
    w2e, b2e = w2s / s2.view(-1, 1, 1, 1), b2.flatten() / s2
    side = h2.shape[-1]
    w5 = p["encoder.5.weight"] * s2.view(k, 1, c2, 1).expand(k, 1, c2, side * side).flatten(2)
    q1 = _qconv(w1e, b1e, stride_groups=(2, 1))
    q2 = _qconv(w2e, b2e, stride_groups=(2, k))
    out = []
    for s in range(0, x.shape[0], chunk):
        xb = channels_last(x[s:s + chunk])
        xq = torch._make_per_tensor_quantized_tensor(xb, 1.0 / 255.0, 0)          # exact pixels
        h = q2(q1(xq)).dequantize()                                                # [n, K 2w, s, s]
        n = h.shape[0]
        h = h.reshape(n, k, -1).transpose(0, 1)                                    # [K, n, 2w s s]
        z = torch.baddbmm(p["encoder.5.bias"].unsqueeze(1), h, w5.transpose(1, 2))
        out.append(_grouped_head(p, z).argmax(dim=-1))
    return torch.cat(out, dim=1) if out else torch.empty(k, 0, dtype=torch.long)


def _qconv(w: Tensor, b: Tensor, stride_groups: tuple[int, int]) -> ConvReLU2d:
    """A quantized conv + ReLU with per-channel int8 weights (codes in [-63, 63]) and a [0, 1] uint8 output grid."""
    stride, groups = stride_groups
    out_ch, in_per_group = w.shape[:2]
    mod = ConvReLU2d(in_per_group * groups, out_ch, w.shape[-1], stride=stride, padding=1, groups=groups)
    scale = (w.abs().amax(dim=(1, 2, 3)) / WEIGHT_QMAX).clamp(min=1e-12).to(torch.float64)
    qw = torch.quantize_per_channel(w, scale, torch.zeros(out_ch, dtype=torch.long), 0, torch.qint8)
    mod.set_weight_bias(qw, b)
    mod.scale, mod.zero_point = 1.0 / 255.0, 0
    return mod

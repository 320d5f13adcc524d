"""Vanishing variance (eq. (3)) and variance-corrected averaging (Algorithm 3), Tian et al. 2404.04616."""

import numpy as np
import pytest
import torch

from etl.errors import InputError
from federation.core.variance import (
    correct_flat,
    flat_layer_variance,
    layer_variance,
    variance_corrected_average,
    variance_corrected_mix,
)
from federation.gossip.model import LENET5_LAYOUT, init_stacked, xavier_bound


def _algorithm3_literal(buffer: list[np.ndarray]) -> np.ndarray:
    """Algorithm 3 transcribed line by line for one layer (numpy, element loop of lines 10-12)."""
    avg = np.mean(buffer, axis=0)                       # line 2
    n = len(buffer)                                     # line 3
    sig2 = [np.var(li) for li in buffer]                # lines 5-7
    sigma_l2 = sum(sig2) / n                            # line 8
    sigma_lavg2 = np.var(avg)                           # line 9
    mean = avg.mean()
    out = avg.copy().ravel()
    for j in range(out.size):                           # lines 10-12
        out[j] = (out[j] - mean) * np.sqrt(sigma_l2) / np.sqrt(sigma_lavg2) + mean
    return out.reshape(avg.shape)


def test_xavier_init_variance_and_independence():
    flat = init_stacked(4, torch.Generator().manual_seed(1))
    views = LENET5_LAYOUT.views(flat)
    for name in ("conv2.weight", "ip1.weight"):
        w = views[name]
        expected = xavier_bound(tuple(w.shape[1:])) ** 2 / 3  # = 2 / (fan_in + fan_out)
        assert layer_variance(w).numpy() == pytest.approx([expected] * 4, rel=0.03)
        c = np.corrcoef(w.reshape(4, -1).numpy())
        assert np.abs(c[np.triu_indices(4, 1)]).max() < 0.02
    # conv2: fan_in = 20*25, fan_out = 50*25 -> variance 2 / 1750
    assert xavier_bound((50, 20, 5, 5)) ** 2 / 3 == pytest.approx(2 / 1750)
    assert float(views["conv1.bias"].abs().sum()) == 0.0


def test_average_of_independent_xavier_layers_has_one_nth_variance():
    n = 16
    flat = init_stacked(n, torch.Generator().manual_seed(2))
    for name in ("conv2.weight", "ip1.weight"):
        w = LENET5_LAYOUT.views(flat)[name]
        single = layer_variance(w)
        avg_var = float(layer_variance(w.mean(0, keepdim=True))[0])
        eq3 = float(single.sum()) / n ** 2                  # eq. (3)
        assert avg_var == pytest.approx(eq3, rel=0.05)
        assert avg_var == pytest.approx(float(single.mean()) / n, rel=0.05)


def test_algorithm3_restores_mean_input_variance_and_matches_literal_transcription():
    gen = torch.Generator().manual_seed(3)
    buf = {"a.weight": torch.randn(6, 7, 5, generator=gen) * torch.arange(1, 7).view(6, 1, 1),
           "a.bias": torch.randn(6, 9, generator=gen) + 0.3}
    out = variance_corrected_average(buf)
    for name, stack in buf.items():
        target = float(layer_variance(stack).mean())
        assert float(layer_variance(out[name].unsqueeze(0))[0]) == pytest.approx(target, rel=1e-5)
        assert float(out[name].mean()) == pytest.approx(float(stack.mean(0).mean()), abs=1e-6)
        lit = _algorithm3_literal([s.double().numpy() for s in stack])
        np.testing.assert_allclose(out[name].numpy(), lit, rtol=1e-5, atol=1e-6)


def test_correlated_inputs_are_left_nearly_unchanged():
    gen = torch.Generator().manual_seed(4)
    base = torch.randn(1, 300, generator=gen)
    stack = base + 1e-3 * torch.randn(8, 300, generator=gen)
    out = variance_corrected_average({"w": stack})["w"]
    plain = stack.mean(0)
    assert float((out - plain).abs().max()) < 5e-6
    ratio = float(layer_variance(stack).mean() / layer_variance(plain.unsqueeze(0))[0])
    assert ratio == pytest.approx(1.0, abs=1e-5)


def test_zero_variance_layer_is_left_unchanged():
    out = variance_corrected_average({"b": torch.zeros(3, 4)})
    assert torch.equal(out["b"], torch.zeros(4))


def test_variance_corrected_mix_uniform_rows_equal_algorithm3_and_identity_rows_unchanged():
    gen = torch.Generator().manual_seed(5)
    params = {"w": torch.randn(4, 3, 10, generator=gen), "b": torch.randn(4, 6, generator=gen)}
    W = torch.tensor([[1.0, 0, 0, 0],
                      [0.25, 0.25, 0.25, 0.25],
                      [0, 0.5, 0.5, 0],
                      [0, 0, 0, 1.0]])
    out = variance_corrected_mix(params, W)
    for name, theta in params.items():
        assert torch.allclose(out[name][0], theta[0], atol=1e-6)
        assert torch.allclose(out[name][3], theta[3], atol=1e-6)
        ref_all = variance_corrected_average({name: theta})[name]
        assert torch.allclose(out[name][1], ref_all, atol=1e-6)
        ref_pair = variance_corrected_average({name: theta[1:3]})[name]
        assert torch.allclose(out[name][2], ref_pair, atol=1e-6)
    # weighted row: target is the W-weighted mean of the input variances
    W2 = torch.tensor([[0.75, 0.25, 0, 0]])
    o2 = variance_corrected_mix(params, W2)["w"]
    target = 0.75 * layer_variance(params["w"][:1]) + 0.25 * layer_variance(params["w"][1:2])
    assert float(layer_variance(o2)[0]) == pytest.approx(float(target[0]), rel=1e-5)


@pytest.mark.parametrize("W", [torch.ones(2, 2), torch.tensor([[1.5, -0.5], [0.5, 0.5]]), torch.ones(2, 3) / 3])
def test_variance_corrected_mix_rejects_bad_mixing_matrix(W):
    with pytest.raises(InputError):
        variance_corrected_mix({"w": torch.randn(2, 4)}, W)


def test_correct_flat_matches_per_tensor_correction():
    gen = torch.Generator().manual_seed(6)
    flat = init_stacked(5, gen)
    # give biases non-zero values so every tensor is corrected
    for name, v in LENET5_LAYOUT.views(flat).items():
        if name.endswith("bias"):
            v.copy_(torch.randn(v.shape, generator=gen) * 0.1)
    W = torch.full((5, 5), 0.2)
    expected = variance_corrected_mix(LENET5_LAYOUT.views(flat), W)
    avg = flat.mean(0, keepdim=True).repeat(5, 1)
    target = flat_layer_variance(flat, LENET5_LAYOUT).mean(0, keepdim=True).repeat(5, 1)
    got = LENET5_LAYOUT.views(correct_flat(avg, target, LENET5_LAYOUT))
    for name in LENET5_LAYOUT.names:
        assert torch.allclose(got[name], expected[name], rtol=1e-4, atol=1e-7)

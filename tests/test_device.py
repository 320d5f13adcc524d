"""The stacked image engines on an accelerator compute what they compute on the CPU.

Skipped where torch sees no CUDA device (CI); run on a GPU machine with
``python -m pytest tests/test_device.py``. TF32 is switched off, so the device works in fp32 and the
tolerances are those of the CPU equality tests (tests/test_sage_engine.py): the same sums in
another order.
"""

from __future__ import annotations

import pytest
import torch

from federation.engine.image_model import ModelSpec, StackedModel, batch_plan
from federation.gossip.model import init_stacked, stacked_gradients

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

TINY = ModelSpec(in_channels=1, image_size=28, base_width=4, latent_dim=8)


@pytest.fixture(autouse=True)
def _fp32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_stacked_sage_training_on_cuda_equals_the_cpu():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (200, 1, 28, 28), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 10, (200,), generator=g)
    n_train = torch.tensor([40, 7, 55])
    index = torch.stack([torch.randperm(200, generator=g)[:60] for _ in range(3)])
    plans = [batch_plan(n_train, 60, 16, g) for _ in range(2)]
    cpu = StackedModel(TINY, 3, seed=3, recon_weight=0.5)
    dev = StackedModel(TINY, 3, seed=3, recon_weight=0.5, device="cuda")
    for plan in plans:
        cpu.train_steps(x, y, index, plan, 16)
        dev.train_steps(x.cuda(), y.cuda(), index, plan, 16)
    for name, p in cpu.params.items():
        assert dev.params[name].device.type == "cuda"
        torch.testing.assert_close(dev.params[name].cpu(), p, atol=2e-5, rtol=1e-4)
    assert dev.opt.step_count.cpu().tolist() == [6.0, 2.0, 8.0]
    same = dev.predict_shared_inputs(x.cuda()).cpu() == cpu.predict_shared_inputs(x)
    assert float(same.double().mean()) >= 0.99   # only near-ties of the top two logits may differ


def test_stacked_gossip_gradients_on_cuda_equal_the_cpu():
    g = torch.Generator().manual_seed(1)
    flat = init_stacked(4, g)
    x, y = torch.rand(4, 64, 1, 28, 28, generator=g), torch.randint(0, 10, (4, 64), generator=g)
    grads, loss = stacked_gradients(flat, x, y)
    grads_d, loss_d = stacked_gradients(flat.cuda(), x.cuda(), y.cuda())
    torch.testing.assert_close(loss_d.cpu(), loss, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grads_d.cpu(), grads, atol=1e-6 * float(grads.abs().max()), rtol=1e-4)

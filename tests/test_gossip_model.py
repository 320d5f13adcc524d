"""Stacked LeNet-5 (Caffe form): stacked training equals a per-node loop; the "inv" lr policy."""

import pytest
import torch
from torch import nn

from federation.gossip.model import LENET5_LAYOUT, init_stacked, inv_lr, stacked_gradients
from federation.gossip.simulation import GossipConfig, train_nodes


class RefLeNet(nn.Module):
    """Per-node reference: Caffe LeNet as plain torch.nn layers."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        self.ip1 = nn.Linear(800, 500)
        self.ip2 = nn.Linear(500, 10)

    def forward(self, x):
        h = nn.functional.max_pool2d(self.conv1(x), 2)
        h = nn.functional.max_pool2d(self.conv2(h), 2)
        return self.ip2(torch.relu(self.ip1(h.flatten(1))))


def test_inv_lr_policy_values():
    # base * (1 + gamma * iter) ** -power, gamma 1e-4, power 0.75
    lr = inv_lr(0.01, torch.tensor([0, 10000, 30000]), 1e-4, 0.75)
    assert lr.tolist() == pytest.approx([0.01, 0.01 * 2 ** -0.75, 0.01 * 4 ** -0.75], rel=1e-12)
    assert 0.01 * 2 ** -0.75 == pytest.approx(0.00594603558, rel=1e-9)
    assert float(inv_lr(0.01, 1, 1e-4, 0.75)) == pytest.approx(0.01 / 1.0001 ** 0.75, rel=1e-12)


@pytest.mark.parametrize("engine", ["grouped", "vmap"])
def test_stacked_training_equals_per_node_loop(engine):
    torch.manual_seed(0)
    n, steps, bsz = 3, 3, 8
    gen = torch.Generator().manual_seed(11)
    flat = init_stacked(n, gen)
    for name, v in LENET5_LAYOUT.views(flat).items():  # non-zero biases exercise their gradients
        if name.endswith("bias"):
            v.copy_(torch.randn(v.shape, generator=gen) * 0.05)
    xs = torch.rand(steps, n, bsz, 1, 28, 28, generator=gen)
    ys = torch.randint(0, 10, (steps, n, bsz), generator=gen)
    # per-node reference: torch.optim.SGD + LambdaLR with the inv policy
    ref = []
    for i in range(n):
        m = RefLeNet()
        with torch.no_grad():
            for name, p in m.named_parameters():
                p.copy_(LENET5_LAYOUT.views(flat)[name][i])
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: (1 + 1e-4 * it) ** -0.75)
        for s in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(m(xs[s, i]), ys[s, i]).backward()
            opt.step()
            sched.step()
        ref.append(LENET5_LAYOUT.flatten({k: v.detach().unsqueeze(0) for k, v in m.named_parameters()}))
    ref = torch.cat(ref)
    cfg = GossipConfig(engine=engine)
    mom = torch.zeros_like(flat)
    iters = torch.zeros(n, dtype=torch.int64)
    active = torch.arange(n)
    for s in range(steps):
        train_nodes(flat, mom, iters, active, xs[s], ys[s], cfg)
    assert iters.tolist() == [steps] * n
    assert torch.allclose(flat, ref, atol=2e-6, rtol=1e-4)


def test_engines_agree_and_inactive_nodes_are_untouched():
    gen = torch.Generator().manual_seed(12)
    flat = init_stacked(5, gen)
    x = torch.rand(5, 4, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (5, 4), generator=gen)
    g1, l1 = stacked_gradients(flat, x, y, "grouped")
    g2, l2 = stacked_gradients(flat, x, y, "vmap")
    assert torch.allclose(g1, g2, atol=1e-6, rtol=1e-4)
    assert torch.allclose(l1, l2, atol=1e-6)

    mom = torch.randn(5, flat.shape[1], generator=gen)
    before, mom_before = flat.clone(), mom.clone()
    iters = torch.tensor([0, 5, 7, 0, 2])
    active = torch.tensor([1, 3])
    train_nodes(flat, mom, iters, active, x[active], y[active], GossipConfig())
    idle = torch.tensor([0, 2, 4])
    assert torch.equal(flat[idle], before[idle]) and torch.equal(mom[idle], mom_before[idle])
    assert not torch.equal(flat[active], before[active])
    assert iters.tolist() == [0, 6, 7, 1, 2]


def test_train_flops_per_image_are_hand_counted_and_torchs_count():
    """2 (3 F - F_conv1) with F = 288,000 + 1,600,000 + 400,000 + 5,000 multiply-adds, and the
    same as torch's FLOP counter over one forward and backward pass of three images."""
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from federation.gossip.model import LENET5_SHAPES, forward_single, lenet5_train_flops_per_image

    assert lenet5_train_flops_per_image() == 2 * (3 * 2_293_000 - 288_000) == 13_182_000
    p = {k: torch.randn(*v, requires_grad=True) for k, v in LENET5_SHAPES.items()}
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(forward_single(p, torch.rand(3, 1, 28, 28)), torch.tensor([1, 2, 3])).backward()
    assert counter.get_total_flops() == 3 * lenet5_train_flops_per_image()

"""MOON's model-contrastive loss at the tuned defaults (mu 0.1, tau 1.0; docs/baselines.md), by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from federation.engine.mlp import Batch, forward, init_params
from federation.methods.baselines import Moon, MoonParams

torch.set_num_threads(1)


def _hand_loss(rep, z_glob, z_prev, rows, mu, tau):
    """mu * mean over real rows of -log(e^{s_g} / (e^{s_g} + e^{s_p})), s = cos / tau, per center."""
    out = []
    for c in range(rep.shape[0]):
        terms = []
        for b in range(rep.shape[1]):
            if not rows[c, b]:
                continue
            r, g, p = rep[c, b].double(), z_glob[c, b].double(), z_prev[c, b].double()
            s_g = float(r @ g / (r.norm() * g.norm())) / tau
            s_p = float(r @ p / (r.norm() * p.norm())) / tau
            terms.append(-math.log(math.exp(s_g) / (math.exp(s_g) + math.exp(s_p))))
        out.append(mu * sum(terms) / len(terms))
    return torch.tensor(out)


def test_moon_loss_at_tuned_defaults_by_hand():
    d, hidden, n = 5, (8, 6), 3
    glob = init_params(d, hidden, n, seed=1)
    prev = init_params(d, hidden, n, seed=2)
    g = torch.Generator().manual_seed(0)
    centers = torch.tensor([2, 0])
    x = torch.randn(2, 7, d, generator=g)
    rep = torch.rand(2, 7, hidden[1], generator=g) + 0.1
    rows = torch.ones(2, 7, dtype=torch.bool)
    rows[1, 5:] = False  # padding rows of a short center
    batch = Batch(centers=centers, x=x, y=torch.zeros(2, 7), rows=rows, logits=torch.zeros(2, 7), rep=rep,
                  round_idx=1, epoch=0, step=0)
    z_glob = forward({k: v[centers] for k, v in glob.items()}, x)[1]
    z_prev = forward({k: v[centers] for k, v in prev.items()}, x)[1]
    assert MoonParams() == MoonParams(mu=0.1, temperature=1.0)
    losses = {}
    for tau in (1.0, 0.5):
        m = Moon() if tau == 1.0 else Moon(MoonParams(temperature=tau))
        m.prev_local = prev
        got = m.local_loss(SimpleNamespace(round_start=glob), glob, batch)
        torch.testing.assert_close(got.double(), _hand_loss(rep, z_glob, z_prev, rows, 0.1, tau).double(),
                                   rtol=1e-5, atol=1e-7)
        losses[tau] = got
    assert not torch.allclose(losses[1.0], losses[0.5])  # the temperature changes the loss
    assert float(losses[1.0].min()) > 0 and float(losses[1.0].max()) < 0.1 * math.log(1 + math.e ** 2) + 1e-6

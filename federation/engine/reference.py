"""Plain per-center loop: the reference implementation of one round of local training.

This is what a conventional simulator does: for each center in turn, a model and a
``torch.optim.Adam`` optimizer, batches of its own shuffled rows. It consumes the same
random streams as :class:`federation.engine.mlp.StackedEngine` (permutation and dropout masks),
so both give the same parameters up to float rounding; the tests check this and the
benchmark (benchmarks/bench_engine.py) times both. Not used on the training path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from federation.engine.mlp import PARAM_NAMES, StackedEngine, StackedParams


class LoopTrainer:
    """Per-center training with one ``torch.optim.Adam`` per center (state kept across rounds).

    Args:
        engine: supplies data, config and the random streams.
        params: stacked initial parameters (copied per center).
    """

    def __init__(self, engine: StackedEngine, params: StackedParams) -> None:
        self.engine = engine
        cfg = engine.cfg
        self.models = [
            {k: params[k][i].clone().requires_grad_(True) for k in PARAM_NAMES} for i in range(engine.n)
        ]
        self.opts = [
            torch.optim.Adam([m[k] for k in PARAM_NAMES], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                             weight_decay=cfg.weight_decay, foreach=False)
            for m in self.models
        ]

    def stacked(self) -> StackedParams:
        """Current parameters stacked along the center axis."""
        return {k: torch.stack([m[k].detach() for m in self.models]) for k in PARAM_NAMES}

    def train_round(self, round_idx: int) -> None:
        """One round of local epochs, center after center."""
        eng, cfg = self.engine, self.engine.cfg
        tr = eng.data.splits["train"]
        bs, p = cfg.batch_size, cfg.dropout
        units = eng.hidden[0] + eng.hidden[1]
        n_rows = tr.n
        order = torch.argsort(n_rows, descending=True, stable=True)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(eng.n)  # slot of center i among the active (size-ordered) centers
        for epoch in range(cfg.local_epochs):
            perm = eng.streams.permutations(n_rows, tr.x.shape[1], round_idx, epoch)
            masks = [
                eng.streams.dropout_scale(round_idx, epoch, s, int((n_rows > s * bs).sum()),
                                         min(bs, tr.x.shape[1] - s * bs), units, p)
                for s in range(eng.steps_per_epoch())
            ]
            for i in range(eng.n):
                ni = int(n_rows[i])
                m, opt = self.models[i], self.opts[i]
                for s, lo in enumerate(range(0, ni, bs)):
                    rows = perm[i, lo : min(lo + bs, ni)]
                    x, y = tr.x[i, rows], tr.y[i, rows]
                    drop = masks[s][int(rank[i]), : rows.numel()]
                    h1 = torch.relu(x @ m["w1"] + m["b1"])
                    h1 = h1 * drop[:, : eng.hidden[0]]
                    h2 = torch.relu(h1 @ m["w2"] + m["b2"])
                    h2 = h2 * drop[:, eng.hidden[0] :]
                    logit = (h2 @ m["w3"] + m["b3"]).squeeze(-1)
                    loss = F.binary_cross_entropy_with_logits(logit, y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()

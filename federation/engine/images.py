"""The image engine: stacked SAGE-model training and prediction for an image federation
(:class:`federation.data.images.ImageFederation`); the runner's engine on image runs."""

from __future__ import annotations

from typing import Any

import torch

from etl.errors import InputError
from federation.core.config import EngineConfig, RunConfig
from federation.core.image_metrics import accuracy
from federation.core.seeding import mix_seed
from federation.data.image_shards import probe_bytes_per_anchor
from federation.data.images import IMAGES_FILE, ImageFederation
from federation.engine.image_model import StackedAdam, StackedModel, grouped_classify, model_spec_for, to_float
from federation.engine.mixing import mix
from federation.engine.mlp import AdamState, StackedParams

__all__ = ["ImageEngine"]


class ImageEngine:
    """Stacked SAGE-model training and prediction for an :class:`ImageFederation` (the runner's
    engine interface: ``init_params``, ``train_round``, ``predict``; plus :meth:`layout`,
    :meth:`evaluate_mixtures` and :meth:`pair_logits` for the methods).

    Local training is :meth:`federation.engine.image_model.StackedModel.local_epoch` (Adam per client,
    kept across rounds as in the SAGE benchmark; a fresh Adam state when the runner hands a new
    ``AdamState``, i.e. ``engine.reset_optimizer_each_round``). The batch order of round r is drawn
    from a generator keyed by (seed, r): same seed, same run.

    Raises:
        InputError: the run config changes the clinical MLP's ``engine`` section (the SAGE model
            trains with the federation's ``images.yaml`` settings) or a method asks for a local loss.
    """

    def __init__(self, data: ImageFederation, cfg: RunConfig, seed: int) -> None:
        base = EngineConfig(reset_optimizer_each_round=cfg.engine.reset_optimizer_each_round)
        if cfg.engine != base:
            raise InputError(f"{cfg.method}: the run config's (--config) `engine:` section sets the clinical MLP; on an image "
                             f"federation the SAGE model trains with {IMAGES_FILE}'s batch_size / local_epochs / lr")
        self.data, self.seed = data, int(seed)
        s = data.spec
        self.model_spec = model_spec_for(s.dataset)
        self.model = StackedModel(self.model_spec, data.n_centers, self.seed, lr=s.lr, recon_weight=s.recon_weight)
        self._init = {k: v.clone() for k, v in self.model.params.items()}
        self._state: AdamState | None = None

    @property
    def n(self) -> int:
        """Number of clients K."""
        return self.data.n_centers

    def init_params(self) -> StackedParams:
        """``{name: [K, ...]}`` the same PyTorch-default draw for every client (SAGE Sec. V-A)."""
        return {k: v.clone() for k, v in self._init.items()}

    def layout(self, head_layers: int) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, int]]:
        """(exchanged names, personalized head names, parameters per tensor of one client).

        ``head_layers`` 0: every tensor crosses the network; 1: the head's last layer ``head.2`` stays
        local; 2: the whole head phi stays local (the SAGE benchmark's split: only omega, encoder +
        decoder, is model-bearing). Ledger payload = the exchanged tensors' sizes.
        """
        names = list(self._init)
        head = tuple(n for n in names if (head_layers >= 2 and n.startswith("head."))
                     or (head_layers == 1 and n.startswith("head.2.")))
        ex = tuple(n for n in names if n not in head)
        return ex, head, {n: int(self._init[n][0].numel()) for n in names}

    def train_round(self, params: StackedParams, state: AdamState, round_idx: int,
                    local_loss: Any = None) -> StackedParams:
        """``local_epochs`` local epochs of every client at once, in place on ``params``."""
        if local_loss is not None:
            raise InputError("methods with a local loss term (FedProx, FedDyn, MOON) do not run on an image federation")
        if state is not self._state:  # the runner's optimizer state is new: start a fresh Adam
            self.model.opt = StackedAdam(params, lr=self.data.spec.lr)
            self._state = state
        self.model.params = params
        sh, s = self.data.shards, self.data.spec
        g = torch.Generator().manual_seed(mix_seed(self.seed, round_idx, 0x1A6E))
        for _ in range(s.local_epochs):
            self.model.local_epoch(sh.x_train, sh.y_train, sh.train_index, sh.n_train, s.batch_size, g)
        return params

    def state_dict(self) -> dict[str, Any]:
        """The clients' Adam moments and step counts (they live here, not in the runner's
        ``AdamState``), for a round checkpoint (federation/run/checkpoint.py); ``{}`` before the
        first round."""
        if self._state is None:
            return {}
        opt = self.model.opt
        return {"m": opt.m, "v": opt.v, "steps": opt.steps}

    def load_state_dict(self, state: dict[str, Any], optimizer: Any) -> None:
        """Restore :meth:`state_dict`'s moments as the Adam of the runner's restored ``optimizer``
        (the next :meth:`train_round` with that state continues them)."""
        if not state:
            return
        self.model.opt = StackedAdam(self.model.params, lr=self.data.spec.lr)
        self.model.opt.m, self.model.opt.v, self.model.opt.steps = state["m"], state["v"], state["steps"]
        self._state = optimizer

    def _classify(self, params: StackedParams, rows: torch.Tensor, chunk: int = 64) -> torch.Tensor:
        """Logits ``[G, M, n_classes]`` of G stacked predictors, predictor g on images ``rows[g]``
        (``rows`` long ``[G, M]`` into the pool)."""
        g_all, m = rows.shape
        out = torch.empty(g_all, m, self.model_spec.n_classes)
        for lo in range(0, g_all, chunk):
            p = {k: v[lo:lo + chunk] for k, v in params.items() if not k.startswith("decoder.")}
            x = to_float(self.data.shards.x_train[rows[lo:lo + chunk]])  # [g, M, C, H, W]
            out[lo:lo + chunk] = grouped_classify(p, x.transpose(0, 1).flatten(1, 2), shared_input=False)
        return out

    @torch.no_grad()
    def predict(self, params: StackedParams, split: str) -> torch.Tensor:
        """``[K, max_rows, n_classes]`` eval logits of every client's own model on its ``split``
        (padding rows hold the logits of pool image 0; the split's mask excludes them)."""
        return self._classify(params, self.data.rows[split])

    @torch.no_grad()
    def evaluate_mixtures(self, theta: StackedParams, wc: torch.Tensor, tc: torch.Tensor, split: str,
                          exchanged: tuple[str, ...], bf16: bool, chunk: int | None = None) -> torch.Tensor:
        """``[m]`` float64 accuracy of candidate mixtures (``Context.evaluate_mixtures`` on an image
        federation): row r mixes the exchanged block as ``sum_j wc[r, j] wire(theta_j)`` (target
        ``tc[r]``'s own copy unrounded, :func:`federation.engine.mixing.mix`), keeps ``tc[r]``'s own head, and
        is scored on ``tc[r]``'s ``split`` (``chunk`` rows a batch, default 32). NaN where the
        target has no rows in the split."""
        chunk = chunk or 32
        dense = wc.to_dense() if wc.is_sparse else wc
        s, rows = self.data.splits[split], self.data.rows[split]
        out = torch.empty(dense.shape[0], dtype=torch.float64)
        keys = [k for k in theta if not k.startswith("decoder.")]
        for lo in range(0, dense.shape[0], chunk):
            w, t = dense[lo:lo + chunk], tc[lo:lo + chunk]
            model = {k: mix(w, theta[k], bf16, own=t) if k in exchanged else theta[k][t] for k in keys}
            logits = self._classify(model, rows[t])
            out[lo:lo + chunk] = accuracy(s.y[t].long(), logits.argmax(-1), s.mask[t])
        return out

    @torch.no_grad()
    def pair_logits(self, x_all: torch.Tensor, model_index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The SAGE probe (eq. (4)): logits ``[P, M, n_classes]`` of client ``model_index[p]``'s live model
        on pool images ``rows[p]`` (:meth:`federation.engine.image_model.StackedModel.pair_logits`)."""
        return self.model.pair_logits(x_all, model_index, rows)

    def probe_view(self, params: StackedParams) -> tuple[Any, Any]:
        """(probe model, shards) for :func:`federation.methods.probe.probe`: the live models (the engine
        trains ``params`` in place) and the image clients (anchor pool = the ``val`` split)."""
        return self, self.data.shards

    def probe_heads(self, params: StackedParams) -> StackedParams:
        """The parameters a selector reads the classifier head from (PFedDST): all of them."""
        return params

    def probe_bytes_per_anchor(self) -> int:
        """Bytes one (receiver, candidate, anchor) probe moves: the uint8 image out, float32 logits back."""
        return probe_bytes_per_anchor(self.data.shards.x_train, self.data.shards.n_classes)

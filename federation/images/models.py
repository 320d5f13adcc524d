"""Stacked convolutional encoder-decoder clients for the SAGE image benchmark.

Every client k holds a predictor Theta_k = (omega_k, phi_k) (SAGE paper, Sec. III): omega_k is the
shared, model-bearing representation block (encoder + decoder) and phi_k the client-local classifier
head. All K clients share one architecture, so their parameters live in stacked tensors with a
leading client axis ``[K, ...]`` and are trained in one computation (``torch.func.functional_call``
inside ``torch.vmap``); nothing on the hot path loops over clients in Python.

Training loss (docs/sage.md): for a mini-batch of client k,
``L_k = CE(head(enc(x)), y) + recon_weight * MSE(dec(enc(x)), x)``, pixels scaled to [0, 1].
The optimiser is Adam (lr 1e-3, betas (0.9, 0.999), eps 1e-8) kept per client across rounds; a
client whose local epoch is shorter than the longest one is masked out of the extra steps, so the
stacked update equals K independent ``torch.optim.Adam`` runs (tests/test_sage_engine.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

SHARED_PREFIXES = ("encoder.", "decoder.")


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of one client model (SAGE paper, Sec. V-A).

    Attributes:
        in_channels: image channels C (1 for Fashion-MNIST, 3 for CIFAR-10).
        image_size: square side H = W (28 or 32; must be divisible by 4).
        base_width: channels of the first conv layer w (16 / 32); the second has 2w.
        latent_dim: width of the latent representation (64 / 128).
        hidden_dim: width of the head's hidden layer.
        n_classes: number of classes.
    """

    in_channels: int
    image_size: int
    base_width: int
    latent_dim: int
    n_classes: int = 10
    hidden_dim: int = 64


FMNIST_SPEC = ModelSpec(in_channels=1, image_size=28, base_width=16, latent_dim=64)
CIFAR10_SPEC = ModelSpec(in_channels=3, image_size=32, base_width=32, latent_dim=128)


class EncoderDecoderClassifier(nn.Module):
    """Conv encoder-decoder representation omega with a 2-layer classifier head phi.

    Encoder: Conv(C->w, 3, s2) ReLU Conv(w->2w, 3, s2) ReLU Flatten Linear(2w*(H/4)^2 -> latent).
    Decoder: Linear(latent -> 2w*(H/4)^2) ReLU ConvT(2w->w, 4, s2) ReLU ConvT(w->C, 4, s2) Sigmoid.
    Head: Linear(latent -> hidden) ReLU Linear(hidden -> n_classes).

    ``forward(x)`` takes float [B, C, H, W] in [0, 1] and returns (logits [B, n_classes],
    reconstruction [B, C, H, W]).
    """

    def __init__(self, spec: ModelSpec):
        super().__init__()
        if spec.image_size % 4:
            raise ValueError(f"image_size must be divisible by 4, got {spec.image_size}")
        w, s = spec.base_width, spec.image_size // 4
        self.spec = spec
        self.encoder = nn.Sequential(
            nn.Conv2d(spec.in_channels, w, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(w, 2 * w, 3, stride=2, padding=1), nn.ReLU(),
            nn.Flatten(), nn.Linear(2 * w * s * s, spec.latent_dim))
        self.decoder = nn.Sequential(
            nn.Linear(spec.latent_dim, 2 * w * s * s), nn.ReLU(), nn.Unflatten(1, (2 * w, s, s)),
            nn.ConvTranspose2d(2 * w, w, 4, stride=2, padding=1), nn.ReLU(),
            nn.ConvTranspose2d(w, spec.in_channels, 4, stride=2, padding=1), nn.Sigmoid())
        self.head = nn.Sequential(nn.Linear(spec.latent_dim, spec.hidden_dim), nn.ReLU(),
                                  nn.Linear(spec.hidden_dim, spec.n_classes))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(logits [B, n_classes], reconstruction [B, C, H, W]) for float images [B, C, H, W]."""
        z = self.encoder(x)
        return self.head(z), self.decoder(z)

    def classify(self, x: Tensor) -> Tensor:
        """Logits [B, n_classes] for float images [B, C, H, W] (the decoder is skipped)."""
        return self.head(self.encoder(x))


def is_shared(name: str) -> bool:
    """True for parameters of the model-bearing block omega (encoder and decoder)."""
    return name.startswith(SHARED_PREFIXES)


def init_stacked_params(spec: ModelSpec, n_clients: int, seed: int) -> dict[str, Tensor]:
    """One PyTorch-default initialisation, copied to every client: ``{name: [K, ...]}``.

    All clients (and all selectors of a configuration) start from the same Theta^0 (Sec. V-A:
    "all methods within a configuration share the same ... initialisation").
    """
    torch.manual_seed(seed)
    model = EncoderDecoderClassifier(spec)
    return {n: p.detach().unsqueeze(0).repeat(n_clients, *([1] * p.dim())).contiguous()
            for n, p in model.named_parameters()}


def to_float(x_uint8: Tensor) -> Tensor:
    """uint8 pixels -> float32 in [0, 1]."""
    return x_uint8.to(torch.float32).div_(255.0)


class StackedAdam:
    """Adam over stacked parameters ``[K, ...]`` with a per-client step count and activity mask.

    The update is elementwise, identical to ``torch.optim.Adam`` (Kingma & Ba 2015; PyTorch's
    formula, no weight decay) run separately per client; a client with ``active[k] = False`` in a
    step keeps its parameters and moments unchanged.
    """

    def __init__(self, params: dict[str, Tensor], lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8):
        self.lr, (self.b1, self.b2), self.eps = lr, betas, eps
        k = next(iter(params.values())).shape[0]
        self.step_count = torch.zeros(k, dtype=torch.float64)
        self.m = {n: torch.zeros_like(p) for n, p in params.items()}
        self.v = {n: torch.zeros_like(p) for n, p in params.items()}

    @torch.no_grad()
    def step(self, params: dict[str, Tensor], grads: dict[str, Tensor], active: Tensor) -> None:
        """Update ``params`` in place.

        Args:
            params: ``{name: [K, ...]}``.
            grads: ``{name: [A, ...]}`` gradients of the active clients only, in the order of
                ``active.nonzero()``.
            active: bool [K] clients that take this step.
        """
        idx = active.nonzero().squeeze(1)
        every = idx.numel() == active.numel()
        self.step_count[idx] += 1.0
        t = self.step_count[idx]
        bc1 = (1.0 - self.b1 ** t).to(torch.float32)
        bc2_sqrt = (1.0 - self.b2 ** t).sqrt().to(torch.float32)
        for n, p in params.items():
            g = grads[n]
            shape = (-1,) + (1,) * (p.dim() - 1)
            if every:
                pp, m, v = p, self.m[n], self.v[n]
            else:
                pp, m, v = p[idx], self.m[n][idx], self.v[n][idx]
            m.mul_(self.b1).add_(g, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
            denom = (v.sqrt() / bc2_sqrt.view(shape)).add_(self.eps)
            pp.addcdiv_(m, denom * (bc1.view(shape) / self.lr), value=-1.0)
            if not every:
                p.index_copy_(0, idx, pp)
                self.m[n].index_copy_(0, idx, m)
                self.v[n].index_copy_(0, idx, v)


def batch_plan(n_train: Tensor, n_max: int, batch_size: int, generator: torch.Generator) -> Tensor:
    """Per-client shuffled positions for one local epoch: long [K, S * batch_size] (-1 = padding).

    Client k's first ``n_train[k]`` entries are a uniform permutation of 0..n_train[k]-1 drawn from
    ``generator``; S = max_k ceil(n_train[k] / batch_size) steps.
    """
    k = n_train.shape[0]
    keys = torch.rand(k, max(n_max, 1), generator=generator)
    pos = torch.arange(keys.shape[1])
    keys = torch.where(pos[None, :] < n_train[:, None], keys, torch.full_like(keys, 2.0))
    order = keys.argsort(dim=1)
    steps = int(math.ceil(int(n_train.max()) / batch_size)) if int(n_train.max()) > 0 else 0
    width = steps * batch_size
    if width > order.shape[1]:
        order = torch.cat([order, order.new_zeros(k, width - order.shape[1])], dim=1)
    order = order[:, :width]
    valid = torch.arange(width)[None, :] < n_train[:, None]
    return torch.where(valid, order, torch.full_like(order, -1))


class StackedModel:
    """K clients of one architecture, stacked: training, mixing, prediction.

    Attributes:
        spec: the architecture.
        params: ``{name: float32 [K, ...]}``.
        opt: the per-client Adam state.
    """

    def __init__(self, spec: ModelSpec, n_clients: int, seed: int, lr: float = 1e-3,
                 recon_weight: float = 1.0):
        self.spec = spec
        self.template = EncoderDecoderClassifier(spec)
        self.params = init_stacked_params(spec, n_clients, seed)
        self.opt = StackedAdam(self.params, lr=lr)
        self.recon_weight = recon_weight
        self.n_clients = n_clients
        self.shared_names = [n for n in self.params if is_shared(n)]

    # --- functional forward passes -------------------------------------------------------
    def _forward_one(self, p: dict[str, Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
        return functional_call(self.template, p, (x,))

    def client_losses(self, params: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """Weighted per-client training loss, float [K].

        Args:
            x: float [K, B, C, H, W] in [0, 1]; y: long [K, B]; w: float [K, B] per-sample weights
            (1 / n_valid for the client's valid samples, 0 for padding).
        """
        logits, recon = torch.vmap(self._forward_one)(params, x)
        ce = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
        mse = (recon - x).pow(2).flatten(2).mean(dim=2).flatten()
        per_sample = ce + self.recon_weight * mse
        return (per_sample.view_as(w) * w).sum(dim=1)

    def local_epoch(self, x_all: Tensor, y_all: Tensor, train_index: Tensor, n_train: Tensor,
                    batch_size: int, generator: torch.Generator) -> float:
        """One local epoch of every client at once (Sec. V-A: Adam, one epoch, batch 64).

        Args:
            x_all: uint8 [N, C, H, W] pool of all training images; y_all: long [N].
            train_index: long [K, N_max] client k's rows of ``x_all`` (first n_train[k] valid).
            n_train: long [K].
            generator: the round's random stream for the batch order.
        Returns:
            mean training loss over the clients' steps (float, for logging).
        """
        plan = batch_plan(n_train, train_index.shape[1], batch_size, generator)
        return self.train_steps(x_all, y_all, train_index, plan, batch_size)

    def train_steps(self, x_all: Tensor, y_all: Tensor, train_index: Tensor, plan: Tensor,
                    batch_size: int) -> float:
        """Run the steps of a batch plan long [K, S * batch_size] (-1 = padding); see local_epoch."""
        total, count = 0.0, 0
        for s in range(plan.shape[1] // batch_size):
            pos = plan[:, s * batch_size:(s + 1) * batch_size]
            valid = pos >= 0
            rows = train_index.gather(1, pos.clamp(min=0))
            n_valid = valid.sum(dim=1)
            active = n_valid > 0
            w = valid.to(torch.float32) / n_valid.clamp(min=1).to(torch.float32)[:, None]
            # Only clients still inside their epoch are computed (no padded work for the rest).
            idx = active.nonzero().squeeze(1)
            rows, w = rows[idx], w[idx]
            x = to_float(x_all[rows])
            y = y_all[rows]
            leaves = {n: p[idx].requires_grad_(True) for n, p in self.params.items()}
            losses = self.client_losses(leaves, x, y, w)
            grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
            self.opt.step(self.params, dict(zip(leaves.keys(), grads)), active)
            total += float(losses.detach().sum())
            count += int(idx.numel())
        return total / max(count, 1)

    # --- mixing -------------------------------------------------------------------------
    @torch.no_grad()
    def mix_shared(self, w_mix: Tensor) -> None:
        """omega <- W omega for the model-bearing block (eq. (2) when W = (1-a) I + a P).

        Args:
            w_mix: float [K, K] row-stochastic mixing matrix (row k: weights client k applies).
        """
        for n in self.shared_names:
            p = self.params[n]
            p.copy_((w_mix @ p.flatten(1)).view_as(p))

    # --- prediction ---------------------------------------------------------------------
    # Inference runs every selected predictor as ONE grouped convolution per layer (clients along
    # the channel axis, channels-last memory) and batched matmuls for the dense layers: measured
    # faster than vmap over clients on CPU (docs/sage.md, "Speed"); equal to the per-client
    # module (tests/test_sage_engine.py).
    @torch.no_grad()
    def predict_pairs(self, x_all: Tensor, model_index: Tensor, rows: Tensor,
                      chunk: int = 64) -> Tensor:
        """Class predictions of model ``model_index[p]`` on images ``x_all[rows[p]]``.

        Batched over all (receiver, candidate) pairs: the probe of Sec. III (anchor inputs go to
        the peer, predictions come back).

        Args:
            model_index: long [P] which client's predictor Theta_j answers pair p.
            rows: long [P, M] image rows of x_all sent by the receiver of pair p.
        Returns:
            long [P, M] predicted labels.
        """
        return self.pair_logits(x_all, model_index, rows, chunk).argmax(dim=-1)

    @torch.no_grad()
    def pair_logits(self, x_all: Tensor, model_index: Tensor, rows: Tensor, chunk: int = 64) -> Tensor:
        """Like :meth:`predict_pairs` but returns float logits [P, M, n_classes]."""
        out = torch.empty(*rows.shape, self.spec.n_classes)
        for s in range(0, rows.shape[0], chunk):
            j = model_index[s:s + chunk]
            p = {n: v[j] for n, v in self.params.items() if not n.startswith("decoder.")}
            x = to_float(x_all[rows[s:s + chunk]])                     # [G, M, C, H, W]
            out[s:s + chunk] = grouped_classify(p, x.transpose(0, 1).flatten(1, 2), shared_input=False)
        return out

    @torch.no_grad()
    def predict_shared_inputs(self, x: Tensor, chunk: int = 1000) -> Tensor:
        """Every client's predictions on the same uint8 images [N, C, H, W] -> long [K, N]."""
        p = {n: v for n, v in self.params.items() if not n.startswith("decoder.")}
        preds = [grouped_classify(p, to_float(x[s:s + chunk]), shared_input=True).argmax(dim=-1)
                 for s in range(0, x.shape[0], chunk)]
        return torch.cat(preds, dim=1) if preds else torch.empty(self.n_clients, 0, dtype=torch.long)


def grouped_classify(p: dict[str, Tensor], x: Tensor, shared_input: bool) -> Tensor:
    """Logits of G stacked predictors (omega's encoder + phi) in one grouped pass.

    Args:
        p: stacked encoder / head parameters ``{name: [G, ...]}`` of
            :class:`EncoderDecoderClassifier` (the decoder is not used).
        x: float images in [0, 1]: ``[N, C, H, W]`` seen by every predictor (``shared_input``)
            or ``[N, G * C, H, W]`` with predictor g's images in channels ``g C .. (g+1) C - 1``.
    Returns:
        float ``[G, N, n_classes]``.
    """
    w1, b1 = p["encoder.0.weight"], p["encoder.0.bias"]                # [G, w, C, 3, 3], [G, w]
    w2, b2 = p["encoder.2.weight"], p["encoder.2.bias"]                # [G, 2w, w, 3, 3]
    g = w1.shape[0]
    x = x.contiguous(memory_format=torch.channels_last)
    h = F.conv2d(x, w1.flatten(0, 1), b1.flatten(), stride=2, padding=1, groups=1 if shared_input else g)
    h = F.conv2d(h.relu_(), w2.flatten(0, 1), b2.flatten(), stride=2, padding=1, groups=g).relu_()
    n = h.shape[0]
    h = h.reshape(n, g, -1).transpose(0, 1)                              # [G, N, 2w (H/4)^2]
    z = torch.baddbmm(p["encoder.5.bias"].unsqueeze(1), h, p["encoder.5.weight"].transpose(1, 2))
    z = torch.baddbmm(p["head.0.bias"].unsqueeze(1), z, p["head.0.weight"].transpose(1, 2)).relu_()
    return torch.baddbmm(p["head.2.bias"].unsqueeze(1), z, p["head.2.weight"].transpose(1, 2))

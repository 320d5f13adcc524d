"""Stacked convolutional encoder-decoder clients of the SAGE image benchmark (SAGE paper Sec. III):
all K clients' parameters in ``[K, ...]`` tensors, trained in one grouped computation with a stacked
Adam. Details: docs/sage.md, "Module notes".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.adam import adam as _adam

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


def model_spec_for(dataset: str) -> ModelSpec:
    """The SAGE architecture of an image data set (``fmnist`` or ``cifar10``, Sec. V-A)."""
    return {"fmnist": FMNIST_SPEC, "cifar10": CIFAR10_SPEC}[dataset]


def layer_macs(spec: ModelSpec) -> dict[str, int]:
    """Multiply-adds of ONE image through each weight layer of :class:`EncoderDecoderClassifier`
    (forward pass; bias adds, activations and the loss are lower order and not counted).

    With w = base_width, C = in_channels, H = image_size, s1 = H / 2, s2 = H / 4, L = latent_dim:
    a convolution costs (output pixels) x Cout x Cin x k^2, a transposed convolution (input pixels)
    x Cin x Cout x k^2, a linear layer in x out::

        encoder.0  Conv(C -> w, 3, s2)      s1^2 * w * C * 9
        encoder.2  Conv(w -> 2w, 3, s2)     s2^2 * 2w * w * 9
        encoder.5  Linear(2w s2^2 -> L)     2w s2^2 * L
        decoder.0  Linear(L -> 2w s2^2)     L * 2w s2^2
        decoder.3  ConvT(2w -> w, 4, s2)    s2^2 * 2w * w * 16
        decoder.5  ConvT(w -> C, 4, s2)     s1^2 * w * C * 16
        head.0 / head.2                     L * hidden, hidden * n_classes

    Fashion-MNIST (w 16, C 1, H 28, L 64, hidden 64): 28,224 + 225,792 + 100,352 + 100,352 +
    401,408 + 50,176 + 4,096 + 640 = 911,040.
    """
    w, c, s1, s2 = spec.base_width, spec.in_channels, spec.image_size // 2, spec.image_size // 4
    lat = spec.latent_dim
    return {"encoder.0": s1 * s1 * w * c * 9, "encoder.2": s2 * s2 * 2 * w * w * 9,
            "encoder.5": 2 * w * s2 * s2 * lat, "decoder.0": lat * 2 * w * s2 * s2,
            "decoder.3": s2 * s2 * 2 * w * w * 16, "decoder.5": s1 * s1 * w * c * 16,
            "head.0": lat * spec.hidden_dim, "head.2": spec.hidden_dim * spec.n_classes}


def train_flops_per_image(spec: ModelSpec) -> int:
    """FLOPs (2 per multiply-add) of one training image: forward, then backward = a weight gradient
    for every layer plus an input gradient for every layer but the first (the images need none),
    each as many multiply-adds as the forward layer: 2 (3 F - F_encoder.0), F = :func:`layer_macs`."""
    m = layer_macs(spec)
    return 2 * (3 * sum(m.values()) - m["encoder.0"])


def predict_flops_per_image(spec: ModelSpec) -> int:
    """FLOPs of one predictor on one image (encoder + head phi, the decoder unused): 2 x its MACs."""
    m = layer_macs(spec)
    return 2 * sum(v for n, v in m.items() if not n.startswith("decoder."))


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


def channels_last(x: Tensor) -> Tensor:
    """Images ``[N, C, H, W]`` in channels-last memory, with channels-last strides also when C = 1.

    For one channel ``Tensor.contiguous(memory_format=torch.channels_last)`` keeps the planar
    strides (both layouts are the same bytes), so oneDNN picks its planar kernels and every later
    convolution stays planar: 1.38x the time for all predictors on the shared test set
    (``python -m benchmarks.run sage_kernels``; docs/sage.md, "Speed"). Training steps keep PyTorch's
    choice: a one-client step was faster planar.
    """
    if x.shape[1] != 1:
        return x.contiguous(memory_format=torch.channels_last)
    n, _, h, w = x.shape
    return x.contiguous().as_strided(x.shape, (h * w, 1, w, 1))


class StackedAdam:
    """Adam over stacked parameters with per-client moments and a per-client step count.

    Adam is elementwise, so K clients' updates are one update over a flat buffer ``[K, P]`` (P =
    parameters of one client, the names of ``params`` in order); each client's bias correction uses
    its own step count. The update is ``torch.optim.adam.adam`` with ``fused=True`` (PyTorch's
    one-pass kernel; Kingma & Ba 2015, no weight decay) over the clients' rows, so it equals
    ``torch.optim.Adam(fused=True)`` run separately per client (tests/test_sage_engine.py).

    Attributes:
        m, v: float32 ``[K, P]`` first / second moments, client k's in row k.
        steps: float32 ``[K]`` steps taken by each client (``step_count`` reads it).
    """

    def __init__(self, params: dict[str, Tensor], lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8):
        self.lr, (self.b1, self.b2), self.eps = lr, betas, eps
        first = next(iter(params.values()))
        width = sum(p[0].numel() for p in params.values())
        self.m = torch.zeros(first.shape[0], width, device=first.device)
        self.v = torch.zeros_like(self.m)
        self.steps = torch.zeros(first.shape[0], device=first.device)

    @property
    def step_count(self) -> Tensor:
        """float64 [K] steps taken by each client."""
        return self.steps.to(torch.float64)

    @torch.no_grad()
    def step_rows(self, p: Tensor, g: Tensor, m: Tensor, v: Tensor, steps: Tensor) -> None:
        """One Adam step of A clients, in place on row views.

        Args:
            p, g, m, v: float32 ``[A, P]`` parameters, gradients, moments of the stepping clients
                (each row contiguous; views into the buffers of :meth:`StackedModel.train_steps`).
            steps: float32 ``[A]`` their step counts (incremented in place).
        """
        _adam(list(p.unbind(0)), list(g.unbind(0)), list(m.unbind(0)), list(v.unbind(0)),
              [], list(steps.unbind(0)), fused=True, amsgrad=False, beta1=self.b1,
              beta2=self.b2, lr=self.lr, weight_decay=0.0, eps=self.eps, maximize=False)


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
        params: ``{name: float32 [K, ...]}`` on ``device`` (the draw is made on the CPU, so every
            device starts from the same parameters).
        opt: the per-client Adam state, on the parameters' device.

    Training and prediction run where the parameters are: pass the image pools on the same device
    (index tensors and batch plans may stay on the CPU).
    """

    def __init__(self, spec: ModelSpec, n_clients: int, seed: int, lr: float = 1e-3,
                 recon_weight: float = 1.0, device: torch.device | str = "cpu"):
        self.spec = spec
        self.params = {k: v.to(device) for k, v in init_stacked_params(spec, n_clients, seed).items()}
        self.opt = StackedAdam(self.params, lr=lr)
        self.recon_weight = recon_weight
        self.n_clients = n_clients
        self.shared_names = [n for n in self.params if is_shared(n)]

    # --- training --------------------------------------------------------------------------
    def client_losses(self, params: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """Weighted per-client training loss, float [G] (the clients stacked in ``params``).

        Args:
            params: ``{name: [G, ...]}`` the G clients' parameters (may require grad).
            x: float [B, G * C, H, W] in [0, 1], client g's images in channels g C .. (g+1) C - 1
                (channels-last memory is fastest); y: long [G, B]; w: float [G, B] per-sample
                weights (1 / n_valid for the client's valid samples, 0 for padding).
        """
        logits, recon = grouped_forward(params, x)
        g, b = y.shape
        ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(g, b)
        mse = (recon - x).square().unflatten(1, (g, -1)).flatten(2).mean(dim=2).t()   # [G, B]
        return ((ce + self.recon_weight * mse) * w).sum(dim=1)

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
        # a batch wider than the largest shard is that shard: padding it further changes no value
        # (padding weighs 0) but costs memory in proportion (batch_size 10^5 filled 23 GB)
        batch_size = max(1, min(batch_size, int(n_train.max()) if n_train.numel() else 1))
        plan = batch_plan(n_train, train_index.shape[1], batch_size, generator)
        return self.train_steps(x_all, y_all, train_index, plan, batch_size)

    def train_steps(self, x_all: Tensor, y_all: Tensor, train_index: Tensor, plan: Tensor,
                    batch_size: int) -> float:
        """Run the steps of a batch plan long [K, S * batch_size] (-1 = padding); see local_epoch.

        Client k takes the steps whose batch holds one of its positions; they must come first
        (as :func:`batch_plan` makes them). The clients are sorted by their number of steps once
        per call, so the clients of step s are a prefix of that order: their parameters and Adam
        moments are row views of flat ``[K, P]`` buffers (no per-step gathers or scatters), one
        grouped forward / backward and one fused Adam step run per step, and the buffers go back
        to ``params`` at the end.

        Raises:
            ValueError: a client has an empty batch before one of its non-empty batches.
        """
        k, steps_max = plan.shape[0], plan.shape[1] // batch_size
        blocks = plan[:, :steps_max * batch_size].view(k, steps_max, batch_size)
        active = (blocks >= 0).any(dim=2)                                  # [K, S]
        n_steps = active.sum(dim=1)
        if not torch.equal(active, torch.arange(steps_max)[None, :] < n_steps[:, None]):
            raise ValueError("batch plan: every client's non-empty batches must come first")
        order = torch.argsort(n_steps, descending=True, stable=True)
        names = list(self.params)
        dev = self.params[names[0]].device
        shapes = [self.params[n].shape[1:] for n in names]
        sizes = [math.prod(s) for s in shapes]
        flat = torch.cat([self.params[n][order].flatten(1) for n in names], dim=1)   # [K, P]
        opt = self.opt
        m, v, t = opt.m[order], opt.v[order], opt.steps[order]
        counts = (n_steps[order][None, :] > torch.arange(steps_max)[:, None]).sum(dim=1).tolist()
        total, count = 0.0, 0
        for s, a in enumerate(counts):
            idx = order[:a]
            pos = blocks[idx, s]                                           # [A, B]
            valid = pos >= 0
            rows = train_index[idx].gather(1, pos.clamp(min=0))
            w = (valid.to(torch.float32) / valid.sum(dim=1).to(torch.float32)[:, None]).to(dev)
            rows = rows.to(x_all.device)
            x = to_float(x_all[rows.t()].flatten(1, 2)).contiguous(memory_format=torch.channels_last)
            leaf = flat[:a].detach().requires_grad_(True)
            params = {n: c.reshape(a, *shape)
                      for n, c, shape in zip(names, leaf.split(sizes, dim=1), shapes)}
            losses = self.client_losses(params, x, y_all[rows], w)
            (grad,) = torch.autograd.grad(losses.sum(), leaf)
            opt.step_rows(flat[:a], grad, m[:a], v[:a], t[:a])
            total += float(losses.detach().sum())
            count += a
        order = order.to(dev)
        with torch.no_grad():
            for n, c, shape in zip(names, flat.split(sizes, dim=1), shapes):
                self.params[n].index_copy_(0, order, c.reshape(k, *shape))
            opt.m.index_copy_(0, order, m)
            opt.v.index_copy_(0, order, v)
            opt.steps.index_copy_(0, order, t)
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
    def predict_shared_inputs(self, x: Tensor, chunk: int = 32) -> Tensor:
        """Every client's predictions on the same uint8 images [N, C, H, W] -> long [K, N].

        ``chunk`` images per grouped pass: at 32 the activations of K = 50 clients stay in the
        CPU's cache, where 1,000 images make 0.6 GB of first-layer activations; 1.5-1.9x faster
        on a 2-core CPU (docs/benchmarks.md, "Image evaluation")."""
        p = {n: v for n, v in self.params.items() if not n.startswith("decoder.")}
        preds = [grouped_classify(p, to_float(x[s:s + chunk]), shared_input=True).argmax(dim=-1)
                 for s in range(0, x.shape[0], chunk)]
        return torch.cat(preds, dim=1) if preds else torch.empty(self.n_clients, 0, dtype=torch.long)


def _grouped_encode(p: dict[str, Tensor], x: Tensor, shared_input: bool) -> Tensor:
    """Latent codes float [G, N, latent] of G stacked encoders (see :func:`grouped_classify` for
    ``p`` and ``x``): two grouped 3x3 stride-2 convolutions, channels-last, then ``baddbmm``."""
    w1, b1 = p["encoder.0.weight"], p["encoder.0.bias"]                # [G, w, C, 3, 3], [G, w]
    w2, b2 = p["encoder.2.weight"], p["encoder.2.bias"]                # [G, 2w, w, 3, 3]
    g = w1.shape[0]
    x = channels_last(x)
    h = F.conv2d(x, w1.flatten(0, 1), b1.flatten(), stride=2, padding=1, groups=1 if shared_input else g).relu()
    h = F.conv2d(h, w2.flatten(0, 1), b2.flatten(), stride=2, padding=1, groups=g).relu()
    n = h.shape[0]
    h = h.reshape(n, g, -1).transpose(0, 1)                              # [G, N, 2w (H/4)^2]
    return torch.baddbmm(p["encoder.5.bias"].unsqueeze(1), h, p["encoder.5.weight"].transpose(1, 2))


def _grouped_head(p: dict[str, Tensor], z: Tensor) -> Tensor:
    """Logits float [G, N, n_classes] of G stacked heads phi on latent codes z [G, N, latent]."""
    z = torch.baddbmm(p["head.0.bias"].unsqueeze(1), z, p["head.0.weight"].transpose(1, 2)).relu()
    return torch.baddbmm(p["head.2.bias"].unsqueeze(1), z, p["head.2.weight"].transpose(1, 2))


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
    return _grouped_head(p, _grouped_encode(p, x, shared_input))


def grouped_forward(p: dict[str, Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
    """Training forward pass of G stacked :class:`EncoderDecoderClassifier` clients, differentiable.

    Grouped convolutions (clients along the channel axis, channels-last memory), grouped transposed
    convolutions for the decoder and ``baddbmm`` for the dense layers; equal (to float rounding) to
    running each client's ``forward`` on its own images (tests/test_sage_engine.py).

    Args:
        p: ``{name: [G, ...]}`` all parameters of the G clients.
        x: float [N, G * C, H, W] in [0, 1], client g's images in channels g C .. (g+1) C - 1.
    Returns:
        (logits float [G, N, n_classes], reconstruction float [N, G * C, H, W]).
    """
    z = _grouped_encode(p, x, shared_input=False)                       # [G, N, latent]
    g, n = z.shape[0], z.shape[1]
    d = torch.baddbmm(p["decoder.0.bias"].unsqueeze(1), z, p["decoder.0.weight"].transpose(1, 2)).relu()
    w3, w5 = p["decoder.3.weight"], p["decoder.5.weight"]               # [G, 2w, w, 4, 4], [G, w, C, 4, 4]
    side = x.shape[-1] // 4
    d = d.transpose(0, 1).reshape(n, g * w3.shape[1], side, side).contiguous(memory_format=torch.channels_last)
    d = F.conv_transpose2d(d, w3.flatten(0, 1), p["decoder.3.bias"].flatten(), stride=2, padding=1, groups=g).relu()
    r = F.conv_transpose2d(d, w5.flatten(0, 1), p["decoder.5.bias"].flatten(), stride=2, padding=1, groups=g)
    return _grouped_head(p, z), r.sigmoid()


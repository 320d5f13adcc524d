"""Stacked LeNet-5 (Caffe form) for the gossip simulation, with its SGD and "inv" learning rate
(Tian et al., arXiv 2404.04616, Sec. III-A): all nodes' parameters in one ``[N, P]`` tensor, one
batched step. Details: docs/gossip.md, "Module notes".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from etl.errors import InputError

#: Caffe LeNet (examples/mnist/lenet_train_test.prototxt): layer name -> parameter shapes.
#: conv1 20x5x5 -> max-pool 2 -> conv2 50x5x5 -> max-pool 2 -> ip1 500 -> ReLU -> ip2 10.
LENET5_SHAPES: dict[str, tuple[int, ...]] = {
    "conv1.weight": (20, 1, 5, 5),
    "conv1.bias": (20,),
    "conv2.weight": (50, 20, 5, 5),
    "conv2.bias": (50,),
    "ip1.weight": (500, 800),
    "ip1.bias": (500,),
    "ip2.weight": (10, 500),
    "ip2.bias": (10,),
}

#: Output positions of each layer on a 28 x 28 image: conv1 24 x 24, conv2 8 x 8 (after the first
#: 2 x 2 max-pool), the inner products one each.
LENET5_POSITIONS: dict[str, int] = {"conv1": 24 * 24, "conv2": 8 * 8, "ip1": 1, "ip2": 1}

#: The four trainable layers of LeNet-5 as the paper names them (Fig. 2, Fig. 7).
LAYERS: tuple[str, ...] = ("conv1", "conv2", "ip1", "ip2")

#: Caffe's LeNet input scaling (``scale: 0.00390625`` = 1/256 in lenet_train_test.prototxt).
PIXEL_SCALE = 1.0 / 256.0

ENGINES = ("grouped", "vmap")


@dataclass(frozen=True)
class ParamLayout:
    """Where each named parameter lives inside the flat ``[N, P]`` tensor.

    Attributes:
        names: parameter names in order (``LENET5_SHAPES`` order).
        shapes: per-name shape of one node's parameter.
        offsets: per-name start column in the flat tensor.
        sizes: per-name element count.
        total: P, the number of parameters of one model.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    total: int

    @classmethod
    def from_shapes(cls, shapes: dict[str, tuple[int, ...]]) -> ParamLayout:
        """Build the layout of ``shapes`` (name -> shape of one model's tensor)."""
        names = tuple(shapes)
        sizes = tuple(math.prod(shapes[n]) for n in names)
        offsets = tuple(int(sum(sizes[:i])) for i in range(len(names)))
        return cls(names, tuple(shapes[n] for n in names), offsets, sizes, int(sum(sizes)))

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-name views ``[n, *shape]`` of a flat ``[n, P]`` tensor (no copy)."""
        n = flat.shape[0]
        return {name: flat[:, o:o + s].view(n, *shp)
                for name, shp, o, s in zip(self.names, self.shapes, self.offsets, self.sizes)}

    def flatten(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """Concatenate per-name ``[n, *shape]`` tensors into one flat ``[n, P]`` tensor."""
        return torch.cat([tensors[name].reshape(tensors[name].shape[0], -1) for name in self.names], dim=1)

    def segment_ids(self, names: tuple[str, ...] | None = None) -> torch.Tensor:
        """int64 ``[P]``: index (into ``names``, default all parameter names) of each flat column."""
        names = self.names if names is None else names
        ids = torch.empty(self.total, dtype=torch.int64)
        for name, o, s in zip(self.names, self.offsets, self.sizes):
            ids[o:o + s] = names.index(name)
        return ids


LENET5_LAYOUT = ParamLayout.from_shapes(LENET5_SHAPES)


def lenet5_train_flops_per_image() -> int:
    """FLOPs (2 per multiply-add) of one training image through LeNet-5: the forward pass, then a
    weight gradient for every layer and an input gradient for every layer but conv1, each as many
    multiply-adds as the layer's forward: 2 (3 F - F_conv1), F = sum over layers of output
    positions x weights (conv1 288,000, conv2 1,600,000, ip1 400,000, ip2 5,000 multiply-adds).
    Pooling, ReLU and the loss are left out (a few thousand operations)."""
    macs = {layer: LENET5_POSITIONS[layer] * math.prod(LENET5_SHAPES[f"{layer}.weight"]) for layer in LAYERS}
    return 2 * (3 * sum(macs.values()) - macs["conv1"])


def xavier_bound(shape: tuple[int, ...]) -> float:
    """Glorot/Xavier uniform bound sqrt(6 / (fan_in + fan_out)) for a weight of ``shape``.

    fan_in = shape[1] * receptive field, fan_out = shape[0] * receptive field (the PyTorch
    convention of ``torch.nn.init.xavier_uniform_``, which the paper cites, Sec. II-C, ref. [17]).
    The resulting variance is bound**2 / 3 = 2 / (fan_in + fan_out).
    """
    receptive = math.prod(shape[2:]) if len(shape) > 2 else 1
    fan_in, fan_out = shape[1] * receptive, shape[0] * receptive
    return math.sqrt(6.0 / (fan_in + fan_out))


def init_stacked(n_nodes: int, generator: torch.Generator, layout: ParamLayout = LENET5_LAYOUT,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Independent Xavier-uniform initialization of ``n_nodes`` models, stacked.

    Every node draws its own weights (no shared initial model, Sec. II-B / III-C1); biases start
    at 0 (Caffe LeNet's ``bias_filler: constant``).

    Args:
        n_nodes: N >= 1.
        generator: torch random generator (CPU); same seed -> same weights.
    Returns:
        float ``[N, P]`` flat parameters (``layout.views`` gives the layers).
    Raises:
        InputError: ``n_nodes < 1``.
    """
    if n_nodes < 1:
        raise InputError(f"gossip: n_nodes must be >= 1, got {n_nodes}")
    flat = torch.zeros(n_nodes, layout.total, dtype=dtype)
    for name, view in layout.views(flat).items():
        if name.endswith(".weight"):
            b = xavier_bound(view.shape[1:])
            view.copy_(torch.rand(view.shape, generator=generator, dtype=dtype) * (2 * b) - b)
    return flat


def inv_lr(base_lr: float, iteration: torch.Tensor | int, gamma: float = 1e-4, power: float = 0.75) -> torch.Tensor:
    """Caffe "inv" learning-rate policy: ``base_lr * (1 + gamma * iter) ** (-power)``.

    Args:
        iteration: the node's completed training iterations (int or int tensor ``[n]``).
    Returns:
        float64 tensor of the same shape as ``iteration``.
    """
    it = torch.as_tensor(iteration, dtype=torch.float64)
    return base_lr * (1.0 + gamma * it) ** (-power)


# ----------------------------------------------------------------------------------------- forward
def forward_single(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """One plain LeNet-5 (planar dense convolutions): params ``{name: shape}`` of ``LENET5_SHAPES``,
    x float [B, 1, 28, 28] -> logits [B, 10]; the per-node peer of :func:`forward_stacked`."""
    h = F.max_pool2d(F.conv2d(x, p["conv1.weight"], p["conv1.bias"]), 2)
    h = F.max_pool2d(F.conv2d(h, p["conv2.weight"], p["conv2.bias"]), 2)
    h = F.relu(F.linear(h.flatten(1), p["ip1.weight"], p["ip1.bias"]))
    return F.linear(h, p["ip2.weight"], p["ip2.bias"])


def forward_stacked(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """LeNet-5 forward of n stacked models with grouped convolutions and batched matmuls.

    Args:
        params: name -> ``[n, *shape]`` (``LENET5_SHAPES``).
        x: float ``[n, B, 1, 28, 28]`` (each node its own batch) or ``[B, 1, 28, 28]`` (one batch
           shared by all nodes, e.g. the test subset).
    Returns:
        logits ``[n, B, 10]``.
    """
    w1, b1 = params["conv1.weight"], params["conv1.bias"]
    n = w1.shape[0]
    # channels-last activations: oneDNN convolutions and max-pooling over n*20 channels are
    # several times faster on CPU in that memory format
    # (a shared batch is expanded to every node: the grouped path is faster than one wide conv)
    if x.dim() == 4:
        x = x.unsqueeze(0).expand(n, *x.shape)
    bsz = x.shape[1]
    xs = x.transpose(0, 1).reshape(bsz, n, 28, 28).contiguous(memory_format=torch.channels_last)
    h = F.conv2d(xs, w1.reshape(n * 20, 1, 5, 5), b1.reshape(n * 20), groups=n)
    h = F.max_pool2d(h, 2)
    h = F.conv2d(h, params["conv2.weight"].reshape(n * 50, 20, 5, 5), params["conv2.bias"].reshape(n * 50),
                 groups=n)
    h = F.max_pool2d(h, 2)  # [B, n*50, 4, 4]
    h = h.reshape(h.shape[0], n, 800).transpose(0, 1)  # [n, B, 800]
    h = torch.baddbmm(params["ip1.bias"].unsqueeze(1), h, params["ip1.weight"].transpose(1, 2)).relu_()
    return torch.baddbmm(params["ip2.bias"].unsqueeze(1), h, params["ip2.weight"].transpose(1, 2))


def _loss_single(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(forward_single(p, x), y)


_vmapped_grad = vmap(grad(_loss_single), in_dims=(0, 0, 0))


def stacked_gradients(flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, engine: str = "grouped",
                      layout: ParamLayout = LENET5_LAYOUT) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-node gradients of the mean cross-entropy on each node's own batch.

    Args:
        flat: ``[n, P]`` parameters of the n training nodes.
        x: float ``[n, B, 1, 28, 28]``; y: int64 ``[n, B]``.
        engine: "grouped" or "vmap".
    Returns:
        (grads ``[n, P]``, per-node loss ``[n]``).
    Raises:
        InputError: unknown engine.
    """
    if engine == "grouped":
        # one leaf per tensor: gradients of slices of a single flat leaf would each allocate and
        # zero-fill a full [n, P] buffer
        leaves = {k: v.detach().requires_grad_(True) for k, v in layout.views(flat).items()}
        logits = forward_stacked(leaves, x)
        per_node = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape).mean(1)
        grads = torch.autograd.grad(per_node.sum(), list(leaves.values()))
        return layout.flatten(dict(zip(leaves, grads))), per_node.detach()
    if engine == "vmap":
        g = _vmapped_grad(layout.views(flat), x, y)
        with torch.no_grad():
            logits = forward_stacked(layout.views(flat), x)
            per_node = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape).mean(1)
        return layout.flatten(g), per_node
    raise InputError(f"gossip: engine must be one of {ENGINES}, got {engine!r}")


@torch.no_grad()
def sgd_step(flat: torch.Tensor, momentum_buf: torch.Tensor, grads: torch.Tensor, lr: torch.Tensor,
             momentum: float = 0.9, weight_decay: float = 5e-4) -> None:
    """In-place SGD with momentum and weight decay on stacked models (PyTorch ``torch.optim.SGD`` form).

    ``g = grad + wd * w; buf = momentum * buf + g; w -= lr * buf`` with a per-node ``lr [n]``.
    With a constant lr this equals Caffe's ``h = m h + lr (grad + wd w); w -= h``.

    Args:
        flat, momentum_buf, grads: ``[n, P]`` (flat and momentum_buf updated in place).
        lr: ``[n]`` learning rate of each node (from :func:`inv_lr`).
    """
    g = grads.add(flat, alpha=weight_decay)
    momentum_buf.mul_(momentum).add_(g)
    flat.sub_(momentum_buf * lr.to(flat.dtype).unsqueeze(1))


@torch.no_grad()
def predict_stacked(flat: torch.Tensor, x: torch.Tensor, layout: ParamLayout = LENET5_LAYOUT,
                    chunk: int = 32) -> torch.Tensor:
    """Predicted classes of n models on one shared batch.

    Args:
        flat: ``[n, P]``; x: float ``[B, 1, 28, 28]``; chunk: images per grouped pass (32 keeps
            the activations of 50 models in the CPU's cache: 1.19x less CPU than 128 for 50 models on
            2,000 images, 2-core Intel Xeon, the same predictions).
    Returns:
        int64 ``[n, B]``.
    """
    views = layout.views(flat)
    out = [forward_stacked(views, x[i:i + chunk]).argmax(-1) for i in range(0, x.shape[0], chunk)]
    return torch.cat(out, dim=1)


@torch.no_grad()
def accuracy_stacked(flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                     layout: ParamLayout = LENET5_LAYOUT) -> torch.Tensor:
    """Accuracy of each of n models on one shared labelled batch: float ``[n]`` in [0, 1]."""
    return (predict_stacked(flat, x, layout) == y.unsqueeze(0)).float().mean(1)


@torch.no_grad()
def accuracy_own(flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, layout: ParamLayout = LENET5_LAYOUT) -> torch.Tensor:
    """Accuracy of each model on its own batch: x ``[n, B, 1, 28, 28]``, y ``[n, B]`` -> ``[n]``."""
    return (forward_stacked(layout.views(flat), x).argmax(-1) == y).float().mean(1)


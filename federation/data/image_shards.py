"""Client shards and communication graphs of the SAGE benchmark (Sec. V-A).

A Dirichlet(alpha) label partition (``etl.partition.dirichlet_partition``) assigns training images to
K clients; each client's shard is split 80 / 10 / 10 into local-optimisation, anchor-pool and
local-evaluation parts, disjoint. The data set's test set stays shared for global accuracy and
macro-F1. Index tables are padded with -1 along a leading client axis so every later computation
is stacked.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np
import torch
from torch import Tensor

from etl.errors import InputError
from etl.images import FASHION_MNIST_DIR, ImageDataset, load_cifar10, load_idx_dataset
from etl.partition import dirichlet_partition
from federation.core.graphs import GRAPH_ALIASES, build_graph


def load_image_dataset(dataset: str, data_root: str | None) -> ImageDataset:
    """The image data set of an image federation or a SAGE config: ``fmnist`` (Debian's Fashion-MNIST
    unless ``data_root``) or ``cifar10`` (``data_root`` holding cifar-10-batches-py).

    Raises:
        InputError: ``cifar10`` without ``data_root``, or an unreadable data folder.
    """
    if dataset == "fmnist":
        return load_idx_dataset(data_root or FASHION_MNIST_DIR, "fashion-mnist")
    if data_root is None:
        raise InputError("sage config: option 'data_root' is required for dataset cifar10 "
                         "(a folder holding cifar-10-batches-py)")
    return load_cifar10(data_root)


def probe_bytes_per_anchor(x_train: Tensor, n_classes: int) -> int:
    """Bytes one (receiver, candidate, anchor) probe moves: the uint8 image out, float32 logits back.

    Args:
        x_train: uint8 [N, C, H, W] (C H W bytes per anchor image).
    """
    return int(x_train[0].numel()) * x_train.element_size() + 4 * n_classes


@dataclass
class ClientShards:
    """Per-client row indices into the training images, padded to a common width.

    Attributes:
        train_index / anchor_index / eval_index: long [K, N_max_split] rows of ``x_train``
            (padding 0; use the counts).
        n_train / n_anchor / n_eval: long [K] valid entries per client.
        x_train: uint8 [N, C, H, W]; y_train: long [N]; x_test: uint8 [N_test, C, H, W];
        y_test: long [N_test]; n_classes: int.
    """

    train_index: Tensor
    anchor_index: Tensor
    eval_index: Tensor
    n_train: Tensor
    n_anchor: Tensor
    n_eval: Tensor
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    n_classes: int

    @property
    def n_clients(self) -> int:
        """K, the number of clients."""
        return int(self.n_train.shape[0])


def _pad(parts: list[np.ndarray]) -> tuple[Tensor, Tensor]:
    width = max(1, max(len(p) for p in parts))
    out = np.zeros((len(parts), width), dtype=np.int64)
    for i, p in enumerate(parts):
        out[i, :len(p)] = p
    return torch.from_numpy(out), torch.tensor([len(p) for p in parts], dtype=torch.long)


def subsample(ds: ImageDataset, n_train: int | None, n_test: int | None, seed: int) -> ImageDataset:
    """Uniformly random subsets of the train / test sets (for quick runs and tests)."""
    rng = np.random.default_rng(seed + 7919)
    xtr, ytr, xte, yte = ds.x_train, ds.y_train, ds.x_test, ds.y_test
    if n_train is not None and n_train < len(ytr):
        i = np.sort(rng.choice(len(ytr), n_train, replace=False))
        xtr, ytr = xtr[i], ytr[i]
    if n_test is not None and n_test < len(yte):
        i = np.sort(rng.choice(len(yte), n_test, replace=False))
        xte, yte = xte[i], yte[i]
    return ImageDataset(xtr, ytr, xte, yte, ds.n_classes, ds.name)


def make_shards(ds: ImageDataset, n_clients: int, alpha: float, seed: int,
                split: tuple[float, float, float] = (0.8, 0.1, 0.1), min_size: int = 10) -> ClientShards:
    """Dirichlet(alpha) partition over K clients, each shard split train / anchor / eval (Sec. V-A).

    Client k's shard of n_k images is shuffled and cut into n_k - a - e training, a anchor-pool and
    e local-evaluation images with a = round(split[1] n_k), e = round(split[2] n_k).

    Raises:
        InputError: bad K / alpha, or the partition cannot give every client ``min_size`` images.
    """
    if abs(sum(split) - 1.0) > 1e-9 or min(split) < 0:
        raise InputError(f"sage config: split must be three non-negative fractions summing to 1, got {split}")
    parts = dirichlet_partition(ds.y_train, n_clients, alpha, seed, min_size=min_size)
    rng = np.random.default_rng(seed + 104729)
    tr, an, ev = [], [], []
    for p in parts:
        p = rng.permutation(p)
        a = int(round(split[1] * len(p)))
        e = int(round(split[2] * len(p)))
        an.append(p[:a])
        ev.append(p[a:a + e])
        tr.append(p[a + e:])
    ti, tn = _pad(tr)
    ai, anc = _pad(an)
    ei, en = _pad(ev)
    return ClientShards(ti, ai, ei, tn, anc, en, torch.from_numpy(np.ascontiguousarray(ds.x_train)),
                        torch.from_numpy(ds.y_train.astype(np.int64)),
                        torch.from_numpy(np.ascontiguousarray(ds.x_test)),
                        torch.from_numpy(ds.y_test.astype(np.int64)), ds.n_classes)


def make_graph(kind: str, n_clients: int, seed: int, er_p: float = 0.15, ba_m: int = 3) -> nx.Graph:
    """The configuration's communication graph (Sec. V-A), shared by every selector.

    ``er`` (Erdos-Renyi G(K, p), redrawn until connected) or ``ba`` (Barabasi-Albert, m edges per
    new node), drawn by :func:`federation.core.graphs.build_graph` (the one graph module).

    Raises:
        InputError: a kind other than ER / BA, or parameters the family cannot satisfy.
    """
    if n_clients < 2:
        raise InputError(f"sage config: n_clients must be >= 2, got {n_clients}")
    canon = GRAPH_ALIASES.get(str(kind).lower(), str(kind).lower())
    if canon not in ("erdos-renyi", "barabasi-albert"):
        raise InputError(f"sage config: graph must be 'er' or 'ba', got {kind!r}")
    return build_graph(canon, n_clients, seed, p=er_p, m=ba_m)

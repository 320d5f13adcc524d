"""Image federations: the SAGE benchmark's image clients as a :class:`federation.data.tensors.FederatedData`.

A directory holding ``images.yaml`` (:class:`ImageSpec`) is an image federation; everything that
takes a cohort directory takes it too (:mod:`federation.data.load` picks the loader). Design:
docs/cross.md.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import ConfigDict, Field, ValidationError

from etl.errors import InputError
from federation.core.config import NumbersNotFlags, first_error, load_yaml
from federation.core.image_metrics import accuracy
from federation.data.image_shards import load_image_dataset, make_shards, subsample
from federation.data.tensors import FederatedData, SplitTensors

__all__ = ["IMAGES_FILE", "ImageSpec", "ImageFederation", "is_image_federation", "load_image_federation",
           "image_federation_id"]

#: the file that makes a directory an image federation
IMAGES_FILE = "images.yaml"


class ImageSpec(NumbersNotFlags):
    """``images.yaml``: which image clients form the federation (defaults: SAGE paper Sec. V-A).

    Attributes:
        dataset: ``fmnist`` (``/usr/share/datasets/fashion-mnist`` unless ``data_root``) or ``cifar10``.
        n_clients: K clients (centers).
        alpha_dir: Dirichlet concentration of the label partition (0.1: strong label skew).
        partition_seed: seed of the subsample and the partition (fixed per federation, like a cohort).
        train_samples: optional uniform subsample of the training images (the clients' pool).
        batch_size, local_epochs, lr, recon_weight: the SAGE model's local training (Adam, batch 64,
            one local epoch, CE + recon_weight * MSE reconstruction).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: Literal["fmnist", "cifar10"] = "fmnist"
    data_root: str | None = None
    n_clients: int = Field(10, ge=2)
    alpha_dir: float = Field(0.1, gt=0)
    partition_seed: int = Field(0, ge=0)
    train_samples: int | None = Field(None, ge=1)
    batch_size: int = Field(64, ge=1)
    local_epochs: int = Field(1, ge=1)
    lr: float = Field(1e-3, gt=0)
    recon_weight: float = Field(1.0, ge=0)


def is_image_federation(path: str | Path) -> bool:
    """True when ``path`` is a directory holding ``images.yaml`` (an image federation, not a cohort)."""
    return (Path(path) / IMAGES_FILE).is_file()


def read_image_spec(path: str | Path) -> ImageSpec:
    """The :class:`ImageSpec` of an image-federation directory.

    Raises:
        InputError: bad YAML or option (the message names the file and the option).
    """
    f = Path(path) / IMAGES_FILE
    doc = load_yaml(f)
    try:
        return ImageSpec.model_validate(doc)
    except ValidationError as exc:
        loc, msg = first_error(exc)
        raise InputError(f"{f}: option '{loc}': {msg}" if loc else f"{f}: {msg}") from None


def image_federation_id(path: str | Path) -> str:
    """SHA-256 (16 hex digits) of the canonical ``images.yaml`` content: the federation's cohort id
    (same clients -> same id, whatever the folder)."""
    spec = read_image_spec(path)
    return hashlib.sha256(("images:" + spec.model_dump_json()).encode()).hexdigest()[:16]


def _class_shares(y: torch.Tensor, mask: torch.Tensor, n_classes: int) -> torch.Tensor:
    """``[K, n_classes]`` float64 share of each class among each client's masked rows."""
    k = y.shape[0]
    code = (torch.arange(k)[:, None] * n_classes + y.long()).masked_select(mask)
    counts = torch.bincount(code, minlength=k * n_classes).view(k, n_classes).to(torch.float64)
    return counts / counts.sum(1, keepdim=True).clamp(min=1)


@dataclass
class ImageFederation(FederatedData):
    """The SAGE benchmark's clients as a :class:`FederatedData` (see the module docstring).

    Extra attributes:
        spec: the :class:`ImageSpec`; shards: the
            :class:`federation.data.image_shards.ClientShards` (uint8 image pool ``x_train [N, C, H, W]``,
            labels ``y_train [N]``, per-client row indices).
        rows: ``{split: long [K, max_rows]}`` rows of ``shards.x_train`` of each client's split
            (padding 0; ``splits[split].mask`` marks real rows).

    ``splits[s].y`` holds class ids as float32 (``[K, max_rows]``); ``splits[s].x`` is empty
    (``[K, max_rows, 0]``): the images stay in the shared uint8 pool. ``meta`` ``[K, 15]`` /
    ``meta_base`` ``[K, 3]`` are the ABPS metadata vectors' image analogues: base = (share of the
    client's most frequent class, ln n_train, share of classes present); full = base + the 12
    prevalence slots holding the class shares (zero-padded past n_classes); both computed from the
    train split, as the clinical vectors.
    """

    spec: ImageSpec = field(default_factory=ImageSpec)
    shards: Any = None
    rows: dict[str, torch.Tensor] = field(default_factory=dict)

    #: the per-center figure of :meth:`split_metric` (results and the cross table)
    metric_name = "accuracy"
    #: the clinical end-of-run figures (calibration, subgroups) do not apply
    clinical = False

    def split_metric(self, scores: torch.Tensor, split: str) -> torch.Tensor:
        """``[K]`` float64 accuracy of class logits ``scores [K, rows, n_classes]`` on each client's
        ``split`` (NaN for a client without rows in it; SAGE paper Sec. V-C, client accuracy)."""
        s = self.splits[split]
        return accuracy(s.y.long(), scores.argmax(-1), s.mask)

    def with_preprocessing(self, cfg: Any) -> ImageFederation:
        """Images need no numeric encoding: the federation itself (pixels are scaled to [0, 1] by the model)."""
        return self

    def pooled(self) -> FederatedData:
        """Refused: the Centralized reference is not part of the image cross runs."""
        raise InputError("the centralized reference does not run on an image federation")


def load_image_federation(path: str | Path) -> ImageFederation:
    """Build the image federation described by ``path/images.yaml``.

    Raises:
        InputError: bad spec, missing data folder, or a partition that leaves a client too few images.
    """
    spec = read_image_spec(path)
    ds = load_image_dataset(spec.dataset, spec.data_root)
    ds = subsample(ds, spec.train_samples, None, spec.partition_seed)
    sh = make_shards(ds, spec.n_clients, spec.alpha_dir, spec.partition_seed)
    k = sh.n_clients
    splits, rows = {}, {}
    for name, (index, n) in {"train": (sh.train_index, sh.n_train), "val": (sh.anchor_index, sh.n_anchor),
                             "test": (sh.eval_index, sh.n_eval)}.items():
        mask = torch.arange(index.shape[1])[None, :] < n[:, None]
        y = torch.where(mask, sh.y_train[index], torch.zeros((), dtype=torch.long)).to(torch.float32)
        splits[name] = SplitTensors(torch.zeros(k, index.shape[1], 0), y, mask, n.clone())
        rows[name] = index
    tr = splits["train"]
    shares = _class_shares(tr.y, tr.mask, sh.n_classes)
    base = torch.stack([shares.max(1).values, torch.log(tr.n.to(torch.float64).clamp(min=1)),
                        (shares > 0).to(torch.float64).mean(1)], dim=1)
    slots = torch.zeros(k, 12, dtype=torch.float64)
    slots[:, : min(12, sh.n_classes)] = shares[:, :12]
    width = len(str(k - 1))
    return ImageFederation(
        center_ids=[f"client{i:0{width}d}" for i in range(k)], feature_names=["pixels"], splits=splits,
        meta=torch.cat([base, slots], dim=1).float(), meta_base=base.float(), preprocessing="images",
        spec=spec, shards=sh, rows=rows)

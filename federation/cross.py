"""Any selector on any data set (issue 18): the SAGE benchmark's image clients as a federation of the
clinical runtime, and the cross sweep over several data sets.

The clinical runtime (:func:`federation.runner.run_one`) runs every registered method: ABPS / ABPS-X,
FedAvg, DeFTA, random partners and the SAGE selectors (:mod:`federation.methods.sage_selector`). This module
lets the same loop, the same method registry and the same :class:`federation.ledger.Ledger` run on
the SAGE image benchmark's clients:

* :class:`ImageFederation` is a :class:`federation.data.FederatedData` whose centers are the image
  clients of a Dirichlet(alpha) label partition (:func:`federation.images.data.make_shards`, SAGE
  paper Sec. V-A): split ``train`` = the client's local-optimisation part (80 %), ``val`` = its anchor
  pool (10 %; ABPS's coalition utilities, DeFTA's trust, early stopping, SAGE anchors), ``test`` = its
  local evaluation part (10 %; the reported figure is SAGE Table II's client accuracy). Its per-center
  metric is accuracy, not AUROC (:meth:`ImageFederation.split_metric`).
* :class:`ImageEngine` trains the SAGE model (:class:`federation.images.models.StackedModel`, conv
  encoder-decoder + 2-layer head) of every client at once; the runner reaches it through the
  method hook ``make_engine``; its :meth:`ImageEngine.layout` says which parameters cross the
  network (``exchange.head_layers``: 0 = all, 1 = ``head.2`` kept local, 2 = the head phi kept local,
  SAGE's split) and how many parameters each tensor holds (ledger payload).
* An image federation is a directory holding ``images.yaml`` (:class:`ImageSpec`), so everything
  that takes a cohort directory (``abps train --cohort``, ``abps sweep --cohort``, sweep cells)
  takes it too (:func:`is_image_federation`; the dispatch is in ``FederatedData.from_cohort`` and
  ``cohort_id``).
* :func:`run_cross_sweep` runs one sweep file whose ``datasets:`` names several cohorts (clinical
  or image) in one MLflow experiment; ``abps report`` then builds the cross table
  (:mod:`federation.report.cross`).

Design and reasons: docs/cross.md, docs/decisions.md ("Any selector on any data set").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from etl.errors import InputError
from federation.config import EngineConfig, RunConfig, load_yaml
from federation.data import FederatedData, SplitTensors
from federation.engine import AdamState, StackedParams, mix_seed
from federation.mixing import mix

__all__ = ["IMAGES_FILE", "ImageSpec", "ImageFederation", "ImageEngine", "is_image_federation",
           "load_image_federation", "image_federation_id", "run_cross_sweep", "DATASET_TAG", "METRIC_TAG"]

#: the file that makes a directory an image federation
IMAGES_FILE = "images.yaml"
#: MLflow tags a cross sweep sets on each data set's parent sweep run (read by federation.report.cross)
DATASET_TAG = "abps.dataset"
METRIC_TAG = "abps.metric"


class ImageSpec(BaseModel):
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
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "images"
        raise InputError(f"{f}: option '{loc}': {err['msg']}") from None


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
        spec: the :class:`ImageSpec`; model_spec: the SAGE architecture
            (:class:`federation.images.models.ModelSpec`); shards: the
            :class:`federation.images.data.ClientShards` (uint8 image pool ``x_train [N, C, H, W]``,
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
    model_spec: Any = None
    shards: Any = None
    rows: dict[str, torch.Tensor] = field(default_factory=dict)

    #: the per-center figure of :meth:`split_metric` (results and the cross table)
    metric_name = "accuracy"
    #: the clinical end-of-run figures (calibration, subgroups) do not apply
    clinical = False

    def split_metric(self, scores: torch.Tensor, split: str) -> torch.Tensor:
        """``[K]`` float64 accuracy of class logits ``scores [K, rows, n_classes]`` on each client's
        ``split`` (NaN for a client without rows in it; SAGE paper Sec. V-C, client accuracy)."""
        from federation.images.metrics import accuracy

        s = self.splits[split]
        return accuracy(s.y.long(), scores.argmax(-1), s.mask)

    def with_preprocessing(self, cfg: Any) -> "ImageFederation":
        """Images need no numeric encoding: the federation itself (pixels are scaled to [0, 1] by the model)."""
        return self

    def pooled(self) -> "FederatedData":
        """Refused: the Centralized reference is not part of the image cross runs."""
        raise InputError("the centralized reference does not run on an image federation")

    def make_engine(self, cfg: RunConfig, seed: int) -> "ImageEngine":
        """The stacked SAGE-model trainer of this federation (the runner's ``make_engine`` hook)."""
        return ImageEngine(self, cfg, seed)


def load_image_federation(path: str | Path) -> ImageFederation:
    """Build the image federation described by ``path/images.yaml``.

    Raises:
        InputError: bad spec, missing data folder, or a partition that leaves a client too few images.
    """
    from federation.images.data import make_shards, subsample
    from federation.images.run import SageConfig, load_dataset

    spec = read_image_spec(path)
    ds, model_spec = load_dataset(SageConfig(dataset=spec.dataset, data_root=spec.data_root))
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
        spec=spec, model_spec=model_spec, shards=sh, rows=rows)


class ImageEngine:
    """Stacked SAGE-model training and prediction for an :class:`ImageFederation` (the runner's
    engine interface: ``init_params``, ``train_round``, ``predict``; plus :meth:`layout`,
    :meth:`evaluate_mixtures` and :meth:`pair_logits` for the methods).

    Local training is :meth:`federation.images.models.StackedModel.local_epoch` (Adam per client,
    kept across rounds as in the SAGE benchmark; a fresh Adam state when the runner hands a new
    ``AdamState``, i.e. ``engine.reset_optimizer_each_round``). The batch order of round r is drawn
    from a generator keyed by (seed, r): same seed, same run.

    Raises:
        InputError: the run config changes the clinical MLP's ``engine`` section (the SAGE model
            trains with the federation's ``images.yaml`` settings) or a method asks for a local loss.
    """

    def __init__(self, data: ImageFederation, cfg: RunConfig, seed: int) -> None:
        from federation.images.models import StackedModel

        base = EngineConfig(reset_optimizer_each_round=cfg.engine.reset_optimizer_each_round)
        if cfg.engine != base:
            raise InputError(f"{cfg.method}: the run config's `engine:` section sets the clinical MLP; on an image "
                             f"federation the SAGE model trains with {IMAGES_FILE}'s batch_size / local_epochs / lr")
        self.data, self.seed = data, int(seed)
        s = data.spec
        self.model = StackedModel(data.model_spec, data.n_centers, self.seed, lr=s.lr, recon_weight=s.recon_weight)
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
        from federation.images.models import StackedAdam

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

    def _classify(self, params: StackedParams, rows: torch.Tensor, chunk: int = 64) -> torch.Tensor:
        """Logits ``[G, M, n_classes]`` of G stacked predictors, predictor g on images ``rows[g]``
        (``rows`` long ``[G, M]`` into the pool)."""
        from federation.images.models import grouped_classify, to_float

        g_all, m = rows.shape
        out = torch.empty(g_all, m, self.data.model_spec.n_classes)
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
    def evaluate_mixtures(self, ctx: Any, wc: torch.Tensor, tc: torch.Tensor, split: str = "val",
                          params: StackedParams | None = None, chunk: int = 32) -> torch.Tensor:
        """``[m]`` float64 accuracy of candidate mixtures (``Context.evaluate_mixtures`` on an image
        federation): row r mixes the exchanged block as ``sum_j wc[r, j] wire(theta_j)`` (target
        ``tc[r]``'s own copy unrounded, :func:`federation.mixing.mix`), keeps ``tc[r]``'s own head, and
        is scored on ``tc[r]``'s ``split``. ``theta`` defaults to ``ctx.pre_exchange``. NaN where the
        target has no rows in the split."""
        from federation.images.metrics import accuracy

        theta = params if params is not None else ctx.pre_exchange
        dense = wc.to_dense() if wc.is_sparse else wc
        s, rows = self.data.splits[split], self.data.rows[split]
        out = torch.empty(dense.shape[0], dtype=torch.float64)
        keys = [k for k in theta if not k.startswith("decoder.")]
        for lo in range(0, dense.shape[0], chunk):
            w, t = dense[lo:lo + chunk], tc[lo:lo + chunk]
            model = {k: mix(w, theta[k], ctx.bf16, own=t) if k in ctx.exchanged else theta[k][t] for k in keys}
            logits = self._classify(model, rows[t])
            out[lo:lo + chunk] = accuracy(s.y[t].long(), logits.argmax(-1), s.mask[t])
        return out

    @torch.no_grad()
    def pair_logits(self, x_all: torch.Tensor, model_index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The SAGE probe (eq. (4)): logits ``[P, M, n_classes]`` of client ``model_index[p]``'s live model
        on pool images ``rows[p]`` (:meth:`federation.images.models.StackedModel.pair_logits`)."""
        return self.model.pair_logits(x_all, model_index, rows)

    def probe_view(self) -> Any:
        """(probe model, shards) for :func:`federation.images.probe.probe`: the live models and the
        image clients (anchor pool = the ``val`` split)."""
        return self, self.data.shards

    def probe_bytes_per_anchor(self) -> int:
        """Bytes one (receiver, candidate, anchor) probe moves: the uint8 image out, float32 logits back."""
        from federation.images.run import probe_bytes_per_anchor

        return probe_bytes_per_anchor(self.data.shards.x_train, self.data.shards.n_classes)


# --------------------------------------------------------------------------------------------
# the cross sweep: one sweep file, several data sets, one experiment

class CrossDataset(BaseModel):
    """One column of the cross table: a cohort (clinical) or image-federation directory."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cohort: str
    rounds: int | None = Field(None, ge=1)
    seeds: list[int] | None = Field(None, min_length=1)


def load_cross_sweep(path: str | Path) -> tuple[Any, Path, dict[str, CrossDataset]]:
    """Read a cross sweep file: a sweep file (:class:`federation.sweep.SweepSpec`) plus ``datasets:``
    (label -> directory, or ``{cohort: DIR, rounds: R, seeds: [...]}`` overriding the file's rounds /
    seeds for that data set; relative paths from the file's folder).

    Raises:
        InputError: no ``datasets:``, a bad entry, or an invalid sweep field.
    """
    from federation.sweep import SweepSpec

    doc = load_yaml(path)
    raw = doc.pop("datasets", None)
    if not isinstance(raw, dict) or not raw:
        raise InputError(f"{path}: `datasets:` must map data-set labels to cohort directories")
    base = Path(path).resolve().parent
    sets: dict[str, CrossDataset] = {}
    for label, v in raw.items():
        try:
            d = CrossDataset.model_validate({"cohort": v} if isinstance(v, str) else v)
        except ValidationError as exc:
            raise InputError(f"{path}: datasets.{label}: {exc.errors()[0]['msg']}") from None
        p = Path(d.cohort)
        sets[str(label)] = d.model_copy(update={"cohort": str(p if p.is_absolute() else base / p)})
    try:
        spec = SweepSpec.model_validate(doc)  # the rest is an ordinary sweep file
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise InputError(f"{path}: invalid sweep field {loc}: {first.get('msg')}") from None
    labels = [e.name for e in spec.methods]
    if len(set(labels)) != len(labels):
        raise InputError(f"{path}: methods: a label appears twice (give entries distinct `label:`)")
    return spec, base, sets


def is_cross_sweep(path: str | Path) -> bool:
    """True when the sweep file has a ``datasets:`` key (``abps sweep`` hands it to :func:`run_cross_sweep`)."""
    return "datasets" in load_yaml(path)


def run_cross_sweep(path: str | Path, *, only: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
    """Run a cross sweep: the file's methods x seeds on every data set of ``datasets:``, each data set
    one ordinary sweep (:func:`federation.sweep.run_sweep`, resumable) in the same MLflow experiment,
    its parent run tagged with the data set's label (:data:`DATASET_TAG`) and metric
    (:data:`METRIC_TAG`: ``auroc`` or ``accuracy``).

    Args:
        path: the cross sweep file (``configs/cross.yaml``).
        only: labels of the data sets to run (default all).
        kwargs: passed to :func:`run_sweep` (executor, workers, rounds, seeds, tracking_uri,
            experiment, progress); ``rounds`` / ``seeds`` override the data sets' own.

    Returns:
        ``{label: SweepOutcome}``.

    Raises:
        InputError: bad file, unknown label in ``only``, or a bad cohort.
    """
    from federation.sweep import run_sweep
    from federation.tracking import Tracker

    spec, base, sets = load_cross_sweep(path)
    unknown = sorted(set(only or ()) - set(sets))
    if unknown:
        raise InputError(f"{path}: no data set {unknown[0]!r}; known: {', '.join(sets)}")
    experiment = kwargs.pop("experiment", None) or spec.experiment or spec.name
    rounds = kwargs.pop("rounds", None)
    out: dict[str, Any] = {}
    for label, d in sets.items():
        if only and label not in only:
            continue
        sub = spec.model_copy(update={"name": f"{spec.name}-{label}"})
        res = run_sweep(sub, base, d.cohort, rounds=rounds or d.rounds, experiment=experiment,
                        seeds=kwargs.get("seeds") or d.seeds, **{k: v for k, v in kwargs.items() if k != "seeds"})
        metric = getattr(FederatedData.from_cohort(d.cohort), "metric_name", "auroc")
        tracker = Tracker(kwargs.get("tracking_uri"), experiment, create=False)
        tracker.client.set_tag(res.parent_run_id, DATASET_TAG, label)
        tracker.client.set_tag(res.parent_run_id, METRIC_TAG, metric)
        out[label] = res
    return out


def cross_summary_line(label: str, res: Any) -> str:
    """One console line per data set of a cross sweep."""
    return (f"  {label}: {len(res.cells)} cells, {len(res.skipped)} already finished, {len(res.ran)} run now, "
            f"{len(res.failed)} failed")

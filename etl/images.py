"""Image data sets for the benchmarks: IDX (MNIST / Fashion-MNIST), CIFAR-10 batches.

Client partitions (Dirichlet / IID) live in :mod:`etl.partition`, shared with the clinical ETL.

Fashion-MNIST is installed by Debian's ``dataset-fashion-mnist`` package under
``/usr/share/datasets/fashion-mnist`` (the Makefile installs it); any folder holding the four IDX
files (``train-images-idx3-ubyte[.gz]`` ...) works, as does a CIFAR-10 ``cifar-10-batches-py``
folder given by the user.
"""

from __future__ import annotations

import gzip
import pickle
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from etl.errors import InputError

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
               0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


@dataclass(frozen=True)
class ImageDataset:
    """A labelled image data set held in memory.

    Attributes:
        x_train: uint8 [N_train, C, H, W] pixel values 0..255.
        y_train: int64 [N_train] class labels 0..n_classes-1.
        x_test: uint8 [N_test, C, H, W].
        y_test: int64 [N_test].
        n_classes: number of classes (10 for Fashion-MNIST and CIFAR-10).
        name: data set name.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    name: str


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed) into a numpy array.

    The IDX format (LeCun et al., MNIST) is a 4-byte magic ``0 0 dtype ndim``, ``ndim``
    big-endian uint32 dimension sizes, then the data in C order.

    Raises:
        InputError: the file is missing, truncated, or not IDX.
    """
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except (OSError, EOFError) as exc:
        raise InputError(f"{path}: unreadable ({exc.__class__.__name__})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise InputError(f"{path}: not an IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise InputError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    count = int(np.prod(shape)) if shape else 0
    if len(raw) - header != count * dtype.itemsize:
        raise InputError(f"{path}: IDX payload size does not match its header {shape}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _find(root: Path, stem: str) -> Path:
    for cand in (root / stem, root / f"{stem}.gz"):
        if cand.exists():
            return cand
    raise InputError(f"{root}: missing IDX file {stem}[.gz]")


def load_idx_dataset(root: str | Path = FASHION_MNIST_DIR, name: str = "fashion-mnist") -> ImageDataset:
    """Load MNIST-style IDX files from ``root`` as uint8 [N, 1, 28, 28] images.

    Raises:
        InputError: a file is missing or malformed, or images and labels disagree in count.
    """
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"{root}: image data folder not found (for Fashion-MNIST: apt-get install dataset-fashion-mnist)")
    xtr = read_idx(_find(root, "train-images-idx3-ubyte"))
    ytr = read_idx(_find(root, "train-labels-idx1-ubyte"))
    xte = read_idx(_find(root, "t10k-images-idx3-ubyte"))
    yte = read_idx(_find(root, "t10k-labels-idx1-ubyte"))
    if xtr.ndim != 3 or xte.ndim != 3 or len(xtr) != len(ytr) or len(xte) != len(yte):
        raise InputError(f"{root}: IDX images and labels do not match")
    return ImageDataset(xtr[:, None].copy(), ytr.astype(np.int64), xte[:, None].copy(),
                        yte.astype(np.int64), 10, name)


class _CifarUnpickler(pickle.Unpickler):
    """Unpickler for CIFAR-10 batches that builds only plain containers and numpy arrays.

    A pickle can run arbitrary code while loading; a CIFAR folder given by the user is
    untrusted input, so any other global (``os.system``, ...) is refused.
    """

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"), ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):  # noqa: D102
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR-10 batch")


def load_cifar10(root: str | Path) -> ImageDataset:
    """Load the CIFAR-10 python batches (``data_batch_1..5``, ``test_batch``) as uint8 [N, 3, 32, 32].

    Raises:
        InputError: the folder or a batch is missing or malformed.
    """
    root = Path(root)
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"

    def batch(name: str) -> tuple[np.ndarray, np.ndarray]:
        path = root / name
        try:
            with path.open("rb") as fh:
                d = _CifarUnpickler(fh, encoding="bytes").load()
            x = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
            y = np.asarray(d[b"labels"], dtype=np.int64)
        except FileNotFoundError:
            raise InputError(f"{path}: CIFAR-10 batch not found") from None
        except Exception as exc:  # pickle / key / reshape errors
            raise InputError(f"{path}: not a CIFAR-10 python batch ({exc.__class__.__name__})") from None
        return x, y

    parts = [batch(f"data_batch_{i}") for i in range(1, 6)]
    xte, yte = batch("test_batch")
    return ImageDataset(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                        xte, yte, 10, "cifar10")

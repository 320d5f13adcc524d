"""Fused element-wise CPU kernels of the stacked engine's hand-written training step.

Details: docs/runtime.md, "Engine kernels in full".
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np
import torch

from etl.io import user_cache_dir
from federation.core import provenance

#: the C++ source, shipped as package data (``federation/engine/csrc/abps_kernels.cpp``).
SOURCE_PATH = Path(__file__).parent / "csrc" / "abps_kernels.cpp"

#: version the library must report (``abps_kernels_version``); bump with any change of the table.
VERSION = 3

#: The one signature table: every exported function, its C return type and its parameters (C type,
#: name). The ctypes ``argtypes`` / ``restype`` and the generated header ``abps_kernels.h`` (which the
#: .cpp includes, so a definition that drifts from this table does not compile) both come from it.
SIGNATURES: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "abps_bias_relu_drop": ("void", (
        ("float*", "z"), ("const float*", "b"), ("const int16_t*", "bits"), ("int64_t", "c"), ("int64_t", "w"),
        ("int64_t", "h"), ("int64_t", "cs"), ("int64_t", "rs"), ("int32_t", "thr"), ("float*", "logits"),
        ("const float*", "lw"), ("const float*", "lb"), ("int32_t", "nthreads"))),
    "abps_outer_relu_grad": ("void", (
        ("float*", "q"), ("float*", "gb"), ("const float*", "dl"), ("const float*", "v"), ("const float*", "hact"),
        ("int64_t", "c"), ("int64_t", "w"), ("int64_t", "h"), ("float", "s"), ("float*", "gw"),
        ("int32_t", "nthreads"))),
    "abps_relu_grad": ("void", (
        ("float*", "g"), ("float*", "gb"), ("const float*", "hact"), ("int64_t", "c"), ("int64_t", "w"),
        ("int64_t", "h"), ("int32_t", "nthreads"))),
    "abps_pcg64_fill": ("void", (
        ("uint64_t*", "out"), ("int64_t", "n"), ("uint64_t", "state_hi"), ("uint64_t", "state_lo"),
        ("uint64_t", "inc_hi"), ("uint64_t", "inc_lo"))),
    "abps_kernels_version": ("int32_t", ()),
}

_CTYPES = {"int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32, "uint64_t": ctypes.c_uint64,
           "float": ctypes.c_float}


def _ctype(c_type: str):
    """ctypes type of one C type of :data:`SIGNATURES` (every pointer is passed as an address)."""
    if c_type.endswith("*"):
        return ctypes.c_void_p
    if c_type == "void":
        return None
    return _CTYPES[c_type]


def header() -> str:
    """The C header ``abps_kernels.h`` declaring every function of :data:`SIGNATURES`."""
    lines = ["// Generated from federation/engine/kernels.py SIGNATURES; do not edit.", "#pragma once",
             "#include <cstdint>", 'extern "C" {']
    for name, (ret, params) in SIGNATURES.items():
        args = ", ".join(f"{t} {n}" for t, n in params) or "void"
        lines.append(f"{ret} {name}({args});")
    lines.append("}")
    return "\n".join(lines) + "\n"


def march() -> str:
    """The ``-march`` target of the build, ``$ABPS_KERNELS_MARCH`` (default ``native``).

    ``native`` tunes for this CPU (the build is keyed on its model and flags); a named level such
    as ``x86-64-v3`` (AVX2 + FMA), ``x86-64-v2`` or ``x86-64`` gives one library that runs on every
    CPU of that level, e.g. for a Ray cluster with mixed nodes sharing one cache.

    Raises:
        ValueError: a value with characters a compiler flag cannot hold.
    """
    m = os.environ.get("ABPS_KERNELS_MARCH", "native").strip() or "native"
    if not all(ch.isalnum() or ch in "-_." for ch in m):
        raise ValueError(f"ABPS_KERNELS_MARCH={m!r}: expected a -march value such as native or x86-64-v3")
    return m


def flags() -> list[str]:
    """Compiler flags of the build. ``-ffp-contract=off`` keeps every product and sum a separately
    rounded float op (no fused multiply-add), so the element-wise values equal PyTorch's eager ones."""
    return ["-O3", f"-march={march()}", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared", "-std=c++17"]


_LIB: ctypes.CDLL | None = None
_BUILT: dict[str, str] = {}   # compiler and flags of the loaded library (build_info)
_TRIED = False
_ERROR: str | None = None
_LOCK = threading.Lock()  # one build / load per process, also when the dropout helper thread asks first


def mode() -> str:
    """The ``ABPS_KERNELS`` selection: ``auto`` (default), ``cpp`` or ``torch``.

    Raises:
        ValueError: any other value (names the variable and the allowed values).
    """
    m = os.environ.get("ABPS_KERNELS", "auto").strip().lower() or "auto"
    if m not in ("auto", "cpp", "torch"):
        raise ValueError(f"ABPS_KERNELS={m!r}: expected auto, cpp or torch")
    return m


def cache_dir() -> Path:
    """Where built kernels are kept: ``$ABPS_KERNELS_CACHE``, else the project's user cache
    (:func:`etl.io.user_cache_dir`: ``$ABPS_CACHE_DIR/kernels``, ``$XDG_CACHE_HOME/abps/kernels``
    or ``~/.cache/abps/kernels``)."""
    env = os.environ.get("ABPS_KERNELS_CACHE")
    return Path(env) if env else user_cache_dir("kernels")


def _compiler() -> str | None:
    """``$CXX`` when set (and only it), else the first of g++, c++, clang++ on the PATH."""
    env = os.environ.get("CXX", "").strip()
    names = (env,) if env else ("g++", "c++", "clang++")
    for name in names:
        if shutil.which(name):
            return name
    return None


def build(force: bool = False) -> Path:
    """Compile the kernels into the cache (once; an existing build is reused) and return the
    shared library's path.

    The library is written to a temporary name and renamed, so concurrent processes (pytest-xdist
    workers, sweep workers) never load a half-written file.

    Raises:
        RuntimeError: no C++ compiler, or the compiler failed (its last output lines quoted).
    """
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"C++ compiler {cxx!r} does not run: {e}") from e
    try:
        source = SOURCE_PATH.read_text()
    except OSError as e:
        raise RuntimeError(f"engine kernel source {SOURCE_PATH} is unreadable: {e.strerror}") from e
    hdr, fl = header(), flags()
    cpu = provenance.cpu_id() if march() == "native" else ""   # a named -march level runs on any CPU of that level
    key = hashlib.sha256("\0".join([source, hdr, " ".join(fl), version, platform.machine(), cpu])
                         .encode()).hexdigest()[:16]
    out_dir = cache_dir() / key
    lib = out_dir / "libabps_kernels.so"
    _BUILT.update(compiler=(version.splitlines() or [cxx])[0].strip(), flags=" ".join(fl))
    if lib.exists() and not force:
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / "abps_kernels.cpp"
    for path, text in ((out_dir / "abps_kernels.h", hdr), (src, source)):
        fd, tmp = tempfile.mkstemp(suffix=path.suffix, dir=out_dir)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    fd, tmp_lib = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        proc = subprocess.run([cxx, *fl, f"-I{out_dir}", str(src), "-o", tmp_lib], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            raise RuntimeError(f"{cxx} failed to build the engine kernels (exit {proc.returncode}): {tail}")
        os.replace(tmp_lib, lib)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{cxx} did not finish building the engine kernels in {e.timeout} s") from e
    finally:
        if os.path.exists(tmp_lib):
            os.unlink(tmp_lib)
    return lib


def _load(path: Path) -> ctypes.CDLL:
    """Load the library and set every function's ctypes signature from :data:`SIGNATURES`.

    Raises:
        OSError: the library does not load, lacks a function, or reports another version.
    """
    lib = ctypes.CDLL(str(path))
    for name, (ret, params) in SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as e:
            raise OSError(f"{path}: no function {name}") from e
        fn.argtypes = [_ctype(t) for t, _ in params]
        fn.restype = _ctype(ret)
    got = lib.abps_kernels_version()
    if got != VERSION:
        raise OSError(f"{path}: kernels version {got}, expected {VERSION}")
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None when the eager path is to be used (``ABPS_KERNELS=torch``,
    or ``auto`` and the build / load failed: warned once per process).

    Raises:
        RuntimeError: ``ABPS_KERNELS=cpp`` and the kernels cannot be built or loaded.
    """
    global _LIB, _TRIED, _ERROR
    m = mode()
    if m == "torch":
        return None
    if not _TRIED:
        with _LOCK:
            if not _TRIED:
                try:
                    _LIB = _load(build())
                except (RuntimeError, OSError) as e:
                    _ERROR = str(e)
                    if m == "auto":
                        warnings.warn(f"engine kernels unavailable, using the PyTorch path: {e}", RuntimeWarning,
                                      stacklevel=2)
                _TRIED = True
    if _LIB is None and m == "cpp":
        raise RuntimeError(f"ABPS_KERNELS=cpp but the engine kernels are unavailable: {_ERROR}")
    return _LIB


def _require() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise RuntimeError("the engine kernels are not in use (ABPS_KERNELS=torch or the build failed)")
    return lib


def reset() -> None:
    """Forget the loaded kernels and any build failure, so the next :func:`library` call
    selects (and builds) again; for tests and for a changed ``ABPS_KERNELS`` / ``CXX``."""
    global _LIB, _TRIED, _ERROR
    with _LOCK:
        _LIB, _TRIED, _ERROR = None, False, None
        _BUILT.clear()


def available() -> bool:
    """True when the fused kernels will be used (see :func:`library`)."""
    return library() is not None


def step_name() -> str:
    """``"fused"`` when the C++ kernels are loaded in this process, else ``"eager"``: recorded on
    every run (tag ``abps.engine_step``) because the two paths sum in a different order, so their
    parameters agree within float rounding, not bit for bit. Methods with an extra local loss
    (FedProx, FedDyn, MOON) and non-float32 parameters take the eager / autograd step either way."""
    return "fused" if library() is not None else "eager"


def build_info() -> dict[str, str]:
    """What computes this process's engine steps, for run tags: the machine
    (:func:`federation.core.provenance.machine_info`), ``engine_step`` (``fused`` / ``eager``) and, for
    the fused step, ``kernel_compiler`` and ``kernel_flags`` of the build. Runs that differ here
    agree within float rounding, not bit for bit."""
    info = {**provenance.machine_info(), "engine_step": step_name()}
    if info["engine_step"] == "fused":
        info.update(kernel_compiler=_BUILT.get("compiler", "?"), kernel_flags=_BUILT.get("flags", "?"))
    return info


def _f32(name: str, t: torch.Tensor) -> None:
    if t.dtype != torch.float32 or not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous float32 tensor, got {t.dtype} strides {t.stride()}")


def bias_relu_drop_(z: torch.Tensor, b: torch.Tensor, bits: torch.Tensor | None = None, col: int = 0,
                    thr: int = 0, out_w: torch.Tensor | None = None,
                    out_b: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """In place ``z <- relu(z + b[:, None, :]) * keep`` for one hidden layer, and optionally the
    output layer's logits from the new ``z`` in the same pass.

    Args:
        z: ``[c, w, h]`` float32 pre-activation (contiguous; overwritten).
        b: ``[c, h]`` bias (contiguous).
        bits: ``[c, w, U]`` int16 dropout draws (:meth:`RandomStreams.dropout_bits`; any
            strides with a unit stride of 1), of which units ``col .. col + h - 1`` belong to
            this layer; None = no dropout.
        thr: a unit is kept when its draw is ``>= thr`` (``k - 32768`` for drop count ``k``).
        out_w, out_b: ``[c, h]`` / ``[c]`` output weights and bias: also return
            ``logits [c, w] = z_new @ out_w + out_b`` (16 partial sums per row, then in order).
    Returns:
        ``(z, logits or None)``.
    Raises:
        ValueError: wrong dtype, layout or shapes.
    """
    lib = _require()
    _f32("z", z)
    _f32("b", b)
    c, w, h = z.shape
    if b.shape != (c, h):
        raise ValueError(f"b: expected shape {(c, h)}, got {tuple(b.shape)}")
    if bits is None:
        ptr, cs, rs = None, 0, 0
    else:
        if bits.dtype != torch.int16 or bits.stride(2) != 1 or bits.shape[:2] != (c, w) or bits.shape[2] < col + h:
            raise ValueError(f"bits: expected int16 [{c}, {w}, >= {col + h}] with unit stride 1, "
                             f"got {bits.dtype} {tuple(bits.shape)} strides {bits.stride()}")
        ptr, cs, rs = bits.data_ptr() + col * bits.element_size(), bits.stride(0), bits.stride(1)
    logits = None
    if out_w is not None and out_b is not None:
        _f32("out_w", out_w)
        _f32("out_b", out_b)
        if out_w.shape != (c, h) or out_b.numel() != c:
            raise ValueError(f"out_w / out_b: expected {(c, h)} / {c} values, got {tuple(out_w.shape)} / "
                             f"{out_b.numel()}")
        logits = torch.empty(c, w, dtype=z.dtype)
    lib.abps_bias_relu_drop(z.data_ptr(), b.data_ptr(), ptr, c, w, h, cs, rs, int(thr),
                            None if logits is None else logits.data_ptr(),
                            None if logits is None else out_w.data_ptr(),  # type: ignore[union-attr]
                            None if logits is None else out_b.data_ptr(),  # type: ignore[union-attr]
                            torch.get_num_threads())
    return z, logits


def outer_relu_grad(dl: torch.Tensor, v: torch.Tensor, h: torch.Tensor, s: float,
                    out_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradient at the last hidden layer's pre-activation and its bias gradient (and optionally
    the output layer's weight gradient) in one pass over ``h``.

    Args:
        dl: ``[c, w]`` loss gradient per logit; v: ``[c, H]`` output weights (times the dropout
            scale, as the caller folds it); h: ``[c, w, H]`` stored activation (ReLU and dropout
            applied: a unit passes gradient iff ``h > 0``); s: divisor of the bias gradient and
            multiplier of the output weight gradient.
        out_grad: also return ``s * sum_w(h * dl[..., None])`` ``[c, H]``.
    Returns:
        ``(q [c, w, H], sum_w(q) / s [c, H], output weight gradient or None)`` with
        ``q = dl[..., None] * v[:, None, :]`` where ``h > 0``, else 0.
    """
    lib = _require()
    for name, t in (("dl", dl), ("v", v), ("h", h)):
        _f32(name, t)
    c, w, hh = h.shape
    if dl.shape != (c, w) or v.shape != (c, hh):
        raise ValueError(f"dl / v: expected {(c, w)} / {(c, hh)}, got {tuple(dl.shape)} / {tuple(v.shape)}")
    q = torch.empty_like(h)
    gb = torch.empty(c, hh, dtype=h.dtype)
    gw = torch.empty(c, hh, dtype=h.dtype) if out_grad else None
    lib.abps_outer_relu_grad(q.data_ptr(), gb.data_ptr(), dl.data_ptr(), v.data_ptr(), h.data_ptr(), c, w, hh,
                             float(s), None if gw is None else gw.data_ptr(), torch.get_num_threads())
    return q, gb, gw


def relu_grad_(g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """In place ``g <- g`` where ``h > 0`` else 0 (``threshold_backward(g, h, 0)``); returns the
    bias gradient ``sum_w(g)`` ``[c, H]``. ``g``, ``h``: ``[c, w, H]`` contiguous float32."""
    lib = _require()
    _f32("g", g)
    _f32("h", h)
    if g.shape != h.shape:
        raise ValueError(f"g / h: shapes differ, {tuple(g.shape)} / {tuple(h.shape)}")
    c, w, hh = h.shape
    gb = torch.empty(c, hh, dtype=h.dtype)
    lib.abps_relu_grad(g.data_ptr(), gb.data_ptr(), h.data_ptr(), c, w, hh, torch.get_num_threads())
    return gb


def pcg64_words(state: int, inc: int, n: int) -> np.ndarray:
    """``n`` uint64 outputs of NumPy's ``PCG64`` from its 128-bit ``state`` and ``inc`` (as in
    ``PCG64.state["state"]``): the values ``random_raw(n)`` returns, about 4x faster.

    Raises:
        RuntimeError: the kernels are not in use.
    """
    lib = _require()
    out = np.empty(n, dtype=np.uint64)
    m = (1 << 64) - 1
    lib.abps_pcg64_fill(out.ctypes.data, n, (state >> 64) & m, state & m, (inc >> 64) & m, inc & m)
    return out

"""Where a result was computed: the CPU, the SIMD level PyTorch dispatches to, library versions.

Float results of the same seed agree bit for bit only on the same machine, thread count and code
path; across CPU kinds (another SIMD width sums in another order) they agree within float rounding.
Every MLflow run carries these facts as tags (:data:`federation.run.tracking.PLATFORM_TAG_PREFIX`), so a report can say when the
runs it compares came from different machines (docs/reproducibility.md).
"""

from __future__ import annotations

import functools
import platform
from importlib import metadata
from pathlib import Path

import torch

#: libraries whose versions shape the numbers (one ``versions`` entry)
LIBRARIES = ("torch", "numpy", "scikit-learn", "polars", "duckdb", "mlflow")


@functools.lru_cache(maxsize=1)
def cpu_id() -> str:
    """The CPU's ``model name`` and ``flags`` lines of ``/proc/cpuinfo`` (else
    :func:`platform.processor`): code built with ``-march=native`` must not run on another CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))][:2]
        return "\n".join(lines)
    except OSError:
        return platform.processor()


def cpu_model() -> str:
    """The CPU's model name, e.g. ``AMD EPYC``; the processor or machine name where unknown."""
    for line in cpu_id().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


def machine_info() -> dict[str, str]:
    """``cpu`` (model), ``cpu_capability`` (PyTorch's SIMD dispatch level: ``AVX512``, ``AVX2``,
    ``DEFAULT`` ...; ``ATEN_CPU_CAPABILITY`` can lower it), ``machine`` (``x86_64`` ...),
    ``threads`` (torch intra-op threads) and ``versions`` (``torch=2.13.0 numpy=...``)."""
    return {"cpu": cpu_model(), "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
            "machine": platform.machine(), "threads": str(torch.get_num_threads()),
            "versions": " ".join(f"{n}={_version(n)}" for n in LIBRARIES)}

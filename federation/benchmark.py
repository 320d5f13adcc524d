"""The benchmarks a config file runs when its top level says ``benchmark: sage | vv`` (``abps train
--config``): the SAGE image benchmark and the gossip benchmark."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from etl.errors import InputError
from federation.gossip.runner import cli_run as _vv_run
from federation.images.run import cli_run as _sage_run

__all__ = ["Benchmark", "BENCHMARKS", "get_benchmark"]


@dataclass
class Benchmark:
    """One benchmark: ``run(config, rounds, seeds, output, tracking_uri, experiment)`` and the config
    key that sets its torch thread count."""

    run: Callable[..., Any]
    threads_key: str


BENCHMARKS: dict[str, Benchmark] = {"sage": Benchmark(_sage_run, "num_threads"), "vv": Benchmark(_vv_run, "threads")}


def get_benchmark(name: str, source: Any) -> Benchmark:
    """The benchmark called ``name`` (case-insensitive).

    Raises:
        InputError: unknown name (the message names ``source``, the config file, and the known names).
    """
    key = str(name).lower()
    if key not in BENCHMARKS:
        raise InputError(f"{source}: benchmark must be one of {', '.join(BENCHMARKS)}, got {key!r}")
    return BENCHMARKS[key]

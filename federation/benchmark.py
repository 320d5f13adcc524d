"""The benchmarks a config file runs when its top level says ``benchmark: sage | vv`` (``abps train
--config``): the SAGE image benchmark and the gossip benchmark."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from etl.errors import InputError
from federation.gossip.runner import cli_run as _vv_run
from federation.gossip.runner import expand_runs as _vv_check
from federation.images.run import cli_run as _sage_run
from federation.methods.selectors import parse_config as _sage_check

__all__ = ["Benchmark", "BENCHMARKS", "get_benchmark"]


@dataclass
class Benchmark:
    """One benchmark: ``run(config, rounds, seeds, output, tracking_uri, experiment, resume=False,
    progress=False)`` (``resume``: go on from the round checkpoint beside ``output``; ``progress``:
    draw a progress bar), the config key that sets its torch thread count, and
    ``check(config, rounds, seeds)``, which validates the config as ``run`` will (InputError naming
    the option) before anything runs."""

    run: Callable[..., Any]
    threads_key: str
    check: Callable[[dict, int | None, list[int] | None], Any]


BENCHMARKS: dict[str, Benchmark] = {
    "sage": Benchmark(_sage_run, "num_threads", lambda cfg, rounds, seeds: _sage_check(cfg, rounds, seeds)),
    "vv": Benchmark(_vv_run, "threads", lambda cfg, rounds, seeds: _vv_check(cfg, rounds)),
}


def get_benchmark(name: str, source: Any) -> Benchmark:
    """The benchmark called ``name`` (case-insensitive).

    Raises:
        InputError: unknown name (the message names ``source``, the config file, and the known names).
    """
    key = str(name).lower()
    if key not in BENCHMARKS:
        raise InputError(f"{source}: benchmark must be one of {', '.join(BENCHMARKS)}, got {key!r}")
    return BENCHMARKS[key]

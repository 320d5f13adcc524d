"""Run every ``benchmarks/bench_*.py`` module's ``main()`` in name order (``make bench``).

``python -m benchmarks.run [NAME ...] [-- ARG ...]`` runs only the modules whose name contains one
of the given substrings (``flower``, ``engine``, ``abps``, ``etl``, ``scale``, ``table1``, ``sage``,
``sage_kernels``, ``gossip``, ``int8``, ``compile``, ``platforms``); arguments after ``--`` go to each selected benchmark's own option parser (e.g.
``python -m benchmarks.run engine -- --centers 20 --rounds 2`` for a reduced run), without them every
benchmark runs its full default workload.
Each benchmark prints its figures with their targets and the ratios measured in the same run
(implementations interleaved), and writes its own files under ``bench_out/`` or a JSON document.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path


def discover() -> list[str]:
    """Module names ``benchmarks.bench_*`` found next to this file, sorted."""
    here = Path(__file__).resolve().parent
    return [f"benchmarks.{p.stem}" for p in sorted(here.glob("bench_*.py"))]


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks; returns the number that raised."""
    args = list(sys.argv[1:] if argv is None else argv)
    wanted, extra = (args[: args.index("--")], args[args.index("--") + 1 :]) if "--" in args else (args, [])
    failures = 0
    for name in discover():
        if wanted and not any(w in name for w in wanted):
            continue
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        argv_saved = sys.argv
        sys.argv = [name]  # each benchmark parses its own defaults, not the runner's arguments
        try:
            main_fn = importlib.import_module(name).main
            if extra:  # a reduced run: the benchmark parses these itself
                main_fn(extra)
            else:
                main_fn()
        except Exception as exc:  # keep going: one broken benchmark must not hide the others
            failures += 1
            print(f"!! {name} failed: {exc.__class__.__name__}: {exc}", flush=True)
        finally:
            sys.argv = argv_saved
        print(f"== {name} done in {time.perf_counter() - t0:.1f} s", flush=True)
    return failures


if __name__ == "__main__":
    sys.exit(1 if main() else 0)

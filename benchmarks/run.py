"""Run every ``benchmarks/bench_*.py`` module's ``main()`` in name order (``make bench``).

``python -m benchmarks.run [NAME ...] [-- ARG ...]`` runs only the selected modules: a NAME that
is a benchmark's own (``flower``, ``engine``, ``abps``, ``etl``, ``scale``, ``table1``, ``sage``,
``sage_kernels``, ``gossip``, ``int8``, ``compile``, ``platforms``, ``device``) selects that one (``sage`` is not
also ``sage_kernels``), any other NAME every module whose name contains it; arguments after ``--`` go to each selected benchmark's own option parser (e.g.
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


def select(names: list[str], wanted: list[str]) -> list[str]:
    """The modules of ``names`` that ``wanted`` selects (module doc), in ``names`` order; all of
    them when ``wanted`` is empty."""
    if not wanted:
        return list(names)
    chosen: set[str] = set()
    for w in wanted:
        exact = [n for n in names if n.rsplit(".", 1)[-1] == f"bench_{w}"]
        chosen.update(exact or [n for n in names if w in n])
    return [n for n in names if n in chosen]


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks; returns the number that raised."""
    args = list(sys.argv[1:] if argv is None else argv)
    wanted, extra = (args[: args.index("--")], args[args.index("--") + 1 :]) if "--" in args else (args, [])
    failures = 0
    for name in select(discover(), wanted):
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

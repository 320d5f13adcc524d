"""The paper-size SAGE grids beside the paper's Table I, run one selector at a time so that the
finished selectors are kept in the repository while the rest is still to run.

    python -m benchmarks.sage_grid run [--graphs er,ba] [--selectors LOCAL,RG,...] [--work DIR]
    python -m benchmarks.sage_grid table

``run`` takes the presets ``configs/sage-fmnist-{er,ba}-0.1.yaml`` (50 clients, full Fashion-MNIST,
250 rounds, seed 0) and runs each selector whose result is not yet in ``docs/results/sage-grid/``
with ``abps train``'s machinery (:func:`federation.images.run.cli_run`): round checkpoints under
``--work`` (default ``bench_out/sage-grid``), so a stopped run goes on with the same command, and
the finished ``results.json`` copied to ``docs/results/sage-grid/fmnist-<graph>-0.1/<selector>.json``.
A selector run alone gives the figures it gives inside the full preset: the partition, graph,
initialisation, batch orders and anchor draws depend on the seed only, a selector's own random
draws on (seed, selector) (``tests/test_sage_engine.py::test_a_selector_alone_equals_it_in_the_preset``).

``table`` prints the Markdown tables of docs/sage.md, "Paper-size grids", from the files there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results" / "sage-grid"
SELECTORS = ("LOCAL", "RG", "PENS", "PFedDST", "AQ-128", "SAGE-NF", "Vanilla SAGE", "SAGE-OS")
GRAPHS = ("er", "ba")

#: SAGE paper Table I (FMNIST, alpha 0.1, 50 clients, 250 rounds): global accuracy per selector,
#: and Table III's evidence figures where it gives them (budget consumed, Stop@32, Stop@128, RG fallback).
PAPER_ACC = {
    "er": {"LOCAL": 0.3642, "RG": 0.4104, "PENS": 0.4024, "PFedDST": 0.4119, "AQ-128": 0.3826,
           "SAGE-NF": 0.3869, "Vanilla SAGE": 0.4077, "SAGE-OS": 0.4121},
    "ba": {"LOCAL": 0.3641, "RG": 0.4075, "PENS": 0.4031, "PFedDST": 0.4102, "AQ-128": 0.3864,
           "SAGE-NF": 0.3867, "Vanilla SAGE": 0.4075, "SAGE-OS": 0.4079},
}
PAPER_EVIDENCE = {
    "er": {"AQ-128": "57.84 %", "Vanilla SAGE": "54.63 % (Stop@128 32.4 %, RG fb 89.3 %)",
           "SAGE-OS": "26.14 % (Stop@32 56.6 %, Stop@128 2.0 %, Cost-RG 38.8 %)"},
    "ba": {"AQ-128": "53.77 %", "Vanilla SAGE": "49.12 % (Stop@128 30.9 %, RG fb 78.4 %)",
           "SAGE-OS": "27.71 % (Stop@32 39.6 %, Stop@128 2.0 %, Cost-RG 30.5 %)"},
}


def slug(selector: str) -> str:
    """File name stem of a selector: ``Vanilla SAGE`` -> ``vanilla-sage``."""
    return selector.lower().replace(" ", "-")


def result_path(graph: str, selector: str, root: Path = RESULTS) -> Path:
    return root / f"fmnist-{graph}-0.1" / f"{slug(selector)}.json"


def preset(graph: str, selector: str) -> dict:
    """The repository's preset for ``graph`` with ``selectors: [selector]``."""
    cfg = yaml.safe_load((REPO / "configs" / f"sage-fmnist-{graph}-0.1.yaml").read_text())
    cfg["selectors"] = [selector]
    return cfg


def run(graphs: list[str], selectors: list[str], work: Path, tracking_uri: str | None) -> None:
    """Run every (graph, selector) without a result file, in order; each one resumes from its
    checkpoint under ``work`` when one is there."""
    from etl.io import atomic_write_text
    from federation.images.run import cli_run

    for graph in graphs:
        for selector in selectors:
            dst = result_path(graph, selector)
            if dst.exists():
                continue
            out = work / f"fmnist-{graph}-0.1" / slug(selector) / "results.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            resume = Path(f"{out}.ckpt").exists()
            print(f"sage grid: {graph} {selector}{' (resumed)' if resume else ''} -> {dst}", flush=True)
            cli_run(preset(graph, selector), output=out, tracking_uri=tracking_uri,
                    experiment=f"sage-grid-fmnist-{graph}-0.1", resume=resume, progress=sys.stderr.isatty())
            dst.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(dst, out.read_text())


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def table(graph: str, root: Path = RESULTS) -> str:
    """Markdown table of the finished selectors of ``graph`` beside Table I (empty string if none)."""
    head = ("| selector | global acc | macro-F1 | client acc | worst client | CommOH | budget consumed | Stop@32 "
            "| Stop@128 | RG fallback | Cost-RG | s/round | paper acc (Table I) | paper budget (Table III) |")
    rows = []
    for selector in SELECTORS:
        path = result_path(graph, selector, root)
        if not path.exists():
            continue
        try:
            res = json.loads(path.read_text())
            run_ = next(iter(res["runs"].values()))
            s = next(iter(run_.values()))["summary"]
            rounds = res["config"]["rounds"]
            secs = (s["seconds_train"] + s["seconds_probe_mix"] + s["seconds_eval"]) / rounds
        except (OSError, ValueError, TypeError, KeyError, AttributeError, StopIteration) as exc:
            raise ValueError(f"{path}: not the results.json of a finished selector ({exc.__class__.__name__}); "
                             "remove it and run the selector again") from None
        stops = s.get("stop_distribution") or {}
        anchor = bool(stops)
        rows.append(
            f"| {selector} | {s['global_acc']:.4f} | {s['macro_f1']:.4f} | {s['client_acc']:.4f} | "
            f"{s['worst_client_acc']:.4f} | {s['comm_oh']:.3f} | "
            f"{_pct(s.get('budget_consumed')) if s.get('budget_consumed') else '-'} | "
            f"{_pct(stops.get('stop_at_32')) if anchor else '-'} | {_pct(stops.get('stop_at_128')) if anchor else '-'} | "
            f"{_pct(s.get('rg_fallback_rate')) if anchor else '-'} | {_pct(s.get('cost_rg_rate')) if anchor else '-'} | "
            f"{secs:.1f} | {PAPER_ACC[graph][selector]:.4f} | {PAPER_EVIDENCE[graph].get(selector, '-')} |")
    if not rows:
        return ""
    return "\n".join([head, "|" + " --- |" * 14, *rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("run", "table"))
    ap.add_argument("--graphs", default=",".join(GRAPHS), help="comma-separated subset of er,ba")
    ap.add_argument("--selectors", default=",".join(SELECTORS), help="comma-separated subset, in the paper's names")
    ap.add_argument("--work", type=Path, default=REPO / "bench_out" / "sage-grid",
                    help="checkpoints and the runs' own results.json (default bench_out/sage-grid)")
    ap.add_argument("--tracking-uri", default=None, help="MLflow store (default the project's; 'none': off)")
    args = ap.parse_args(argv)
    graphs = [g for g in args.graphs.split(",") if g]
    selectors = [s for s in args.selectors.split(",") if s]
    if not graphs:
        ap.error(f"--graphs: at least one of {', '.join(GRAPHS)}")
    if not selectors:
        ap.error(f"--selectors: at least one of {', '.join(SELECTORS)}")
    for g in graphs:
        if g not in GRAPHS:
            ap.error(f"--graphs: {g!r} is not one of {', '.join(GRAPHS)}")
    for s in selectors:
        if s not in SELECTORS:
            ap.error(f"--selectors: {s!r} is not one of {', '.join(SELECTORS)}")
    if args.what == "run":
        run(graphs, selectors, args.work, args.tracking_uri)
    for g in graphs:
        try:
            text = table(g)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"FMNIST {g.upper()} alpha 0.1:\n{text or '(no selector finished)'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

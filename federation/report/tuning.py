"""Hyperparameter tuning report: mean validation AUROC per grid point of ``configs/tuning.yaml`` and
the choice on validation (never test). Details: docs/baselines.md, "Module notes".
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etl.errors import InputError
from etl.io import atomic_write_text
from federation.run.tracking import LABEL_TAG, METHOD_TAG, seed_of


@dataclass(frozen=True)
class TuningRecord:
    """One finished run of a grid point: label, method, seed, final val / test AUROC (mean over
    centers; NaN when undefined)."""

    label: str
    method: str
    seed: int
    val_auroc: float
    test_auroc: float


@dataclass(frozen=True)
class TuningRow:
    """One grid point: mean / std of the val AUROC across seeds (std 0 for one seed), mean test
    AUROC (for the record), seeds used, and whether it is its method's choice."""

    method: str
    label: str
    n_seeds: int
    val_mean: float
    val_std: float
    test_mean: float
    chosen: bool


def tuning_rows(records: Iterable[TuningRecord], choose_on: str = "val") -> list[TuningRow]:
    """Group runs by grid point and pick, per method, the point of highest mean val AUROC
    (``choose_on="test"``: highest mean test AUROC, only for a tuning cohort of
    :mod:`federation.data.holdout`, whose test split is held-out train rows).

    Points are kept in first-seen order; ties go to the first. Runs whose val AUROC is NaN are
    left out of the mean (a point without any finite value has mean NaN and is never chosen).
    A label seen with two methods raises ValueError (labels name grid points).
    """
    groups: dict[str, list[TuningRecord]] = {}
    for r in records:
        groups.setdefault(r.label, []).append(r)
    rows: list[TuningRow] = []
    for label, rs in groups.items():
        methods = {r.method for r in rs}
        if len(methods) > 1:
            raise ValueError(f"grid point {label!r} holds runs of several methods: {sorted(methods)}")
        vals = [r.val_auroc for r in rs if math.isfinite(r.val_auroc)]
        tests = [r.test_auroc for r in rs if math.isfinite(r.test_auroc)]
        rows.append(TuningRow(
            method=rs[0].method, label=label, n_seeds=len({r.seed for r in rs}),
            val_mean=statistics.fmean(vals) if vals else math.nan,
            val_std=statistics.pstdev(vals) if len(vals) > 1 else 0.0,
            test_mean=statistics.fmean(tests) if tests else math.nan, chosen=False))
    if choose_on not in ("val", "test"):
        raise ValueError(f"choose_on {choose_on!r}: must be 'val' or 'test'")
    key = (lambda r: r.val_mean) if choose_on == "val" else (lambda r: r.test_mean)
    best: dict[str, int] = {}
    for i, row in enumerate(rows):
        if not math.isfinite(key(row)):
            continue
        j = best.get(row.method)
        if j is None or key(row) > key(rows[j]):
            best[row.method] = i
    return [TuningRow(**{**r.__dict__, "chosen": i in best.values()}) for i, r in enumerate(rows)]


def _fmt(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.3f}"


def tuning_markdown(rows: Sequence[TuningRow], blind: bool = False) -> str:
    """Markdown table: method, grid point, seeds, val AUROC mean ± std, test AUROC, chosen.
    ``blind`` leaves the test column out (a protocol that must not read test, docs/eicu.md)."""
    test_h, test_s = ("", "") if blind else (" test AUROC (record only) |", "---|")
    lines = [f"| method | grid point | seeds | val AUROC (choice) |{test_h} chosen |",
             f"|---|---|---|---|{test_s}---|"]
    for r in rows:
        test = "" if blind else f" {_fmt(r.test_mean)} |"
        lines.append(f"| {r.method} | {r.label} | {r.n_seeds} | {_fmt(r.val_mean)} ± {_fmt(r.val_std)} |"
                     f"{test} {'**yes**' if r.chosen else ''} |")
    return "\n".join(lines) + "\n"


def tuning_csv(rows: Sequence[TuningRow], blind: bool = False) -> str:
    """CSV text of the same table (``blind``: no test column)."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["method", "label", "n_seeds", "val_auroc_mean", "val_auroc_std",
                *([] if blind else ["test_auroc_mean"]), "chosen"])
    for r in rows:
        w.writerow([r.method, r.label, r.n_seeds, r.val_mean, r.val_std, *([] if blind else [r.test_mean]),
                    int(r.chosen)])
    return buf.getvalue()


def collect_records(client: Any, exp_id: str) -> list[TuningRecord]:
    """FINISHED runs of an MLflow experiment that carry ``method``, ``seed`` and a final val
    AUROC, labelled by their ``abps.label`` tag (sweep cells) or method name. Aggregates only."""
    out: list[TuningRecord] = []
    token = None
    while True:
        page = client.search_runs([exp_id], filter_string="attributes.status = 'FINISHED'", max_results=1000,
                                  page_token=token)
        for r in page:
            m, t = r.data.metrics, r.data.tags
            seed = seed_of(t)
            if METHOD_TAG not in t or seed is None or "final_val_auroc_mean" not in m:
                continue
            out.append(TuningRecord(label=t.get(LABEL_TAG) or t[METHOD_TAG], method=t[METHOD_TAG], seed=seed,
                                    val_auroc=float(m["final_val_auroc_mean"]),
                                    test_auroc=float(m.get("final_auroc_mean", math.nan))))
        token = page.token
        if not token:
            out.reverse()  # MLflow lists newest first: back to the order the sweep ran the points
            return out


def tuning_section(client: Any, exp_id: str, blind: bool = False,
                   choose_on: str = "val") -> tuple[str, str, list[TuningRow]]:
    """(markdown, csv, rows) of the tuning table of an experiment (for ``abps report``)."""
    rows = tuning_rows(collect_records(client, exp_id), choose_on)
    return tuning_markdown(rows, blind), tuning_csv(rows, blind), rows


def write_tuning_report(experiment: str, out_dir: str | Path, tracking_uri: str | None = None,
                        blind: bool = False, choose_on: str = "val") -> list[TuningRow]:
    """Write ``tuning.md`` and ``tuning.csv`` for an experiment into ``out_dir`` (``blind``: without
    the test column).

    Raises:
        etl.errors.InputError: the experiment does not exist or holds no tuning run.
    """
    from mlflow.tracking import MlflowClient


    client = MlflowClient(tracking_uri or "sqlite:///mlflow/mlflow.db")
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise InputError(f"experiment {experiment!r} not found in the tracking store")
    if blind and choose_on == "test":
        raise InputError("--blind with --choose-on test: the choice would read the column the report hides")
    md, csv_text, rows = tuning_section(client, exp.experiment_id, blind, choose_on)
    if not rows:
        raise InputError(f"experiment {experiment!r}: no finished run with a validation AUROC")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "tuning.md", "# Tuning: mean validation AUROC per grid point\n\n" + md)
    atomic_write_text(out / "tuning.csv", csv_text)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m federation.report.tuning --experiment tuning --out report/ [--tracking-uri URI] [--blind]
    [--choose-on val|test]``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="tuning")
    ap.add_argument("--out", default="report")
    ap.add_argument("--tracking-uri", default=None)
    ap.add_argument("--blind", action="store_true", help="leave the test column out (choose without reading test)")
    ap.add_argument("--choose-on", choices=("val", "test"), default="val",
                    help="split the choice reads; test only on a tuning cohort (federation.data.holdout) whose "
                         "test split is held-out train rows")
    a = ap.parse_args(argv)
    rows = write_tuning_report(a.experiment, a.out, a.tracking_uri, a.blind, a.choose_on)
    print(tuning_markdown(rows, a.blind), end="")


if __name__ == "__main__":
    main()

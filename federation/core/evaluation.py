"""Clinical evaluation of a finished run on the test split, every center included: per-center
calibration and ranking figures, their spread across centers, a bootstrap interval and subgroup
gaps (aggregates only). Outputs: docs/runtime.md, "Module notes"; definitions: docs/metrics.md.
"""

from __future__ import annotations

import csv
import io
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import polars as pl
import torch

from federation.core.clinical import (
    MIN_CELL_EVENTS,
    MIN_CELL_ROWS,
    batched_auprc,
    batched_brier,
    batched_calibration,
    batched_ece,
    bootstrap_mean_auroc,
    distribution,
    is_small_cell,
    subgroup_gaps,
)
from federation.core.metrics import batched_auroc

#: Subgroup axes and their groups, in code order (cohort columns gender, age, race; docs/metrics.md).
SUBGROUP_AXES: dict[str, tuple[str, ...]] = {
    "sex": ("F", "M"),
    "age": ("18-44", "45-64", "65-79", "80+"),
    "race": ("WHITE", "BLACK", "HISPANIC", "ASIAN", "OTHER"),
}
#: Lower edges (years) of the age bands after the first; ages below 18 get no band.
AGE_EDGES = (45.0, 65.0, 80.0)

#: Per-center metrics, and whether a higher value is better (the worst-10 % side).
METRICS: dict[str, bool] = {"auroc": True, "auprc": True, "brier": False, "ece": False,
                            "cal_intercept": True, "cal_slope": True}
STATS = ("mean", "median", "worst10", "std", "gini")
ECE_BINS = 10
N_BOOT = 200
_EPS = 1e-7


def group_codes(frame: pl.DataFrame) -> np.ndarray:
    """``[rows, 3]`` int64 subgroup codes (sex, age band, race group) of cohort rows.

    Args:
        frame: rows with the cohort columns ``gender`` ('F' / 'M'), ``age`` (years) and ``race``
            (etl/sql/*/stays.sql groups).

    Returns:
        Codes indexing :data:`SUBGROUP_AXES` per axis; -1 where the value is unknown (UNKNOWN
        race, missing gender or age, age below 18).
    """
    def code(col: str, names: tuple[str, ...]) -> np.ndarray:
        idx = {v: i for i, v in enumerate(names)}
        return frame[col].cast(pl.Utf8).replace_strict(idx, default=-1, return_dtype=pl.Int64).to_numpy()

    age = frame["age"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
    band = np.searchsorted(np.asarray(AGE_EDGES), age, side="right").astype(np.int64)
    band = np.where(np.isnan(age) | (age < 18), -1, band)
    return np.stack([code("gender", SUBGROUP_AXES["sex"]), band, code("race", SUBGROUP_AXES["race"])], axis=1)


@dataclass
class ClinicalEvaluation:
    """One run's clinical figures (see the module docstring); all values are aggregates."""

    per_center: list[dict[str, Any]]
    distribution: dict[str, dict[str, float | int | None]]
    auroc_ci: tuple[float, float]
    subgroups: list[dict[str, Any]] = field(default_factory=list)
    subgroup_note: str = ""
    #: per axis, the test rows in no group (UNKNOWN race, missing sex or age, age below 18): they
    #: count in the overall figures only, so that each axis accounts for every test row
    subgroup_unassigned: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """results.json entry: distribution, interval, subgroups (no per-center table)."""
        return {"distribution": self.distribution, "auroc_ci": list(self.auroc_ci), "ece_bins": ECE_BINS,
                "n_boot": N_BOOT, "subgroups": self.subgroups, "subgroup_note": self.subgroup_note,
                "subgroup_unassigned": self.subgroup_unassigned}

    def final_metrics(self) -> dict[str, float]:
        """The few MLflow final metrics: ``clin_<metric>_<stat>`` and the AUROC interval."""
        out = {f"clin_{m}_{s}": v for m, d in self.distribution.items() for s, v in d.items()
               if s in STATS and v is not None and math.isfinite(v)}
        out.update({k: v for k, v in zip(("clin_auroc_ci_low", "clin_auroc_ci_high"), self.auroc_ci)
                    if math.isfinite(v)})
        return out

    def per_center_csv(self) -> str:
        """The per-center table as CSV (center_id keyed; empty cells for undefined figures and for
        the figures of small centers, :func:`publishable_per_center`)."""
        buf = io.StringIO()
        rows = [{"center_id": r["center_id"], **row} for r, row in
                zip(self.per_center, publishable_per_center({r["center_id"]: r for r in self.per_center}).values())]
        cols = list(rows[0]) if rows else ["center_id"]
        w = csv.DictWriter(buf, cols, lineterminator="\n")
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if v is None or isinstance(v, float) and not math.isfinite(v) else v)
                        for k, v in row.items()})
        return buf.getvalue()


#: per-center figures that are not about the test cell (kept for a small center): train / val counts
_CELL_FREE = ("center_id", "n_train", "n_val")


def publishable_per_center(per_center: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The per-center table as it may leave a run (MLflow ``per_center.json``,
    ``clinical_per_center.csv``): a center whose test cell is small by the subgroups' rule
    (:func:`federation.clinical.is_small_cell` on ``n_test`` / ``n_pos``) keeps only its train and
    validation counts; its test counts and every test figure (AUROC, Brier, ...) become None, and
    ``suppressed`` is True. Others are unchanged, with ``suppressed`` False.
    """
    out = {}
    for cid, row in per_center.items():
        small = "n_test" in row and is_small_cell(int(row["n_test"]), None if row.get("n_pos") is None
                                                   else int(row["n_pos"]))
        out[cid] = ({k: (v if k in _CELL_FREE else None) for k, v in row.items() if k != "center_id"} if small
                    else {k: v for k, v in row.items() if k != "center_id"})
        out[cid]["suppressed"] = small
    return out


def as_logits(scores: torch.Tensor, kind: str) -> torch.Tensor:
    """The model's logits from its scores: ``kind`` ``"logit"`` (the engine's default) or
    ``"probability"`` (e.g. the BNN's predictive mean; clipped to [1e-7, 1 - 1e-7] first)."""
    if kind == "probability":
        p = scores.double().clamp(_EPS, 1 - _EPS)
        return torch.log(p) - torch.log1p(-p)
    if kind != "logit":
        raise ValueError(f"unknown score kind {kind!r} (logit or probability)")
    return scores.double()


def evaluate_clinical(
    center_ids: list[str], scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
    groups: torch.Tensor | None = None, kind: str = "logit", seed: int = 0, n_boot: int = N_BOOT,
) -> ClinicalEvaluation:
    """All clinical figures of one run's test predictions.

    Args:
        center_ids: ``n`` center ids (row order of the tensors).
        scores: ``[n, rows]`` the method's test scores (:meth:`Method.scores`), of ``kind``.
        labels, mask: ``[n, rows]`` test labels (0/1) and real-row mask.
        groups: ``[n, rows, 3]`` int64 subgroup codes (:func:`group_codes`, -1 = unknown or
            padding), or None (no subgroup table; said in ``subgroup_note``).
        kind: ``"logit"`` or ``"probability"`` (:func:`as_logits`).
        seed: bootstrap seed (the run seed: same seed, same interval).

    Returns:
        :class:`ClinicalEvaluation`.
    """
    z = as_logits(scores, kind).masked_fill(~mask, 0.0)
    p = torch.sigmoid(z)
    y = labels.double()
    a, b = batched_calibration(z, y, mask, min_events=MIN_CELL_EVENTS)  # the small-cell rule, per center
    per = {"auroc": batched_auroc(z, y, mask).double(), "auprc": batched_auprc(z, y, mask),
           "brier": batched_brier(p, y, mask), "ece": batched_ece(p, y, mask, ECE_BINS),
           "cal_intercept": a, "cal_slope": b}
    n_test, n_pos = mask.sum(1), ((y > 0.5) & mask).sum(1)
    rows = [{"center_id": cid, "n_test": int(n_test[i]), "n_pos": int(n_pos[i]),
             **{m: float(v[i]) for m, v in per.items()}} for i, cid in enumerate(center_ids)]
    dist = {}
    for m, higher in METRICS.items():
        d = asdict(distribution(per[m], higher_is_better=higher))
        if m == "cal_intercept":
            d["gini"] = None  # the intercept changes sign: a Gini of it has no meaning
        dist[m] = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
    ci = bootstrap_mean_auroc(z, y, mask, n_boot=n_boot, seed=seed)
    subgroups: list[dict[str, Any]] = []
    note = "no subgroup codes in this data (cohort columns gender, age, race)"
    if groups is not None and groups.numel():
        for ax, (axis, names) in enumerate(SUBGROUP_AXES.items()):
            for r in subgroup_gaps(z, y, mask, groups[..., ax], list(names), n_boot=n_boot, seed=seed,
                                   n_bins=ECE_BINS):
                d = asdict(r)
                d = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
                d["auroc_gap_ci"] = [None if not math.isfinite(v) else v for v in r.auroc_gap_ci]
                subgroups.append({"axis": axis, **d})
        hidden = [f"{s['axis']}={s['group']}" for s in subgroups if s["suppressed"]]
        note = (f"suppressed (fewer than {MIN_CELL_ROWS} rows or {MIN_CELL_EVENTS} of either class): "
                + ", ".join(hidden)) if hidden else \
            "no group suppressed"
        unassigned = {axis: int(((groups[..., ax] < 0) & mask).sum()) for ax, axis in enumerate(SUBGROUP_AXES)}
        if any(unassigned.values()):
            note += ("; test rows in no group (in the overall figures only): "
                     + ", ".join(f"{axis} {k}" for axis, k in unassigned.items() if k))
        return ClinicalEvaluation(rows, dist, ci, subgroups, note, unassigned)
    return ClinicalEvaluation(rows, dist, ci, subgroups, note)


def evaluate_final(data: Any, scores: torch.Tensor, kind: str, seed: int) -> ClinicalEvaluation:
    """:func:`evaluate_clinical` on ``data``'s test split (a :class:`FederatedData`)."""
    t = data.splits["test"]
    groups = getattr(data, "groups", {}).get("test")
    return evaluate_clinical(data.center_ids, scores, t.y, t.mask, groups, kind=kind, seed=seed)


def log_clinical(tracker: Any, clinical: ClinicalEvaluation | None, step: int) -> None:
    """Log a run's clinical figures to its MLflow run: the final metrics (few keys) at ``step``,
    ``clinical_per_center.csv`` and ``clinical_subgroups.json`` (aggregates only)."""
    if clinical is None:
        return
    tracker.log_metrics(clinical.final_metrics(), step)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "clinical_per_center.csv")
        with open(path, "w") as fh:
            fh.write(clinical.per_center_csv())
        tracker.log_file(path)
    tracker.log_json({"subgroups": clinical.subgroups, "note": clinical.subgroup_note,
                      "unassigned": clinical.subgroup_unassigned}, "clinical_subgroups.json")


def clinical_line(seeds: dict[str, dict[str, Any]], auroc_spread: bool = True) -> str | None:
    """One line for ``abps train``: seed means of the headline clinical figures (results.json
    ``seeds`` entries), or None when no seed carries them. ``auroc_spread=False`` (the mean AUROC
    is undefined: too few centers can be scored, docs/decisions.md) words the worst-10 % and
    the Gini of the per-center AUROC as undefined too: they rest on the same few centers."""
    docs = [s["clinical"] for s in seeds.values() if s.get("clinical")]
    if not docs:
        return None

    def mean(metric: str, stat: str) -> str:
        if metric == "auroc" and not auroc_spread:
            return "undefined"
        v = [d["distribution"][metric][stat] for d in docs if d["distribution"][metric][stat] is not None]
        return f"{sum(v) / len(v):.3f}" if v else "undefined"

    n_hidden = max(sum(r["suppressed"] for r in d["subgroups"]) for d in docs)
    return (f"clinical (mean over seeds): AUROC worst-10 % {mean('auroc', 'worst10')}, Gini {mean('auroc', 'gini')}; "
            f"AUPRC {mean('auprc', 'mean')}, Brier {mean('brier', 'mean')}, ECE {mean('ece', 'mean')}, "
            f"calibration slope (median) {mean('cal_slope', 'median')}; {n_hidden} subgroup(s) suppressed "
            "(results.json has the tables)")

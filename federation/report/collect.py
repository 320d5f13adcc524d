"""Reading MLflow: the FINISHED runs of an experiment, split into clinical runs (sweep cells and
``abps train`` seeds), SAGE runs and variance-correction runs; one run per (label, seed), never
two cohorts pooled."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from federation.run.tracking import (
    ARM_TAG,
    BENCHMARK_TAG,
    COHORT_NAME_TAG,
    COHORT_TAG,
    ENGINE_STEP_TAG,
    HASH_TAG,
    KIND_REPORT,
    KIND_SWEEP,
    KIND_TAG,
    KIND_TRAIN,
    LABEL_TAG,
    METHOD_TAG,
    METRIC_TAG,
    PLATFORM_COMPARED,
    PLATFORM_TAG_PREFIX,
    SELECTOR_TAG,
    Tracker,
    seed_of,
)

__all__ = ["CellRun", "Collected", "dedupe_cells", "collect_runs", "platform_note"]


@dataclass
class CellRun:
    """One FINISHED clinical run (a sweep cell or an ``abps train`` child run)."""

    run_id: str
    label: str
    method: str
    seed: int
    cohort: str | None
    config_hash: str | None
    start_time: int
    final_auroc_mean: float
    model_bytes: float
    rel_bandwidth: float
    rounds_run: float
    rest_share: float = math.nan  # ABPS final metric rest_share_mean (NaN for methods without rest)
    partners_mean: float = math.nan  # ABPS final metrics partners_mean, run_acceptance_rate, centers_ever_rested
    acceptance_rate: float = math.nan
    centers_ever_rested: float = math.nan
    platform: dict[str, str] = field(default_factory=dict)  # PLATFORM_COMPARED facts of the run
    n_scored: float = math.nan  # centers with a defined test AUROC; the mean needs min_scored of them
    min_scored: float = math.nan
    n_excluded: float = math.nan  # centers whose test AUROC is undefined (one class): n_scored + n_excluded = all
    cohort_name: str = ""  # the cohort's folder name (empty for runs made before the tag)
    final_val_auroc: float = math.nan  # mean validation AUROC of the reported round
    targets: dict[str, tuple[float, ...]] = field(default_factory=dict)  # the run's targets.* config (as logged)
    metric: str = "auroc"  # what final_auroc_mean holds: auroc, or accuracy on an image federation (METRIC_TAG)


def _platform(tags: dict[str, str]) -> dict[str, str]:
    """The run's :data:`PLATFORM_COMPARED` facts (``unrecorded`` for runs made without them)."""
    got = {k: tags.get(PLATFORM_TAG_PREFIX + k, "") for k in PLATFORM_COMPARED}
    if not got["engine_step"] and tags.get(ENGINE_STEP_TAG):
        got["engine_step"] = tags[ENGINE_STEP_TAG]
    return {k: v or "unrecorded" for k, v in got.items()}


def platform_note(platforms: Iterable[dict[str, str]]) -> str | None:
    """A note when the compared runs were computed on different machines or code paths (CPU,
    SIMD level, engine step, kernel build, library versions): the same seed then gives figures
    that agree within float rounding, not bit for bit. None when they all agree.

    Args:
        platforms: one :data:`PLATFORM_COMPARED` mapping per run (as in :attr:`CellRun.platform`).
    """
    counts: dict[str, dict[str, int]] = {k: {} for k in PLATFORM_COMPARED}
    n = 0
    for p in platforms:
        n += 1
        for k in PLATFORM_COMPARED:
            v = p.get(k, "unrecorded")
            counts[k][v] = counts[k].get(v, 0) + 1
    differ = {k: c for k, c in counts.items() if len(c) > 1}
    if n == 0 or not differ:
        return None
    parts = [f"{k}: " + ", ".join(f"{v} ({c} runs)" for v, c in sorted(cs.items())) for k, cs in differ.items()]
    return (f"the {n} compared runs were computed on different platforms ({'; '.join(parts)}): the same seed "
            "then agrees within float rounding, not bit for bit (docs/reproducibility.md)")


@dataclass
class Collected:
    """Runs of an experiment by kind, after de-duplication, and notes on what was dropped."""

    cells: list[CellRun] = field(default_factory=list)
    sage: list[Any] = field(default_factory=list)
    vv: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _label(method: str, params: dict[str, str]) -> str:
    """Row label of an ``abps train`` run made before runs carried their label tag
    (:func:`federation.methods.run_label` of its logged method parameters; imports the methods)."""
    from federation.methods.registry import run_label

    return run_label(method, {k[len("params."):]: v for k, v in params.items() if k.startswith("params.")})


def _cell_from_run(r: Any) -> CellRun | None:
    m, t = r.data.metrics, r.data.tags
    # a run whose mean is undefined (too few evaluable centers) logs no final_auroc_mean but its counts
    seed = seed_of(t)
    if ("final_auroc_mean" not in m and "n_scored_test" not in m) or METHOD_TAG not in t or seed is None:
        return None
    method = t[METHOD_TAG]
    return CellRun(
        run_id=r.info.run_id, label=t.get(LABEL_TAG) or _label(method, r.data.params), method=method,
        seed=seed, cohort=t.get(COHORT_TAG), cohort_name=t.get(COHORT_NAME_TAG, ""),
        config_hash=t.get(HASH_TAG), start_time=int(r.info.start_time or 0),
        final_auroc_mean=float(m.get("final_auroc_mean", math.nan)),
        n_scored=float(m.get("n_scored_test", math.nan)), min_scored=float(m.get("min_scored_test", math.nan)),
        n_excluded=float(m.get("n_excluded_test", math.nan)),
        model_bytes=float(m.get("model_bytes", m.get("cum_bytes", math.nan))),
        rel_bandwidth=float(m.get("rel_bandwidth", math.nan)), rounds_run=float(m.get("rounds_run", math.nan)),
        rest_share=float(m.get("rest_share_mean", math.nan)),
        partners_mean=float(m.get("partners_mean", math.nan)),
        acceptance_rate=float(m.get("run_acceptance_rate", math.nan)),
        centers_ever_rested=float(m.get("centers_ever_rested", math.nan)), platform=_platform(t),
        final_val_auroc=float(m.get("final_val_auroc_mean", math.nan)), targets=_targets(r.data.params),
        metric=t.get(METRIC_TAG, "auroc"))


def _targets(params: dict[str, str]) -> dict[str, tuple[float, ...]]:
    """The run's logged ``targets.auroc`` / ``targets.below_fedavg`` (JSON lists, :func:`flatten`);
    a run made before the setting existed has neither."""
    out = {}
    for key in ("auroc", "below_fedavg"):
        text = params.get(f"targets.{key}")
        if text is not None:
            with contextlib.suppress(ValueError, TypeError):
                out[key] = tuple(float(x) for x in json.loads(text))
    return out


def dedupe_cells(cells: Iterable[CellRun]) -> tuple[list[CellRun], list[str]]:
    """One run per (label, seed): per label the configuration of its most recent run, then the most
    recent run per seed. Returns (kept runs, notes on the runs of other configurations left out)."""
    by_label: dict[str, list[CellRun]] = {}
    for c in cells:
        by_label.setdefault(c.label, []).append(c)
    kept: list[CellRun] = []
    notes: list[str] = []
    for label, runs in by_label.items():
        runs.sort(key=lambda c: c.start_time)
        latest = runs[-1].config_hash
        same = [c for c in runs if c.config_hash == latest]
        if len(same) < len(runs) and latest is not None:
            notes.append(f"{label}: {len(runs) - len(same)} earlier run(s) with another configuration left out "
                         "(a row shows its most recent configuration's runs)")
        per_seed: dict[int, CellRun] = {}
        for c in same:
            per_seed[c.seed] = c  # sorted by start time: the latest wins
        kept.extend(per_seed[s] for s in sorted(per_seed))
    return kept, notes


def collect_runs(source: Tracker | Iterable[Any]) -> Collected:
    """FINISHED runs split into clinical cells, SAGE and variance-correction runs.

    Args:
        source: a :class:`Tracker` (its experiment's FINISHED runs are searched), or the FINISHED
            runs themselves (MLflow ``Run`` objects or :class:`federation.run.store_read.StoredRun`).
    """
    out = Collected()
    cells = []
    runs = source.search("attributes.status = 'FINISHED'") if isinstance(source, Tracker) else source
    for r in runs:
        bench = r.data.tags.get(BENCHMARK_TAG)
        if bench == "sage" and SELECTOR_TAG in r.data.tags:
            out.sage.append(r)
        elif bench == "vv" and ARM_TAG in r.data.tags:
            out.vv.append(r)
        elif r.data.tags.get(KIND_TAG) not in (KIND_SWEEP, KIND_REPORT, KIND_TRAIN):
            c = _cell_from_run(r)
            if c is not None:
                cells.append(c)
    cohorts = {c.cohort for c in cells if c.cohort}
    if len(cohorts) > 1:  # never pool runs on different cohorts: keep the most recent run's cohort
        latest = max((c for c in cells if c.cohort), key=lambda c: c.start_time).cohort
        dropped = [c for c in cells if c.cohort not in (latest, None)]
        cells = [c for c in cells if c.cohort in (latest, None)]
        def name(cid: str) -> str:
            folders = sorted({c.cohort_name for c in dropped + cells if c.cohort == cid and c.cohort_name})
            return "/".join(folders) if folders else f"cohort id {cid}"

        kept = name(latest)
        others = ", ".join(sorted({name(c.cohort) + (" as built earlier" if name(c.cohort) == kept else "")
                                   for c in dropped}))
        out.notes.append(f"{len(dropped)} run(s) on another cohort ignored ({others}); the runs of the most recent "
                         f"run's cohort ({kept}) are shown; give each cohort its own --experiment "
                         "(abps train's default experiment is the cohort's folder name)")
    out.cells, notes = dedupe_cells(cells)
    out.notes.extend(notes)
    for kind, platforms in (("clinical", [c.platform for c in out.cells]),
                            ("SAGE", [_platform(r.data.tags) for r in out.sage]),
                            ("variance-correction", [_platform(r.data.tags) for r in out.vv])):
        note = platform_note(platforms)
        if note:
            out.notes.append(f"{kind} runs: {note}")
    return out

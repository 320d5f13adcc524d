"""The cross sweep: one sweep file whose ``datasets:`` names several cohorts or image federations,
each run as an ordinary sweep in one MLflow experiment (docs/cross.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, StrictInt, ValidationError, field_validator

from etl.errors import InputError
from federation.core.config import NumbersNotFlags, first_error, from_folder, load_yaml
from federation.data.load import load_federation
from federation.run.tracking import METRIC_TAG, Tracker
from federation.sweep.driver import run_sweep
from federation.sweep.spec import check_seeds, sweep_spec

__all__ = ["CrossDataset", "load_cross_sweep", "is_cross_sweep", "run_cross_sweep", "cross_summary_line",
           "DATASET_TAG", "METRIC_TAG"]

#: MLflow tags a cross sweep sets on each data set's parent sweep run (read by federation.report.cross)
DATASET_TAG = "abps.dataset"


class CrossDataset(NumbersNotFlags):
    """One column of the cross table: a cohort (clinical) or image-federation directory; its
    rounds and seeds are checked as the sweep file's (no true / false for a number)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cohort: str
    rounds: StrictInt | None = Field(None, ge=1)
    seeds: list[StrictInt] | None = Field(None, min_length=1)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int] | None) -> list[int] | None:
        return check_seeds(v)


def load_cross_sweep(path: str | Path) -> tuple[Any, Path, dict[str, CrossDataset]]:
    """Read a cross sweep file: a sweep file (:class:`federation.sweep.SweepSpec`) plus ``datasets:``
    (label -> directory, or ``{cohort: DIR, rounds: R, seeds: [...]}`` overriding the file's rounds /
    seeds for that data set; relative paths from the file's folder).

    Raises:
        InputError: no ``datasets:``, a bad entry, or an invalid sweep field.
    """
    doc = load_yaml(path)
    raw = doc.pop("datasets", None)
    if not isinstance(raw, dict) or not raw:
        raise InputError(f"{path}: `datasets:` must map data-set labels to cohort directories")
    if doc.get("cohort") is not None:
        raise InputError(f"{path}: a cross sweep names its cohorts under `datasets:`; drop `cohort:`")
    base = Path(path).resolve().parent
    sets: dict[str, CrossDataset] = {}
    for label, v in raw.items():
        if str(label) in sets:  # YAML keys 1 and "1" are one label here
            raise InputError(f"{path}: datasets: the label {str(label)!r} is given twice")
        try:
            d = CrossDataset.model_validate({"cohort": v} if isinstance(v, str) else v)
        except ValidationError as exc:
            raise InputError(f"{path}: datasets.{label}: {first_error(exc)[1]}") from None
        sets[str(label)] = d.model_copy(update={"cohort": str(from_folder(d.cohort, base))})
    return sweep_spec(doc, path), base, sets  # the rest: an ordinary sweep file


def is_cross_sweep(path: str | Path) -> bool:
    """True when the sweep file has a ``datasets:`` key (``abps sweep`` hands it to :func:`run_cross_sweep`)."""
    return "datasets" in load_yaml(path)


def run_cross_sweep(path: str | Path, *, only: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
    """Run a cross sweep: the file's methods x seeds on every data set of ``datasets:``, each data set
    one ordinary sweep (:func:`federation.sweep.run_sweep`, resumable) in the same MLflow experiment,
    its parent run tagged with the data set's label (:data:`DATASET_TAG`) and metric
    (:data:`METRIC_TAG`: ``auroc`` or ``accuracy``).

    Args:
        path: the cross sweep file (``configs/cross.yaml``).
        only: labels of the data sets to run (default all).
        kwargs: passed to :func:`run_sweep` (executor, workers, rounds, seeds, tracking_uri,
            experiment, progress); ``rounds`` / ``seeds`` override the data sets' own.

    Returns:
        ``{label: SweepOutcome}``.

    Raises:
        InputError: bad file, unknown label in ``only``, or a bad cohort.
    """
    spec, base, sets = load_cross_sweep(path)
    unknown = sorted(set(only or ()) - set(sets))
    if unknown:
        raise InputError(f"{path}: no data set {unknown[0]!r}; known: {', '.join(sets)}")
    experiment = kwargs.pop("experiment", None) or spec.experiment or spec.name
    rounds = kwargs.pop("rounds", None)
    for label, d in sets.items():  # every data set's files are checked before the first cell runs
        if not only or label in only:
            try:
                load_federation(d.cohort)
            except InputError as exc:
                raise InputError(f"{path}: datasets.{label}: {exc}") from None
    out: dict[str, Any] = {}
    for label, d in sets.items():
        if only and label not in only:
            continue
        sub = spec.model_copy(update={"name": f"{spec.name}-{label}"})
        res = run_sweep(sub, base, d.cohort, rounds=rounds or d.rounds, experiment=experiment,
                        seeds=kwargs.get("seeds") or d.seeds, **{k: v for k, v in kwargs.items() if k != "seeds"})
        metric = load_federation(d.cohort).metric_name
        tracker = Tracker(kwargs.get("tracking_uri"), experiment, create=False)
        tracker.client.set_tag(res.parent_run_id, DATASET_TAG, label)
        tracker.client.set_tag(res.parent_run_id, METRIC_TAG, metric)
        out[label] = res
    return out


def cross_summary_line(label: str, res: Any) -> str:
    """One console line per data set of a cross sweep."""
    return (f"  {label}: {len(res.cells)} cells, {len(res.skipped)} already finished, {len(res.ran)} run now, "
            f"{len(res.failed)} failed")

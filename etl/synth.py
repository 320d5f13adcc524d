"""``abps synth mimic``: a synthetic MIMIC-IV v3.1-format directory with its ground truth
(same seed and options, byte-identical files). Files, scale and columns: docs/etl.md, "Module notes".
"""

from __future__ import annotations

import io
import json
import math
import os
import time
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import polars as pl

from etl import progress
from etl import synth_spec as S
from etl.errors import InputError
from etl.io import atomic_output_dir
from etl.synth_chart import StayChunk, chart_frame, chart_rows, vital_truth
from etl.synth_cohort import SynthCohort, build_cohort, diagnoses_arrays, year_of

MANIFEST = "synth_manifest.json"
GENERATOR = "abps synth mimic"
DATETIME_FORMAT = "%Y-%m-%d %H:%M:%S"
MAX_STAYS = 2_000_000


@dataclass(frozen=True)
class SynthConfig:
    """Options of :func:`synth_mimic`.

    ``stays``: number of ICU stays (default 94,458, MIMIC-IV v3.1's count).
    ``seed``: fixes every draw. ``chart_hours_step``: hours between charting rounds (default 1;
    0.5 doubles chartevents, to about 60 M rows at full scale). ``chartevents``: write
    ``icu/chartevents.csv.gz`` (False skips it and leaves the vital truth null). ``compresslevel``:
    gzip level 1..9 (1 is the fast default). ``chunk_stays``: stays generated and written per
    chartevents chunk (bounds memory). ``heterogeneity``: how far the care units' risk models and
    base rates differ (:func:`etl.synth_spec.unit_model`: 0 = one shared model and base rate, 1 =
    the built-in units (default), 2 = twice as far apart); the manifest names it when not 1.
    """

    stays: int = S.DEFAULT_STAYS
    seed: int = 0
    chart_hours_step: float = 1.0
    chartevents: bool = True
    compresslevel: int = 1
    chunk_stays: int = 6_000
    heterogeneity: float = 1.0

    def validate(self) -> None:
        """Raise :class:`InputError` naming the option at fault."""
        if not 1 <= self.stays <= MAX_STAYS:
            raise InputError(f"--stays must be between 1 and {MAX_STAYS}, got {self.stays}")
        if self.seed < 0:
            raise InputError(f"--seed must be >= 0, got {self.seed}")
        step_min = self.chart_hours_step * 60.0
        if not (1.0 <= step_min <= 24 * 60) or abs(step_min - round(step_min)) > 1e-9:
            raise InputError("--chart-hours-step must be a whole number of minutes between 1/60 and 24 hours, "
                             f"got {self.chart_hours_step}")
        if not 1 <= self.compresslevel <= 9:
            raise InputError(f"--compress-level must be between 1 and 9, got {self.compresslevel}")
        if self.chunk_stays < 1:
            raise InputError(f"chunk_stays must be >= 1, got {self.chunk_stays}")
        # past MAX_HETEROGENEITY the risks saturate at 0 or 1 and the logistic overflows
        if not (math.isfinite(self.heterogeneity) and 0 <= self.heterogeneity <= MAX_HETEROGENEITY):
            raise InputError(f"--heterogeneity must be a number from 0 to {MAX_HETEROGENEITY:g}, got {self.heterogeneity}")


#: the largest --heterogeneity: 10x the built-in units' spread, where most risks are already near 0 or 1
MAX_HETEROGENEITY = 10.0


@dataclass(frozen=True)
class SynthSummary:
    """What :func:`synth_mimic` wrote: counts of rows per table and the wall time in seconds."""

    out: str
    stays: int
    patients: int
    admissions: int
    diagnoses_rows: int
    chartevents_rows: int
    seconds: float

    def line(self) -> str:
        """One-line summary for the CLI (no identifiers)."""
        return (f"synth mimic: {self.stays} stays, {self.patients} patients, {self.admissions} admissions, "
                f"{self.diagnoses_rows} diagnoses, {self.chartevents_rows} chartevents rows "
                f"in {self.seconds:.1f} s -> {self.out}")


class _GzipStream:
    """One gzip member written by a background thread (zlib releases the GIL), at most two
    chunks in flight. Deterministic: no file name or time in the header."""

    def __init__(self, path: Path, level: int) -> None:
        self._fh = open(path, "wb")
        self._z = zlib.compressobj(level, zlib.DEFLATED, 31)
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._pending: list[Future[None]] = []

    def _do(self, data: bytes) -> None:
        self._fh.write(self._z.compress(data))

    def write(self, data: bytes) -> None:
        while len(self._pending) >= 2:
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(self._do, data))

    def close(self) -> None:
        try:
            for f in self._pending:
                f.result()
            self._fh.write(self._z.flush())
        finally:
            self._pool.shutdown(wait=True)
            self._fh.close()


def _write_table(df: pl.DataFrame, path: Path, level: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    stream = _GzipStream(path, level)
    try:
        buf = io.BytesIO()
        df.write_csv(buf, datetime_format=DATETIME_FORMAT, date_format="%Y-%m-%d")
        stream.write(buf.getvalue())
    finally:
        stream.close()


def _strings(values: tuple[str, ...], idx: np.ndarray) -> pl.Series:
    """``values[idx]`` as a String series, null where ``idx < 0``."""
    table = np.array(list(values) + [None], dtype=object)
    # a list, not the object array: polars cannot cast an object array that holds only nulls
    return pl.Series(table[np.where(idx < 0, len(values), idx)].tolist(), dtype=pl.String)


def _times(seconds: np.ndarray) -> pl.Series:
    """Datetime series from int64 seconds, null where ``seconds < 0``."""
    s = pl.Series(np.where(seconds < 0, 0, seconds))
    return pl.select(pl.when(pl.Series(seconds >= 0)).then(pl.from_epoch(s, time_unit="s"))).to_series()


def _tables(c: SynthCohort, seed: int) -> dict[str, pl.DataFrame]:
    """The hosp/ and icu/ tables except chartevents, in MIMIC-IV column order."""
    pat = c.adm_pat
    patients = pl.DataFrame({
        "subject_id": c.subject_id,
        "gender": np.where(c.gender_m, "M", "F"),
        "anchor_age": c.anchor_age,
        "anchor_year": c.anchor_year,
        "anchor_year_group": _strings(S.ERAS, c.era),
        "dod": _times(c.dod).dt.date(),
    })
    admissions = pl.DataFrame({
        "subject_id": c.subject_id[pat],
        "hadm_id": c.hadm_id,
        "admittime": _times(c.admittime),
        "dischtime": _times(c.dischtime),
        "deathtime": _times(c.deathtime),
        "admission_type": _strings(S.ADMISSION_TYPES, c.admission_type),
        "admit_provider_id": c.provider,
        "admission_location": _strings(S.ADMISSION_LOCATIONS, c.admission_location),
        "discharge_location": _strings(("DIED",) + S.DISCHARGE_LOCATIONS_ALIVE, c.discharge_location + 1),
        "insurance": _strings(S.INSURANCES, c.insurance),
        "language": _strings(S.LANGUAGES, c.language[pat]),
        "marital_status": _strings(S.MARITAL, c.marital[pat]),
        "race": _strings(S.RACES, c.race[pat]),
        "edregtime": _times(c.edregtime),
        "edouttime": _times(c.edouttime),
        "hospital_expire_flag": c.label.astype(np.int64),
    })
    dx = diagnoses_arrays(c, seed)
    diagnoses = pl.DataFrame({
        "subject_id": c.subject_id[pat[dx["adm"]]],
        "hadm_id": c.hadm_id[dx["adm"]],
        "seq_num": dx["seq_num"],
        "icd_code": pl.Series(dx["code"], dtype=pl.String),
        "icd_version": dx["version"].astype(np.int64),
    })
    icustays = pl.DataFrame({
        "subject_id": c.subject_id[pat[c.stay_adm]],
        "hadm_id": c.hadm_id[c.stay_adm],
        "stay_id": c.stay_id,
        "first_careunit": _strings(S.UNIT_NAMES, c.unit),
        "last_careunit": _strings(S.UNIT_NAMES, c.last_unit),
        "intime": _times(c.intime),
        "outtime": _times(c.outtime),
        "los": (c.outtime - c.intime) / 86_400.0,
    })
    d_items = pl.DataFrame([list(r) for r in S.D_ITEMS], schema=list(S.D_ITEMS_COLUMNS), orient="row")
    d_items = d_items.with_columns(pl.col(c).replace("", None) for c in S.D_ITEMS_COLUMNS[1:])
    return {"hosp/patients": patients, "hosp/admissions": admissions, "hosp/diagnoses_icd": diagnoses,
            "icu/icustays": icustays, "icu/d_items": d_items}


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        manifest = out / MANIFEST
        try:
            ok = json.loads(manifest.read_text()).get("generator") == GENERATOR
        except (OSError, ValueError, AttributeError):
            ok = False
        if not ok:
            raise InputError(f"--out {out} is a non-empty directory that is not a previous synth output "
                             f"(no {MANIFEST}); choose an empty or new directory")


def _options(config: SynthConfig) -> dict[str, object]:
    """The manifest's options: every field of ``config``; ``heterogeneity`` only when set away from
    its default 1 (a default folder stays byte-identical to one written before the option existed)."""
    opts = asdict(config)
    if config.heterogeneity == 1.0:
        del opts["heterogeneity"]
    return opts


def synth_mimic(out: str | os.PathLike[str], config: SynthConfig = SynthConfig()) -> SynthSummary:
    """Write a synthetic MIMIC-IV v3.1-format directory with ``ground_truth.parquet`` into ``out``.

    See the module docstring for the files and the ground-truth semantics. Raises
    :class:`InputError` for invalid options, or when ``out`` is a file or a non-empty directory
    without a previous synth manifest. Returns a :class:`SynthSummary`.
    Cost at full scale: about 30 M chartevents rows, a minute or two on two cores, < 2 GB memory.
    """
    config.validate()
    out = Path(out)
    _check_out(out)
    t_start = time.perf_counter()
    cohort = build_cohort(config.stays, config.seed, config.heterogeneity)
    tables = _tables(cohort, config.seed)
    n_chart = 0
    truth = np.full((cohort.n_stays, len(S.VITALS), 3), np.nan)
    chunks = -(-cohort.n_stays // config.chunk_stays) if config.chartevents else 0
    progress.total(len(tables) + chunks + 1)
    with atomic_output_dir(out, keep_unwritten=False) as tmp:  # an earlier synth output is replaced whole
        for name, df in tables.items():
            progress.step(f"{name}.csv.gz")
            _write_table(df, tmp / f"{name}.csv.gz", config.compresslevel)
        if config.chartevents:
            n_chart = _write_chartevents(cohort, config, tmp / "icu" / "chartevents.csv.gz", truth)
        progress.step("ground_truth.parquet")
        _ground_truth(cohort, truth).write_parquet(tmp / "ground_truth.parquet", compression="zstd")
        manifest = {
            "generator": GENERATOR,
            "format": "MIMIC-IV v3.1 layout (synthetic)",
            "options": _options(config),
            "rows": {"patients": cohort.n_patients, "admissions": int(cohort.hadm_id.shape[0]),
                     "diagnoses_icd": tables["hosp/diagnoses_icd"].height, "icustays": cohort.n_stays,
                     "chartevents": n_chart},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return SynthSummary(out=str(out), stays=cohort.n_stays, patients=cohort.n_patients,
                        admissions=int(cohort.hadm_id.shape[0]),
                        diagnoses_rows=tables["hosp/diagnoses_icd"].height, chartevents_rows=n_chart,
                        seconds=time.perf_counter() - t_start)


def _write_chartevents(c: SynthCohort, config: SynthConfig, path: Path, truth: np.ndarray) -> int:
    """Generate and write chartevents chunk by chunk; fill ``truth [N, 7, 3]``; return the row count."""
    step_s = int(round(config.chart_hours_step * 3600))
    subj = c.subject_id[c.adm_pat[c.stay_adm]]
    hadm = c.hadm_id[c.stay_adm]
    stream = _GzipStream(path, config.compresslevel)
    n_rows = 0
    try:
        for i, lo in enumerate(range(0, c.n_stays, config.chunk_stays)):
            hi = min(lo + config.chunk_stays, c.n_stays)
            st = StayChunk(subject_id=subj[lo:hi], hadm_id=hadm[lo:hi], stay_id=c.stay_id[lo:hi],
                           unit=c.unit[lo:hi], intime=c.intime[lo:hi], outtime=c.outtime[lo:hi],
                           vital_mu=c.vital_mu[lo:hi], severity=c.severity[lo:hi])
            rows = chart_rows(st, np.random.default_rng([config.seed, 3, i]), step_s)
            truth[lo:hi] = vital_truth(rows, st.intime)
            frame = chart_frame(rows, st)
            buf = io.BytesIO()
            frame.write_csv(buf, include_header=(lo == 0), datetime_format=DATETIME_FORMAT)
            stream.write(buf.getvalue())
            n_rows += frame.height
            progress.step(f"icu/chartevents.csv.gz ({n_rows:,} rows)")
    finally:
        stream.close()
    return n_rows


def _ground_truth(c: SynthCohort, truth: np.ndarray) -> pl.DataFrame:
    """One row per stay: ids, unit, year, era, age, label, risk, Charlson flags, vital truth."""
    a = c.stay_adm
    cols: dict[str, object] = {
        "stay_id": c.stay_id,
        "subject_id": c.subject_id[c.adm_pat[a]],
        "hadm_id": c.hadm_id[a],
        "first_careunit": _strings(S.UNIT_NAMES, c.unit),
        "care_unit": _strings(S.UNIT_SHORT, c.unit),
        "intime_year": year_of(c.intime).astype(np.int32),
        "anchor_year_group": _strings(S.ERAS, c.era[c.adm_pat[a]]),
        "age": c.stay_age().astype(np.float64),
        "label": c.label[a].astype(np.int8),
        "risk": c.risk,
    }
    for k, name in enumerate(S.CCI_COLUMNS):
        cols[name] = c.cci[a, k].astype(np.int8)
    for v, vital in enumerate(S.VITALS):
        for j, stat in enumerate(("mean", "min", "max")):
            cols[f"{vital}_{stat}"] = pl.Series(truth[:, v, j]).fill_nan(None)
    return pl.DataFrame(cols)

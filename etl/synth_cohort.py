"""Synthetic MIMIC-IV cohort in memory (patients, admissions, ICU stays, labels, diagnoses): the first
stage of ``abps synth mimic``; every array is drawn from the generator passed in. Details:
docs/etl.md, "Module notes".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from etl import synth_spec as S

DAY = 86_400
HOUR = 3_600


# --------------------------------------------------------------------------------------------
# Calendar helpers (shifted years up to 2210 fit int64 seconds easily).
# --------------------------------------------------------------------------------------------
def year_start(years: np.ndarray) -> np.ndarray:
    """Seconds since 1970 of Jan 1st 00:00 of each year; ``years`` int array, any shape."""
    y = np.asarray(years, dtype=np.int64)
    return (y - 1970).astype("datetime64[Y]").astype("datetime64[s]").astype(np.int64)


def year_of(seconds: np.ndarray) -> np.ndarray:
    """Calendar year (int64) of each time in seconds since 1970."""
    return np.asarray(seconds, dtype=np.int64).astype("datetime64[s]").astype("datetime64[Y]").astype(
        np.int64) + 1970


def year_weights() -> np.ndarray:
    """Probability of each shifted year 2110..2200 for a patient's first ICU admission.

    A plateau with logistic shoulders: few patients are shifted to the edges of the range, so the
    partition of the six units x 2-year windows has sparse edge cells that fall under the
    50-stay threshold, giving about 230 centers at full scale (``etl.synth`` docstring).
    Shape ``[91]``, sums to 1.
    """
    y = np.arange(S.FIRST_YEAR, S.LAST_YEAR + 1, dtype=np.float64)
    w = 1.0 / (1.0 + np.exp(-(y - 2121.0) / 2.6)) / (1.0 + np.exp(-(2187.0 - y) / 2.6))
    return w / w.sum()


def _pick(rng: np.random.Generator, p: np.ndarray) -> np.ndarray:
    """Row-wise categorical draw: ``p`` is ``[n, k]`` (rows sum to 1); returns ``[n]`` int64."""
    cum = np.cumsum(p, axis=1)
    u = rng.random(p.shape[0])[:, None] * cum[:, -1:]
    return np.minimum((u >= cum).sum(axis=1), p.shape[1] - 1).astype(np.int64)


def _group_start(group: np.ndarray) -> np.ndarray:
    """For a sorted group id array, the index of the first row of each row's group."""
    n = group.shape[0]
    first = np.ones(n, dtype=bool)
    first[1:] = group[1:] != group[:-1]
    return np.maximum.accumulate(np.where(first, np.arange(n), 0))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p) - np.log1p(-p)


@dataclass
class SynthCohort:
    """The cohort in memory; arrays are aligned per level (patient ``P``, admission ``A``, stay ``N``).

    Patient level (``[P]``): ``subject_id``, ``gender_m`` (bool), ``anchor_age``, ``anchor_year``,
    ``era`` (index into ``synth_spec.ERAS``), ``dod`` (seconds or -1).
    Admission level (``[A]``): ``adm_pat`` (patient row), ``hadm_id``, ``admittime``,
    ``dischtime``, ``deathtime`` (-1 when alive), ``admission_type``, ``admission_location`` (-1
    null), ``discharge_location`` (-1 = DIED), ``insurance`` (-1 null), ``language``,
    ``marital`` (-1 null), ``race``, ``edregtime``/``edouttime`` (-1 null), ``provider`` (admit_provider_id strings),
    ``label`` (int8), ``icd10`` (bool), ``cci`` (``[A, 12]`` int8), ``icu`` (bool: has ICU stays).
    Stay level (``[N]``): ``stay_adm`` (admission row), ``stay_id``, ``unit``, ``last_unit``,
    ``intime``, ``outtime``, ``vital_mu`` (``[N, 7]`` latent levels: HR, SBP, DBP, MBP, RR, SpO2,
    temperature in Celsius), ``severity`` (latent z), ``risk`` (model probability of the stay).
    """

    subject_id: np.ndarray
    gender_m: np.ndarray
    anchor_age: np.ndarray
    anchor_year: np.ndarray
    era: np.ndarray
    dod: np.ndarray
    race: np.ndarray
    language: np.ndarray
    marital: np.ndarray
    adm_pat: np.ndarray
    hadm_id: np.ndarray
    admittime: np.ndarray
    dischtime: np.ndarray
    deathtime: np.ndarray
    admission_type: np.ndarray
    admission_location: np.ndarray
    discharge_location: np.ndarray
    insurance: np.ndarray
    edregtime: np.ndarray
    edouttime: np.ndarray
    provider: np.ndarray
    label: np.ndarray
    icd10: np.ndarray
    cci: np.ndarray
    icu: np.ndarray
    stay_adm: np.ndarray
    stay_id: np.ndarray
    unit: np.ndarray
    last_unit: np.ndarray
    intime: np.ndarray
    outtime: np.ndarray
    vital_mu: np.ndarray
    severity: np.ndarray
    risk: np.ndarray

    @property
    def n_stays(self) -> int:
        """Number of ICU stays ``N``."""
        return int(self.stay_id.shape[0])

    @property
    def n_patients(self) -> int:
        """Number of patients ``P``."""
        return int(self.subject_id.shape[0])

    def stay_age(self) -> np.ndarray:
        """age = anchor_age + year(admittime) - anchor_year per stay (mimic-iv-etl-facts.md, Age)."""
        a = self.stay_adm
        p = self.adm_pat[a]
        return (self.anchor_age[p] + year_of(self.admittime[a]) - self.anchor_year[p]).astype(np.int64)


# --------------------------------------------------------------------------------------------
# Stage 1: the ICU population before labels (patients -> ICU admissions -> stays).
# --------------------------------------------------------------------------------------------
def _draw_population(n_pat: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Patients, their ICU admissions and stays with times, units and admission attributes."""
    d: dict[str, np.ndarray] = {}
    # --- patients ---
    age0 = np.floor(np.clip(rng.normal(65.0, 16.5, n_pat), 17, 100)).astype(np.int64)
    offs = np.array([-1, 0, 1, 2, 3, 4, 5, 6])
    off = offs[_pick(rng, np.tile([0.08, 0.5, 0.18, 0.1, 0.06, 0.04, 0.02, 0.02], (n_pat, 1)))]
    age0 = np.where((age0 < 18) & (off != -1), 18, age0)
    anchor_age = age0 - off
    anchor_age = np.where(anchor_age > 89, 91, np.maximum(anchor_age, 18))
    first_year = S.FIRST_YEAR + _pick(rng, np.tile(year_weights(), (n_pat, 1)))
    t0 = year_start(first_year) + (rng.random(n_pat) * 365 * DAY).astype(np.int64)
    t0 -= t0 % 60
    d["anchor_year"] = first_year - off
    d["anchor_age"] = anchor_age
    d["gender_m"] = rng.random(n_pat) < 0.56
    d["era"] = _pick(rng, np.tile(S.ERA_SHARE, (n_pat, 1)))
    d["era_year0"] = S.ERA_START[d["era"]] + rng.integers(0, 3, n_pat)  # real year of anchor_year
    d["race"] = _pick(rng, np.tile(S.RACE_P, (n_pat, 1)))
    d["language"] = _pick(rng, np.tile(S.LANGUAGE_P, (n_pat, 1)))
    mar = _pick(rng, np.tile(np.append(S.MARITAL_P, 1 - S.MARITAL_P.sum()), (n_pat, 1)))
    d["marital"] = np.where(mar == len(S.MARITAL), -1, mar)
    n_adm = np.minimum(rng.geometric(0.735, n_pat), 8)

    # --- ICU admissions (contiguous per patient, in time order) ---
    adm_pat = np.repeat(np.arange(n_pat), n_adm)
    n_a = adm_pat.shape[0]
    adm_order = np.arange(n_a) - _group_start(adm_pat)
    n_st = 1 + (rng.random(n_a) < 0.088) + (rng.random(n_a) < 0.013)

    # --- stays (contiguous per admission) ---
    stay_adm = np.repeat(np.arange(n_a), n_st)
    n_s = stay_adm.shape[0]
    stay_pat = adm_pat[stay_adm]
    stay_first_of_pat = np.ones(n_s, dtype=bool)
    stay_first_of_pat[1:] = stay_pat[1:] != stay_pat[:-1]
    fresh = _pick(rng, np.tile(S.UNIT_SHARE, (n_s, 1)))
    anchor = stay_first_of_pat | (rng.random(n_s) >= 0.45)  # 45 % repeat the previous unit
    unit = fresh[np.maximum.accumulate(np.where(anchor, np.arange(n_s), 0))]
    moved = rng.random(n_s) < 0.15
    last_unit = np.where(moved, _pick(rng, np.tile(S.UNIT_SHARE, (n_s, 1))), unit)
    unit_first_adm = unit[np.searchsorted(stay_adm, np.arange(n_a))]

    # admission type from the unit of the admission's first stay
    atype = _pick(rng, S.UNIT_TYPE_P[unit_first_adm])
    elective = atype >= 7

    # relative times inside an admission
    los_med = np.array([2.0, 2.0, 1.4, 2.1, 1.8, 2.2, 1.7, 2.4, 2.6])[unit]
    los = np.clip(np.exp(np.log(los_med) + 0.95 * rng.standard_normal(n_s)), 0.05, 60.0)
    los_s = (los * DAY).astype(np.int64)
    pre_h = np.where(elective, rng.uniform(0.5, 10.0, n_a), np.exp(np.log(5.0) + 0.7 * rng.standard_normal(n_a)))
    pre_h = np.where(rng.random(n_a) < 0.12, rng.uniform(24, 240, n_a), pre_h)
    gap_in_adm = (np.exp(np.log(2.0 * DAY) + 0.8 * rng.standard_normal(n_s))).astype(np.int64)
    first_in_adm = np.ones(n_s, dtype=bool)
    first_in_adm[1:] = stay_adm[1:] != stay_adm[:-1]
    lead = np.where(first_in_adm, (pre_h[stay_adm] * HOUR).astype(np.int64), gap_in_adm)
    seconds_on = rng.random(n_s) < 0.5  # half the intimes carry seconds, as in MIMIC
    lead += np.where(seconds_on, rng.integers(0, 60, n_s), 0)
    cum = np.cumsum(lead + los_s)
    base = (cum - lead - los_s)[_group_start(stay_adm)]
    rel_in = cum - los_s - base
    rel_out = cum - base
    post = (np.exp(np.log(3.5 * DAY) + 0.8 * rng.standard_normal(n_a))).astype(np.int64) + 2 * HOUR
    last_stay = np.append(np.flatnonzero(np.diff(stay_adm)), n_s - 1)
    adm_len = rel_out[last_stay] + post
    gap_adm = (2 * DAY + rng.exponential(300.0 * DAY, n_a)).astype(np.int64)
    gap_adm -= gap_adm % 60
    adm_len -= adm_len % 60
    step = adm_len + gap_adm
    cum_a = np.cumsum(step)
    admittime = t0[adm_pat] + (cum_a - step) - (cum_a - step)[_group_start(adm_pat)]
    intime = admittime[stay_adm] + rel_in
    outtime = admittime[stay_adm] + rel_out
    d.update(adm_pat=adm_pat, adm_order=adm_order, admission_type=atype, admittime=admittime,
             adm_post=post, stay_adm=stay_adm, unit=unit, last_unit=last_unit, intime=intime,
             outtime=outtime, unit_first_adm=unit_first_adm, n_pat=np.array(n_pat))
    return d


def _subset(d: dict[str, np.ndarray], keep_adm: np.ndarray) -> None:
    """Keep admissions ``keep_adm`` (bool ``[A]``) and their stays; re-index ``stay_adm`` in place."""
    keep_stay = keep_adm[d["stay_adm"]]
    new_index = np.cumsum(keep_adm) - 1
    for k in ("adm_pat", "adm_order", "admission_type", "admittime", "adm_post", "unit_first_adm",
              "insurance", "location", "cci", "icd10", "lin", "risk_adm", "label"):
        if k in d:
            d[k] = d[k][keep_adm]
    for k in ("unit", "last_unit", "intime", "outtime", "vital_mu", "severity", "stay_lin", "stay_risk"):
        if k in d:
            d[k] = d[k][keep_stay]
    d["stay_adm"] = new_index[d["stay_adm"][keep_stay]]


# --------------------------------------------------------------------------------------------
# Stage 2: features, latent vitals and the mortality model.
# --------------------------------------------------------------------------------------------
def _features(d: dict[str, np.ndarray], rng: np.random.Generator, weights: np.ndarray) -> None:
    """Admission attributes, Charlson flags, latent vitals and the linear predictor (in place);
    ``weights`` ``[N_UNITS, len(RISK_FEATURES)]`` are the units' logistic weights (``S.unit_model``)."""
    adm_pat, stay_adm, unit = d["adm_pat"], d["stay_adm"], d["unit"]
    n_a, n_s = adm_pat.shape[0], stay_adm.shape[0]
    adm_year = year_of(d["admittime"])
    age_adm = d["anchor_age"][adm_pat] + adm_year - d["anchor_year"][adm_pat]
    old = age_adm >= 65
    ins = _pick(rng, np.where(old[:, None], S.INSURANCE_P_OLD, S.INSURANCE_P_YOUNG))
    d["insurance"] = np.where(rng.random(n_a) < S.INSURANCE_NULL_RATE, -1, ins)
    loc = _pick(rng, S.TYPE_LOCATION_P[d["admission_type"]])
    d["location"] = np.where(rng.random(n_a) < S.LOCATION_NULL_RATE, -1, loc)

    # Charlson: a chronic patient-level state, recorded (or not) at each admission
    n_pat = int(d["n_pat"])
    first_adm = np.searchsorted(adm_pat, np.arange(n_pat))
    has_adm = first_adm < n_a
    pat_unit = np.zeros(n_pat, dtype=np.int64)
    pat_age = np.full(n_pat, 65, dtype=np.int64)
    pat_unit[has_adm] = d["unit_first_adm"][first_adm[has_adm]]
    pat_age[has_adm] = age_adm[first_adm[has_adm]]
    p_pat = np.clip(S.CCI_BASE_P * S.CCI_UNIT_MULT[pat_unit]
                    * np.exp(S.CCI_AGE_SLOPE * (pat_age[:, None] - 65) / 10.0), 0.0, 0.8)
    latent = rng.random(p_pat.shape) < p_pat
    d["cci_latent"] = latent
    recorded = latent[adm_pat] & (rng.random((n_a, 12)) < 0.9)
    recorded |= rng.random((n_a, 12)) < 0.08 * S.CCI_BASE_P
    sev, mild, meta, malig = 9, 4, 10, 8
    recorded[:, mild] |= recorded[:, sev] & (rng.random(n_a) < 0.7)
    recorded[:, malig] |= recorded[:, meta] & (rng.random(n_a) < 0.7)
    d["cci"] = recorded.astype(np.int8)
    # ICD version from the real (unshifted) date of the admission: ICD-10 from October 2015
    frac = (d["admittime"] - year_start(adm_year)) / (365.25 * DAY)
    real_t = d["era_year0"][adm_pat] + (adm_year - d["anchor_year"][adm_pat]) + frac
    d["icd10"] = real_t >= 2015.75

    # latent vitals per stay
    era = d["era"][adm_pat[stay_adm]]
    atype_s = d["admission_type"][stay_adm]
    age_s = age_adm[stay_adm].astype(np.float64)
    z = rng.standard_normal(n_s) + 0.3 * S.EMERGENCY_TYPES[atype_s] - 0.3 * (atype_s >= 7)
    e = rng.standard_normal((n_s, 8))
    hr_base = np.array([92.0, 89.0, 84.0, 89.0, 82.0, 90.0, 80.0, 82.0, 80.0])[unit]
    mbp_base = np.array([77.0, 78.0, 76.0, 80.0, 78.0, 82.0, 86.0, 85.0, 87.0])[unit]
    rr_base = np.array([20.5, 19.5, 17.0, 18.5, 19.0, 18.5, 18.0, 17.5, 18.0])[unit]
    spo2_base = np.array([95.8, 96.3, 97.8, 96.8, 96.5, 97.0, 97.0, 97.0, 97.0])[unit]
    temp_base = np.array([37.0, 37.0, 36.7, 37.1, 36.9, 37.0, 37.0, 37.0, 36.9])[unit]
    hr = hr_base + 9.0 * z + 9.0 * e[:, 0] + 0.5 - 0.25 * era              # later eras: ~1 bpm lower
    mbp = mbp_base - 6.5 * z + 8.0 * e[:, 1] + 0.08 * (age_s - 65)
    pp = np.clip(48.0 + 0.45 * (age_s - 65) + 9.0 * e[:, 2], 25.0, 90.0)
    rr = rr_base + 2.2 * z + (4.0 - 0.25 * era) * e[:, 3]                  # narrower spread later
    spo2 = np.clip(spo2_base - 1.1 * z + 1.1 * e[:, 4], 82.0, 99.3)
    temp = temp_base + 0.45 * e[:, 5] + 0.25 * np.abs(z) * np.where(e[:, 6] > 0, 1.0, -1.0)
    d["vital_mu"] = np.stack([hr, mbp + 2 * pp / 3, mbp - pp / 3, mbp, rr, spo2, temp], axis=1)
    d["severity"] = z

    # linear predictor without the intercept
    x = np.empty((n_s, len(S.RISK_FEATURES)))
    x[:, 0] = (age_s - 65.0) / 15.0
    x[:, 1] = (hr - 87.0) / 13.0
    x[:, 2] = np.abs(hr - 85.0) / 13.0
    x[:, 3] = np.maximum(0.0, 75.0 - mbp) / 7.0
    x[:, 4] = np.maximum(0.0, 96.5 - spo2) / 1.5
    x[:, 5] = (rr - 19.0) / 4.0
    x[:, 6] = (temp - 37.0) / 0.5
    x[:, 7] = np.abs(temp - 37.0) / 0.5
    x[:, 8:20] = d["cci"][stay_adm]
    x[:, 20] = S.ADMISSION_TYPE_RISK[atype_s]
    ins_s = d["insurance"][stay_adm]
    x[:, 21] = np.where(ins_s >= 0, S.INSURANCE_RISK[np.maximum(ins_s, 0)], 0.0)
    x[:, 22] = e[:, 7]
    tau = (year_of(d["intime"]) - S.YEAR_CENTER) / S.YEAR_SCALE
    # the drift acts on centred features, so that it changes the model, not the mortality level;
    # the level falls through the intercept drift alone
    w = weights[unit]
    drift = (w * S.drift_factors()[None, :] * (x - x.mean(axis=0))).sum(axis=1)
    d["stay_lin"] = (w * x).sum(axis=1) + tau * drift + S.DRIFT_INTERCEPT * tau


def _admission_risk(stay_lin: np.ndarray, unit: np.ndarray, stay_adm: np.ndarray, n_a: int,
                    b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stay probabilities ``[N]`` and admission noisy-OR probabilities ``[A]`` for intercepts ``b``."""
    p = _sigmoid(b[unit] + stay_lin)
    log_surv = np.bincount(stay_adm, weights=np.log1p(-np.minimum(p, 1 - 1e-12)), minlength=n_a)
    return p, -np.expm1(log_surv)


def calibrate_intercepts(stay_lin: np.ndarray, unit: np.ndarray, stay_adm: np.ndarray, n_a: int,
                         target: np.ndarray, iters: int = 60) -> np.ndarray:
    """Per-unit intercepts ``b [N_UNITS]`` so that the expected mortality of each unit hits ``target``.

    Fixed-point iteration ``b_u += logit(target_u) - logit(E[label | first_careunit = u])``, where
    a stay's expected label is its admission's noisy-OR probability (the units of multi-stay
    admissions couple weakly, so this converges in a few dozen steps). Units without stays keep
    ``logit(target_u)``. Shapes: ``stay_lin``, ``unit``, ``stay_adm`` are ``[N]``.
    """
    b = _logit(target).copy()
    counts = np.bincount(unit, minlength=S.N_UNITS)
    present = counts > 0
    for _ in range(iters):
        _, p_adm = _admission_risk(stay_lin, unit, stay_adm, n_a, b)
        obs = np.bincount(unit, weights=p_adm[stay_adm], minlength=S.N_UNITS)
        obs = np.clip(obs / np.maximum(counts, 1), 1e-6, 1 - 1e-6)
        b[present] += (_logit(target) - _logit(obs))[present]
    return b


# --------------------------------------------------------------------------------------------
# Stage 3: the whole cohort.
# --------------------------------------------------------------------------------------------
def build_cohort(n_stays: int, seed: int, heterogeneity: float = 1.0) -> SynthCohort:
    """Draw a cohort with exactly ``n_stays`` ICU stays (MIMIC-IV v3.1 shape; see module docstring).

    ``seed`` fixes everything. ``heterogeneity``: how far the care units' risk models and base rates
    differ (``S.unit_model``; 0 = shared, 1 = the built-in units). Raises ``ValueError`` if
    ``n_stays < 1`` or the heterogeneity is negative (the CLI validates first).
    """
    if n_stays < 1:
        raise ValueError("n_stays must be >= 1")
    weights, mortality = S.unit_model(heterogeneity)
    factor = 1.12
    for attempt in range(8):
        rng = np.random.default_rng([seed, 1, attempt])
        n_pat = int(np.ceil(n_stays / 1.42 * factor)) + 24
        d = _draw_population(n_pat, rng)
        # ICU stays must start within the shifted years 2110..2200
        last_in = np.zeros(d["adm_pat"].shape[0], dtype=np.int64)
        np.maximum.at(last_in, d["stay_adm"], d["intime"])
        _subset(d, year_of(last_in) <= S.LAST_YEAR)
        _features(d, rng, weights)
        n_a = d["adm_pat"].shape[0]
        b = calibrate_intercepts(d["stay_lin"], d["unit"], d["stay_adm"], n_a, mortality)
        p_stay, p_adm = _admission_risk(d["stay_lin"], d["unit"], d["stay_adm"], n_a, b)
        d["stay_risk"] = p_stay
        d["label"] = (rng.random(n_a) < p_adm).astype(np.int8)
        # death ends the patient's history: drop admissions after the first death
        big = np.iinfo(np.int64).max
        first_death = np.full(n_pat, big, dtype=np.int64)
        died = d["label"] == 1
        np.minimum.at(first_death, d["adm_pat"][died], d["adm_order"][died])
        _subset(d, d["adm_order"] <= first_death[d["adm_pat"]])
        if d["stay_adm"].shape[0] >= n_stays:
            break
        factor *= 1.3
    else:  # pragma: no cover - needs an absurd draw eight times in a row
        raise RuntimeError("could not draw enough ICU stays")
    # keep exactly n_stays stays: whole patients in draw order, the last one cut after a stay
    keep_stay = np.arange(d["stay_adm"].shape[0]) < n_stays
    keep_adm = np.zeros(d["adm_pat"].shape[0], dtype=bool)
    keep_adm[d["stay_adm"][keep_stay]] = True
    _subset(d, keep_adm)
    for k in ("unit", "last_unit", "intime", "outtime", "vital_mu", "severity", "stay_lin", "stay_risk",
              "stay_adm"):
        d[k] = d[k][:n_stays]
    return _finish(d, rng)


def _prior_admissions(rng: np.random.Generator, pat_keep: np.ndarray, first_admit: np.ndarray) -> dict[str, np.ndarray]:
    """Earlier hospital admissions without an ICU stay (survived; carry chronic diagnoses)."""
    n_prior = rng.poisson(0.5, pat_keep.shape[0])
    pat = np.repeat(pat_keep, n_prior)
    gaps = (30 * DAY + rng.exponential(250.0 * DAY, pat.shape[0])).astype(np.int64)
    cum = np.cumsum(gaps)
    back = cum - (cum - gaps)[_group_start(pat)] if pat.size else cum
    length = (np.exp(np.log(3.0 * DAY) + 0.7 * rng.standard_normal(pat.shape[0]))).astype(np.int64) + 6 * HOUR
    length -= length % 60
    admit = first_admit[pat] - back - length
    admit -= admit % 60
    ok = year_of(admit) >= S.FIRST_YEAR
    return dict(pat=pat[ok], admit=admit[ok], length=length[ok])


def _finish(d: dict[str, np.ndarray], rng: np.random.Generator) -> SynthCohort:
    """Times of death and discharge, non-ICU admissions, ids, diagnoses-ready arrays."""
    n_pat_all = int(d["n_pat"])
    used = np.zeros(n_pat_all, dtype=bool)
    used[d["adm_pat"]] = True
    pat_keep = np.flatnonzero(used)
    n_pat = pat_keep.shape[0]
    pat_new = np.full(n_pat_all, -1, dtype=np.int64)
    pat_new[pat_keep] = np.arange(n_pat)

    # --- ICU admissions: discharge and death ---
    stay_adm = d["stay_adm"]
    n_a = d["adm_pat"].shape[0]
    n_s = stay_adm.shape[0]
    last_stay = np.append(np.flatnonzero(np.diff(stay_adm)), n_s - 1)
    last_out = d["outtime"][last_stay]
    died = d["label"] == 1
    in_icu = rng.random(n_a) < 0.7
    after = (rng.uniform(0.3, 6.0, n_a) * DAY).astype(np.int64)
    death = np.where(in_icu, last_out, last_out + after)
    death -= death % 60
    # an in-ICU death ends the stay at the time of death
    outtime = d["outtime"].copy()
    icu_death_stay = last_stay[died & in_icu]
    outtime[icu_death_stay] = death[died & in_icu]
    disch = np.where(died, death, last_out + d["adm_post"])
    disch -= disch % 60
    disch = np.maximum(disch, last_out)
    deathtime = np.where(died, death, -1)
    alive_loc = _pick(rng, np.tile(S.DISCHARGE_ALIVE_P / S.DISCHARGE_ALIVE_P.sum(), (n_a, 1)))
    disch_loc = np.where(died, -1, alive_loc)

    # --- non-ICU earlier admissions ---
    first_admit = np.full(n_pat_all, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_admit, d["adm_pat"], d["admittime"])
    prior = _prior_admissions(rng, pat_keep, first_admit)
    n_pr = prior["pat"].shape[0]
    pr_year = year_of(prior["admit"])
    pr_type = _pick(rng, np.tile(S.UNIT_TYPE_P[0] * 0.5 + S.UNIT_TYPE_P[3] * 0.5, (n_pr, 1)))
    pr_loc = _pick(rng, S.TYPE_LOCATION_P[pr_type])
    pr_age = d["anchor_age"][prior["pat"]] + pr_year - d["anchor_year"][prior["pat"]]
    pr_ins = _pick(rng, np.where((pr_age >= 65)[:, None], S.INSURANCE_P_OLD, S.INSURANCE_P_YOUNG))
    pr_cci = (d["cci_latent"][prior["pat"]] & (rng.random((n_pr, 12)) < 0.6)).astype(np.int8)
    pr_frac = (prior["admit"] - year_start(pr_year)) / (365.25 * DAY)
    pr_icd10 = d["era_year0"][prior["pat"]] + (pr_year - d["anchor_year"][prior["pat"]]) + pr_frac >= 2015.75

    # --- all admissions together, sorted by (patient, admittime) ---
    a_pat = np.concatenate([d["adm_pat"], prior["pat"]])
    a_time = np.concatenate([d["admittime"], prior["admit"]])
    order = np.lexsort((a_time, pat_new[a_pat]))
    remap = np.empty_like(order)
    remap[order] = np.arange(order.shape[0])

    def cat(icu_part: np.ndarray, prior_part: np.ndarray) -> np.ndarray:
        return np.concatenate([icu_part, prior_part])[order]

    n_all = order.shape[0]
    atype = cat(d["admission_type"], pr_type)
    location = cat(d["location"], pr_loc)
    admittime = a_time[order]
    ed = (location == 0) | ((atype == 0) & (rng.random(n_all) < 0.5))
    edreg = admittime - (rng.uniform(1.0, 12.0, n_all) * HOUR).astype(np.int64)
    edreg -= edreg % 60
    edout = admittime + (rng.uniform(0.0, 1.5, n_all) * HOUR).astype(np.int64)
    edout -= edout % 60
    n_prov = 2_000
    alphabet = np.array(list("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    prov_chars = alphabet[rng.integers(0, 36, (n_prov, 5))]
    providers = np.array(["P" + "".join(r) for r in prov_chars])

    # --- ids (MIMIC ranges: subject 1e7.., hadm 2e7.., stay 3e7..) ---
    subject_id = 10_000_000 + np.sort(rng.choice(9_999_999, n_pat, replace=False))
    hadm_id = 20_000_000 + rng.choice(9_999_999, n_all, replace=False)
    stay_id = 30_000_000 + rng.choice(9_999_999, n_s, replace=False)

    pat_of_adm = pat_new[a_pat[order]]
    icu_flag = np.concatenate([np.ones(n_a, dtype=bool), np.zeros(n_pr, dtype=bool)])[order]
    label = cat(d["label"], np.zeros(n_pr, dtype=np.int8))

    # dod: in-hospital death, or for 10 % of survivors a death within a year of the last discharge
    dod = np.full(n_pat, -1, dtype=np.int64)
    dis_all = cat(disch, prior["admit"] + prior["length"])
    death_all = cat(deathtime, np.full(n_pr, -1, dtype=np.int64))
    dead_rows = death_all >= 0
    dod[pat_of_adm[dead_rows]] = death_all[dead_rows]
    last_dis = np.zeros(n_pat, dtype=np.int64)
    np.maximum.at(last_dis, pat_of_adm, dis_all)
    later = (dod < 0) & (rng.random(n_pat) < 0.10)
    dod = np.where(later, last_dis + (rng.uniform(5, 365, n_pat) * DAY).astype(np.int64), dod)

    pk = pat_keep
    return SynthCohort(
        subject_id=subject_id,
        gender_m=d["gender_m"][pk],
        anchor_age=d["anchor_age"][pk],
        anchor_year=d["anchor_year"][pk],
        era=d["era"][pk],
        dod=dod,
        race=d["race"][pk],
        language=d["language"][pk],
        marital=d["marital"][pk],
        adm_pat=pat_of_adm,
        hadm_id=hadm_id,
        admittime=admittime,
        dischtime=dis_all,
        deathtime=death_all,
        admission_type=atype,
        admission_location=location,
        discharge_location=cat(disch_loc, _pick(rng, np.tile(S.DISCHARGE_ALIVE_P / S.DISCHARGE_ALIVE_P.sum(),
                                                             (n_pr, 1)))),
        insurance=cat(d["insurance"], np.where(rng.random(n_pr) < S.INSURANCE_NULL_RATE, -1, pr_ins)),
        edregtime=np.where(ed, edreg, -1),
        edouttime=np.where(ed, edout, -1),
        provider=providers[rng.integers(0, n_prov, n_all)],
        label=label,
        icd10=cat(d["icd10"], pr_icd10),
        cci=np.concatenate([d["cci"], pr_cci])[order],
        icu=icu_flag,
        stay_adm=remap[stay_adm],
        stay_id=stay_id,
        unit=d["unit"],
        last_unit=d["last_unit"],
        intime=d["intime"],
        outtime=outtime,
        vital_mu=d["vital_mu"],
        severity=d["severity"],
        risk=d["stay_risk"],
    )


# --------------------------------------------------------------------------------------------
# Diagnoses.
# --------------------------------------------------------------------------------------------
def _code_vocabulary() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """All pool codes: ``codes [V]`` (str), ``versions [V]``, and per (condition, version) the
    offset and length into the vocabulary (``[12, 2]`` each). Unrelated pools follow the 12."""
    codes: list[str] = []
    versions: list[int] = []
    offset = np.zeros((12, 2), dtype=np.int64)
    length = np.zeros((12, 2), dtype=np.int64)
    for c, pools in enumerate(S.CCI_CODES):
        for v, pool in enumerate(pools):
            offset[c, v], length[c, v] = len(codes), len(pool)
            codes.extend(pool)
            versions.extend([9 + v] * len(pool))
    return np.array(codes), np.array(versions), offset, length


def diagnoses_arrays(c: SynthCohort, seed: int) -> dict[str, np.ndarray]:
    """Rows of ``hosp/diagnoses_icd`` for every admission of the cohort.

    Each admission gets one code (two with 20 % probability, distinct when the pool allows)
    from the pool of each of its Charlson conditions (``SynthCohort.cci``) in its ICD version,
    plus ``1 + Poisson(8)`` distinct unrelated codes; ``seq_num`` is a random order 1..n.
    Returns ``adm`` (admission row), ``code`` (str), ``version`` (9/10), ``seq_num`` arrays,
    sorted by (admission, seq_num). Deterministic in ``seed``.
    """
    rng = np.random.default_rng([seed, 2])
    vocab, vers, offset, length = _code_vocabulary()
    n_cci_codes = vocab.shape[0]
    unrel = (np.array(S.UNRELATED_ICD9), np.array(S.UNRELATED_ICD10))
    vocab = np.concatenate([vocab, unrel[0], unrel[1]])
    vers = np.concatenate([vers, np.full(unrel[0].shape[0], 9), np.full(unrel[1].shape[0], 10)])
    u_off = np.array([n_cci_codes, n_cci_codes + unrel[0].shape[0]])
    u_len = np.array([unrel[0].shape[0], unrel[1].shape[0]])
    v = c.icd10.astype(np.int64)
    adm_c, cond = np.nonzero(c.cci)
    two = rng.random(adm_c.shape[0]) < 0.2
    adm_c = np.concatenate([adm_c, adm_c[two]])
    cond = np.concatenate([cond, cond[two]])
    code_c = offset[cond, v[adm_c]] + rng.integers(0, 1 << 30, adm_c.shape[0]) % length[cond, v[adm_c]]
    n_u = 1 + rng.poisson(8.0, c.hadm_id.shape[0])
    adm_u = np.repeat(np.arange(c.hadm_id.shape[0]), n_u)
    code_u = u_off[v[adm_u]] + rng.integers(0, 1 << 30, adm_u.shape[0]) % u_len[v[adm_u]]
    adm = np.concatenate([adm_c, adm_u])
    code = np.concatenate([code_c, code_u])
    key = np.unique(adm * vocab.shape[0] + code)  # distinct codes per admission
    adm, code = key // vocab.shape[0], key % vocab.shape[0]
    order = np.lexsort((rng.random(adm.shape[0]), adm))
    adm, code = adm[order], code[order]
    seq = np.arange(adm.shape[0]) - _group_start(adm) + 1
    return dict(adm=adm, code=vocab[code], version=vers[code], seq_num=seq)

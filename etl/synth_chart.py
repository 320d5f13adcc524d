"""Synthetic ``icu/chartevents`` rows and the first-24-hour vital-sign ground truth: the second
stage of ``abps synth mimic``. Details: docs/etl.md, "Module notes".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from etl import synth_spec as S

HOUR = 3_600
TEXTS = ("Spontaneously", "To Speech", "To Pain", "None", "SR (Sinus Rhythm)", "ST (Sinus Tachycardia)",
         "AF (Atrial Fibrillation)", "SB (Sinus Bradycardia)", "UTA", "Unable to assess")
UOM = {row[0]: row[5] for row in S.D_ITEMS if row[5] and row[5] != "None"}

# per-unit probability of an arterial line / mechanical ventilation (RR total, FiO2)
_ART_P = np.array([0.35, 0.40, 0.85, 0.55, 0.35, 0.50, 0.20, 0.55, 0.10])
_VENT_P = np.array([0.40, 0.35, 0.50, 0.35, 0.20, 0.35, 0.10, 0.35, 0.05])
_DIRT_RATE, _TEXT_RATE = 0.0025, 0.001
# out-of-range (or boundary) values per vital item, chosen uniformly when a row is dirty
_DIRT = {
    220045: (0.0, 999.0, 300.0, 350.0),
    220179: (0.0, 400.0, 999.0), 220050: (0.0, 400.0, 999.0), 225309: (0.0, 450.0),
    220180: (0.0, 300.0, 999.0), 220051: (0.0, 300.0), 225310: (0.0, 999.0),
    220181: (0.0, 300.0, 999.0), 220052: (0.0, 300.0), 225312: (0.0, 999.0),
    220210: (0.0, 70.0, 99.0), 224690: (0.0, 70.0, 100.0),
    220277: (0.0, 101.0, 150.0, 127.0),
    223761: (0.0, 120.0),   # plus the Celsius value written under the Fahrenheit item
    223762: (50.0, 10.0),   # plus the Fahrenheit value written under the Celsius item
}


@dataclass
class StayChunk:
    """The stays of one chunk, aligned arrays of length ``n``.

    ``intime``/``outtime`` int64 seconds; ``unit`` care-unit index; ``vital_mu [n, 7]`` latent
    HR, SBP, DBP, MBP, RR, SpO2, temperature (Celsius); ``severity [n]``; ids int64.
    """

    subject_id: np.ndarray
    hadm_id: np.ndarray
    stay_id: np.ndarray
    unit: np.ndarray
    intime: np.ndarray
    outtime: np.ndarray
    vital_mu: np.ndarray
    severity: np.ndarray


@dataclass
class ChartRows:
    """Chart rows of a chunk as arrays of length ``R`` (before formatting).

    ``stay`` index into the chunk, ``t`` charttime seconds, ``itemid``, ``value`` (float64, NaN
    when there is no valuenum), ``decimals`` (0 or 1: how the number is written), ``text``
    (index into ``TEXTS`` or -1: the text written in ``value``), ``warning``, ``caregiver``,
    ``storetime``. Sorted by (stay, t, itemid).
    """

    stay: np.ndarray
    t: np.ndarray
    itemid: np.ndarray
    value: np.ndarray
    decimals: np.ndarray
    text: np.ndarray
    warning: np.ndarray
    caregiver: np.ndarray
    storetime: np.ndarray


def _round(x: np.ndarray, decimals: int) -> np.ndarray:
    """Round to the written precision: the nearest double to k / 10**decimals."""
    if decimals == 0:
        return np.rint(x)
    return np.rint(x * 10.0) / 10.0


def chart_rows(st: StayChunk, rng: np.random.Generator, step_s: int,
               extra_hours: tuple[float, float] = (20.0, 48.0)) -> ChartRows:
    """Draw the chartevents rows of one chunk of stays (see module docstring).

    ``step_s`` is the charting interval in seconds (3600 by default; a multiple of 60).
    Returns :class:`ChartRows`. Raises nothing for valid input.
    """
    n = st.intime.shape[0]
    charted = rng.random(n) >= 0.003
    lead_h = rng.integers(0, 4, n)
    extra = rng.uniform(extra_hours[0], extra_hours[1], n)
    tail = (rng.uniform(0.0, 1.5, n) * HOUR).astype(np.int64)
    g0 = st.intime - st.intime % 60 - lead_h * HOUR
    end = np.minimum(st.outtime + tail, st.intime + ((24.0 + extra) * HOUR).astype(np.int64))
    k_n = np.where(charted, (end - g0) // step_s + 1, 0)
    k_n = np.maximum(k_n, np.where(charted, 1, 0))
    sidx = np.repeat(np.arange(n), k_n)
    starts = np.cumsum(k_n) - k_n
    k = np.arange(sidx.shape[0]) - starts[sidx]
    tg = g0[sidx] + k * step_s
    p_n = tg.shape[0]
    h = (tg - st.intime[sidx]) / HOUR

    art = rng.random(n) < np.clip(_ART_P[st.unit] + 0.1 * st.severity, 0.0, 1.0)
    art_new = rng.random(n) < 0.07          # ART BP 2253xx items instead of 22005x
    vent = rng.random(n) < np.clip(_VENT_P[st.unit] + 0.1 * st.severity, 0.0, 1.0)
    celsius = rng.random(n) < 0.08          # temperature mostly charted in Celsius
    missing = rng.random((n, 5)) < np.array([0.004, 0.007, 0.007, 0.01, 0.025])  # HR BP RR SpO2 T
    period = rng.uniform(8.0, 30.0, n)
    phase = rng.uniform(0.0, 2 * np.pi, (n, 5))
    per4 = max(1, int(round(4 * HOUR / step_s)))
    per12 = max(1, int(round(12 * HOUR / step_s)))
    t_phase = rng.integers(0, per4, n)

    def osc(j: int, amp: float) -> np.ndarray:
        return amp * np.sin(2 * np.pi * h / period[sidx] + phase[sidx, j])

    mu = st.vital_mu[sidx]
    hr = mu[:, 0] + osc(0, 6.0) + 5.0 * rng.standard_normal(p_n)
    mbp = mu[:, 3] + osc(1, 6.0) + 5.0 * rng.standard_normal(p_n)
    pp = (mu[:, 1] - mu[:, 2]) + 4.0 * rng.standard_normal(p_n)
    sbp, dbp = mbp + 2 * pp / 3, mbp - pp / 3
    rr = mu[:, 4] + osc(2, 2.0) + 2.5 * rng.standard_normal(p_n)
    spo2 = mu[:, 5] + osc(3, 0.8) + 1.2 * rng.standard_normal(p_n)
    temp = mu[:, 6] + osc(4, 0.3) + 0.25 * rng.standard_normal(p_n)

    parts: list[tuple[np.ndarray, ...]] = []

    def jitter(m: np.ndarray) -> np.ndarray:
        j = np.where(rng.random(m.shape[0]) < 0.6, 0, rng.integers(-25, 26, m.shape[0]))
        return tg[m] + 60 * j

    def add(m: np.ndarray, t: np.ndarray, item: int, v: np.ndarray, dec: int,
            text: np.ndarray | None = None) -> None:
        cnt = m.shape[0]
        parts.append((sidx[m], t, np.full(cnt, item, dtype=np.int32), v.astype(np.float64),
                      np.full(cnt, dec, dtype=np.int8),
                      np.full(cnt, -1, dtype=np.int16) if text is None else text.astype(np.int16)))

    u = rng.random((p_n, 8))
    s_art, s_vent, s_cel = art[sidx], vent[sidx], celsius[sidx]
    miss = missing[sidx]
    # heart rate
    m = np.flatnonzero((u[:, 0] < 0.96) & ~miss[:, 0])
    add(m, jitter(m), 220045, _round(np.clip(hr[m], 25, 220), 0), 0)
    # blood pressure: non-invasive (and arterial when there is a line; same charttime half the time)
    bp_ok = ~miss[:, 1]
    m_nibp = np.flatnonzero(bp_ok & np.where(s_art, u[:, 1] < 0.25, u[:, 1] < 0.92))
    t_nibp = jitter(m_nibp)
    for item, arr, lo, hi in ((220179, sbp, 50, 250), (220180, dbp, 15, 150), (220181, mbp, 25, 180)):
        add(m_nibp, t_nibp, item, _round(np.clip(arr[m_nibp] + 3.0 * rng.standard_normal(m_nibp.shape[0]),
                                                 lo, hi), 0), 0)
    m_art = np.flatnonzero(bp_ok & s_art & (u[:, 2] < 0.93))
    t_art = jitter(m_art)
    t_art = np.where(rng.random(m_art.shape[0]) < 0.5, tg[m_art], t_art)
    new = art_new[sidx[m_art]]
    for (old_item, new_item), arr, off, lo, hi in (((220050, 225309), sbp, 4.0, 50, 260),
                                                   ((220051, 225310), dbp, -2.0, 15, 150),
                                                   ((220052, 225312), mbp, 1.0, 25, 190)):
        v = _round(np.clip(arr[m_art] + off + 2.5 * rng.standard_normal(m_art.shape[0]), lo, hi), 0)
        add(m_art[~new], t_art[~new], old_item, v[~new], 0)
        add(m_art[new], t_art[new], new_item, v[new], 0)
    # respiratory rate (RR; RR total when ventilated)
    rr_ok = ~miss[:, 2]
    m = np.flatnonzero(rr_ok & (u[:, 3] < 0.93))
    add(m, jitter(m), 220210, _round(np.clip(rr[m], 4, 60), 0), 0)
    m = np.flatnonzero(rr_ok & s_vent & (u[:, 4] < 0.7))
    add(m, tg[m], 224690, _round(np.clip(rr[m] + 1.0, 4, 60), 0), 0)
    # SpO2
    m = np.flatnonzero(~miss[:, 3] & (u[:, 5] < 0.95))
    add(m, jitter(m), 220277, _round(np.clip(spo2[m], 60, 100), 0), 0)
    # temperature every ~4 h: Fahrenheit for most stays, Celsius for some, sometimes both
    t_pt = ~miss[:, 4] & (k % per4 == t_phase[sidx]) & (u[:, 6] < 0.9)
    both = u[:, 7] < 0.05
    c_val = _round(np.clip(temp, 32.0, 42.0), 1)
    f_val = _round(np.clip(temp, 32.0, 42.0) * 1.8 + 32.0, 1)
    m_t = np.flatnonzero(t_pt)
    t_t = jitter(m_t)
    f_rows = ~s_cel[m_t] | both[m_t]
    c_rows = s_cel[m_t] | both[m_t]
    add(m_t[f_rows], t_t[f_rows], 223761, f_val[m_t[f_rows]], 1)
    add(m_t[c_rows], t_t[c_rows], 223762, c_val[m_t[c_rows]], 1)

    # items the ETL must ignore
    m = np.flatnonzero(k % per4 == (t_phase[sidx] + 1) % per4)
    gcs = np.minimum(rng.integers(0, 6, m.shape[0]), 3)      # mostly "Spontaneously"
    gcs = np.where(rng.random(m.shape[0]) < 0.6, 0, gcs)
    add(m, tg[m], 220739, 4.0 - gcs, 0, gcs)
    rhythm = 4 + np.minimum(rng.integers(0, 8, m.shape[0]), 3)
    add(m, tg[m], 220048, np.full(m.shape[0], np.nan), 0, rhythm)
    m = np.flatnonzero(k % per12 == 0)
    add(m, tg[m], 220046, 100.0 + 10.0 * rng.integers(2, 6, m.shape[0]), 0)
    add(m, tg[m], 220047, 40.0 + 10.0 * rng.integers(0, 3, m.shape[0]), 0)
    m = np.flatnonzero(s_vent & (k % per4 == t_phase[sidx]))
    add(m, tg[m], 223835, 5.0 * rng.integers(6, 21, m.shape[0]), 0)
    # stray rows far outside the stay (0.5 % of stays): a heart rate days before intime
    stray = np.flatnonzero(charted & (rng.random(n) < 0.005))
    t_stray = st.intime[stray] - (rng.uniform(12, 72, stray.shape[0]) * HOUR).astype(np.int64)
    t_stray -= t_stray % 60
    parts.append((stray, t_stray, np.full(stray.shape[0], 220045, dtype=np.int32),
                  _round(st.vital_mu[stray, 0], 0), np.zeros(stray.shape[0], dtype=np.int8),
                  np.full(stray.shape[0], -1, dtype=np.int16)))

    stay, t, itemid, value, dec, text = (np.concatenate(x) for x in zip(*parts))
    r_n = stay.shape[0]
    warning = np.zeros(r_n, dtype=np.int8)
    # dirt: out-of-range values on vital items
    is_vital = np.isin(itemid, np.array(list(S.VITAL_ITEMS), dtype=np.int32))
    dirty = np.flatnonzero(is_vital & (rng.random(r_n) < _DIRT_RATE))
    for item, choices in _DIRT.items():
        rows = dirty[itemid[dirty] == item]
        if rows.size == 0:
            continue
        opts = np.array(choices)
        pick = rng.integers(0, opts.shape[0] + (1 if item in (223761, 223762) else 0), rows.shape[0])
        new_v = opts[np.minimum(pick, opts.shape[0] - 1)]
        if item == 223761:    # Celsius reading under the Fahrenheit item
            new_v = np.where(pick == opts.shape[0], _round((value[rows] - 32.0) / 1.8, 1), new_v)
        elif item == 223762:  # Fahrenheit reading under the Celsius item
            new_v = np.where(pick == opts.shape[0], _round(value[rows] * 1.8 + 32.0, 1), new_v)
        value[rows] = new_v
    warning[dirty] = rng.random(dirty.shape[0]) < 0.5
    # text values without valuenum
    txt = np.flatnonzero(is_vital & (rng.random(r_n) < _TEXT_RATE))
    value[txt] = np.nan
    text[txt] = 8 + rng.integers(0, 2, txt.shape[0])

    order = np.lexsort((itemid, t, stay))
    stay, t, itemid, value, dec, text, warning = (a[order] for a in (stay, t, itemid, value, dec, text, warning))
    caregivers = rng.integers(10_000, 100_000, (n, 3))
    shift = ((t - g0[stay]) // (8 * HOUR)) % 3
    storetime = t + 60 * rng.integers(1, 60, r_n) + rng.integers(0, 60, r_n)
    return ChartRows(stay=stay, t=t, itemid=itemid, value=value, decimals=dec, text=text, warning=warning,
                     caregiver=caregivers[stay, shift], storetime=storetime)


def vital_truth(rows: ChartRows, intime: np.ndarray,
                window_hours: float = S.TRUTH_WINDOW_HOURS) -> np.ndarray:
    """First-24 h vital aggregates of a chunk, from the generator's own arrays.

    For each stay (``intime [n]``, seconds) and vital of ``synth_spec.VITALS``: keep rows with a
    valuenum, ``intime <= t <= intime + window`` and a valid value (``synth_spec.VITAL_ITEMS``;
    223761 converted to Celsius); average values that share (stay, vital, charttime); then take
    mean, min and max per (stay, vital). Returns ``[n, 7, 3]`` float64 (mean, min, max), NaN where
    the stay has no valid value of that vital. Deterministic (sorted reductions).
    """
    n = intime.shape[0]
    out = np.full((n, len(S.VITALS), 3), np.nan)
    lut_v = np.full(10_000, -1, dtype=np.int64)
    lut_lo = np.zeros(10_000)
    lut_hi = np.zeros(10_000)
    lut_inc = np.zeros(10_000, dtype=bool)
    lut_f = np.zeros(10_000, dtype=bool)
    for item, (vi, lo, hi, inc, fahr) in S.VITAL_ITEMS.items():
        j = item - 220_000
        lut_v[j], lut_lo[j], lut_hi[j], lut_inc[j], lut_f[j] = vi, lo, hi, inc, fahr
    j = rows.itemid.astype(np.int64) - 220_000
    j = np.where((j >= 0) & (j < 10_000), j, 0)
    vi = np.where((rows.itemid >= 220_000) & (rows.itemid < 230_000), lut_v[j], -1)
    v = rows.value
    valid = (vi >= 0) & ~np.isnan(v) & (v > lut_lo[j]) & np.where(lut_inc[j], v <= lut_hi[j], v < lut_hi[j])
    t0 = intime[rows.stay]
    valid &= (rows.t >= t0) & (rows.t <= t0 + int(round(window_hours * HOUR)))
    idx = np.flatnonzero(valid)
    s, vv, t = rows.stay[idx], vi[idx], rows.t[idx]
    x = np.where(lut_f[j[idx]], (v[idx] - 32.0) / 1.8, v[idx])
    if idx.size == 0:
        return out
    order = np.lexsort((t, vv, s))
    s, vv, t, x = s[order], vv[order], t[order], x[order]
    new_t = np.ones(s.shape[0], dtype=bool)
    new_t[1:] = (s[1:] != s[:-1]) | (vv[1:] != vv[:-1]) | (t[1:] != t[:-1])
    starts = np.flatnonzero(new_t)
    cnt = np.diff(np.append(starts, s.shape[0]))
    per_t = np.add.reduceat(x, starts) / cnt
    s2, v2 = s[starts], vv[starts]
    new_g = np.ones(s2.shape[0], dtype=bool)
    new_g[1:] = (s2[1:] != s2[:-1]) | (v2[1:] != v2[:-1])
    g = np.flatnonzero(new_g)
    g_cnt = np.diff(np.append(g, s2.shape[0]))
    out[s2[g], v2[g], 0] = np.add.reduceat(per_t, g) / g_cnt
    out[s2[g], v2[g], 1] = np.minimum.reduceat(per_t, g)
    out[s2[g], v2[g], 2] = np.maximum.reduceat(per_t, g)
    return out


def chart_frame(rows: ChartRows, st: StayChunk) -> pl.DataFrame:
    """Format chart rows as the ``icu/chartevents`` table (MIMIC-IV columns and text forms).

    ``value`` holds the text (numbers as written: integers without decimals, temperatures with
    one decimal; text items their label), ``valuenum`` the same number or null, ``valueuom`` the
    item's unit (null for text items), times as datetimes (written ``YYYY-MM-DD HH:MM:SS``).
    """
    text_map = {i: s for i, s in enumerate(TEXTS)}
    df = pl.DataFrame({
        "subject_id": st.subject_id[rows.stay],
        "hadm_id": st.hadm_id[rows.stay],
        "stay_id": st.stay_id[rows.stay],
        "caregiver_id": rows.caregiver,
        "charttime": rows.t,
        "storetime": rows.storetime,
        "itemid": rows.itemid,
        "v": rows.value,
        "dec": rows.decimals,
        "text": rows.text,
        "warning": rows.warning,
    })
    v = pl.col("v").fill_nan(None)
    num = pl.when(pl.col("dec") == 0).then(v.cast(pl.Int64).cast(pl.String)).otherwise(v.cast(pl.String))
    return df.select(
        "subject_id", "hadm_id", "stay_id", "caregiver_id",
        pl.from_epoch("charttime", time_unit="s"),
        pl.from_epoch("storetime", time_unit="s"),
        "itemid",
        pl.when(pl.col("text") >= 0)
        .then(pl.col("text").replace_strict(text_map, default=None, return_dtype=pl.String))
        .otherwise(num).alias("value"),
        num.alias("valuenum"),
        pl.col("itemid").replace_strict(UOM, default=None, return_dtype=pl.String).alias("valueuom"),
        "warning",
    )

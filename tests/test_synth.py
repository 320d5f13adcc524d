"""Tests of `abps synth mimic` (etl.synth): format, ground truth, reproducibility, shape, CLI.

The ground truth is checked against independent recomputations over the written CSV files:
DuckDB SQL for the first-24 h vitals, a Quan (2005) prefix table typed here for the Charlson
flags, and the MIMIC age formula for age.
"""

from __future__ import annotations

import gzip
import hashlib
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import cross_val_predict

from etl import synth_spec as S
from etl.errors import InputError
from etl.synth import MANIFEST, SynthConfig, synth_mimic
from etl.synth_cohort import build_cohort, year_of

REPO = Path(__file__).resolve().parents[1]
TABLES = ("hosp/patients", "hosp/admissions", "hosp/diagnoses_icd", "icu/icustays", "icu/chartevents",
          "icu/d_items")
SIX = ("MICU", "MICU/SICU", "CVICU", "SICU", "CCU", "TSICU")


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "mimic"
    summary = synth_mimic(out, SynthConfig(stays=2000, seed=5))
    assert summary.stays == 2000
    return out


def _csv(d: Path, table: str) -> str:
    return f"'{d / (table + '.csv.gz')}'"


def _header(path: Path) -> str:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return fh.readline().rstrip("\n")


# ------------------------------------------------------------------------------------------
# Format
# ------------------------------------------------------------------------------------------
def test_headers_equal_the_real_demo(small: Path, mimic_demo_dir: Path) -> None:
    for table in TABLES:
        assert _header(small / f"{table}.csv.gz") == _header(mimic_demo_dir / f"{table}.csv.gz"), table


def test_value_formats_and_categories(small: Path) -> None:
    con = duckdb.connect()
    ts = r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$"
    bad_ts = con.execute(f"""SELECT count(*) FROM read_csv({_csv(small, 'hosp/admissions')}, all_varchar=true)
        WHERE NOT regexp_matches(admittime, '{ts}') OR NOT regexp_matches(dischtime, '{ts}')
           OR (deathtime IS NOT NULL AND NOT regexp_matches(deathtime, '{ts}'))""").fetchone()[0]
    assert bad_ts == 0
    units = {r[0] for r in con.execute(f"SELECT DISTINCT first_careunit FROM read_csv({_csv(small, 'icu/icustays')})").fetchall()}
    assert units <= set(S.UNIT_NAMES) and {"Medical Intensive Care Unit (MICU)", "Trauma SICU (TSICU)"} <= units
    ins = {r[0] for r in con.execute(f"SELECT DISTINCT insurance FROM read_csv({_csv(small, 'hosp/admissions')})").fetchall()}
    assert ins - {None} == {"Medicare", "Medicaid", "Private", "Self-pay", "No charge", "Other"}
    eras = {r[0] for r in con.execute(f"SELECT DISTINCT anchor_year_group FROM read_csv({_csv(small, 'hosp/patients')})").fetchall()}
    assert eras == set(S.ERAS)
    years = con.execute(f"SELECT min(year(intime)), max(year(intime)) FROM read_csv({_csv(small, 'icu/icustays')})").fetchone()
    assert S.FIRST_YEAR <= years[0] and years[1] <= S.LAST_YEAR
    # ICD codes carry no dots; both versions present, ICD-9 with older eras
    dx = con.execute(f"""SELECT icd_version, count(*), sum(CASE WHEN contains(icd_code, '.') THEN 1 ELSE 0 END)
        FROM read_csv({_csv(small, 'hosp/diagnoses_icd')}, types={{'icd_code': 'VARCHAR'}}) GROUP BY 1 ORDER BY 1""").fetchall()
    assert [r[0] for r in dx] == [9, 10] and all(r[1] > 1000 and r[2] == 0 for r in dx)
    era_icd9 = con.execute(f"""SELECT p.anchor_year_group, avg(CASE WHEN d.icd_version = 9 THEN 1.0 ELSE 0 END)
        FROM read_csv({_csv(small, 'hosp/diagnoses_icd')}, types={{'icd_code': 'VARCHAR'}}) d
        JOIN read_csv({_csv(small, 'hosp/patients')}) p USING (subject_id) GROUP BY 1 ORDER BY 1""").fetchall()
    assert era_icd9[0][1] > 0.9 and era_icd9[-1][1] < 0.1
    # timeline: stays inside their admission, deathtime set exactly when the flag is 1
    bad = con.execute(f"""SELECT count(*) FROM read_csv({_csv(small, 'icu/icustays')}) s
        JOIN read_csv({_csv(small, 'hosp/admissions')}) a USING (hadm_id)
        WHERE s.intime < a.admittime OR s.outtime > a.dischtime OR s.outtime <= s.intime""").fetchone()[0]
    assert bad == 0
    flags = con.execute(f"""SELECT count(*) FROM read_csv({_csv(small, 'hosp/admissions')})
        WHERE (hospital_expire_flag = 1) != (deathtime IS NOT NULL)
           OR (hospital_expire_flag = 1) != (discharge_location = 'DIED')""").fetchone()[0]
    assert flags == 0


def test_chartevents_dirt_is_present(small: Path) -> None:
    con = duckdb.connect()
    ce = f"read_csv({_csv(small, 'icu/chartevents')}, types={{'value': 'VARCHAR', 'valuenum': 'DOUBLE'}})"
    row = con.execute(f"""SELECT
        count(*) FILTER (WHERE itemid = 220045 AND (valuenum <= 0 OR valuenum >= 300)),
        count(*) FILTER (WHERE itemid = 220277 AND valuenum > 100),
        count(*) FILTER (WHERE itemid = 223761 AND valuenum < 70),
        count(*) FILTER (WHERE itemid IN (220045, 220179, 220210, 220277) AND valuenum IS NULL AND value IS NOT NULL),
        count(*) FILTER (WHERE itemid IN (220046, 220047, 220739, 223835)),
        count(DISTINCT itemid)
        FROM {ce}""").fetchone()
    assert row[0] > 0 and row[1] > 0 and row[2] > 0 and row[3] > 0 and row[4] > 0 and row[5] >= 18
    # stays with no chart row at all, stays without temperature, rows before intime and at intime + 24 h exactly
    row = con.execute(f"""WITH s AS (SELECT stay_id, intime, outtime FROM read_csv({_csv(small, 'icu/icustays')})),
        c AS (SELECT * FROM {ce})
        SELECT
          (SELECT count(*) FROM s WHERE stay_id NOT IN (SELECT stay_id FROM c)),
          (SELECT count(*) FROM s WHERE stay_id NOT IN (SELECT stay_id FROM c WHERE itemid IN (223761, 223762))),
          (SELECT count(*) FROM c JOIN s USING (stay_id) WHERE c.charttime < s.intime - INTERVAL 6 HOUR),
          (SELECT count(*) FROM c JOIN s USING (stay_id) WHERE c.charttime = s.intime + INTERVAL 24 HOUR),
          (SELECT count(*) FROM c JOIN s USING (stay_id) WHERE c.charttime > s.outtime)""").fetchone()
    assert all(x > 0 for x in row), row


# ------------------------------------------------------------------------------------------
# Ground truth against independent recomputations from the files
# ------------------------------------------------------------------------------------------
VITAL_SQL = """
WITH s AS (SELECT stay_id, intime FROM read_csv({stays})),
c AS (SELECT stay_id, charttime, itemid, valuenum
      FROM read_csv({chart}, types={{'value': 'VARCHAR', 'valuenum': 'DOUBLE', 'charttime': 'TIMESTAMP'}})
      WHERE valuenum IS NOT NULL),
v AS (
  SELECT c.stay_id, c.charttime,
    CASE
      WHEN itemid = 220045 AND valuenum > 0 AND valuenum < 300 THEN 'heart_rate'
      WHEN itemid IN (220179, 220050, 225309) AND valuenum > 0 AND valuenum < 400 THEN 'sbp'
      WHEN itemid IN (220180, 220051, 225310) AND valuenum > 0 AND valuenum < 300 THEN 'dbp'
      WHEN itemid IN (220181, 220052, 225312) AND valuenum > 0 AND valuenum < 300 THEN 'mbp'
      WHEN itemid IN (220210, 224690) AND valuenum > 0 AND valuenum < 70 THEN 'resp_rate'
      WHEN itemid = 220277 AND valuenum > 0 AND valuenum <= 100 THEN 'spo2'
      WHEN itemid = 223761 AND valuenum > 70 AND valuenum < 120 THEN 'temperature'
      WHEN itemid = 223762 AND valuenum > 10 AND valuenum < 50 THEN 'temperature'
    END AS vital,
    CASE WHEN itemid = 223761 THEN (valuenum - 32) / 1.8 ELSE valuenum END AS x
  FROM c JOIN s ON c.stay_id = s.stay_id
  WHERE c.charttime >= s.intime AND c.charttime <= s.intime + INTERVAL 24 HOUR),
t AS (SELECT stay_id, vital, charttime, avg(x) AS x FROM v WHERE vital IS NOT NULL GROUP BY ALL)
SELECT stay_id, vital, avg(x) AS mean, min(x) AS min, max(x) AS max FROM t GROUP BY ALL
"""


def test_ground_truth_vitals_equal_duckdb_recomputation(small: Path) -> None:
    sql = VITAL_SQL.format(stays=_csv(small, "icu/icustays"), chart=_csv(small, "icu/chartevents"))
    got = duckdb.sql(sql).pl()
    assert got.height > 2000 * 6
    wide = got.pivot(on="vital", index="stay_id", values=["mean", "min", "max"])
    truth = pl.read_parquet(small / "ground_truth.parquet")
    joined = truth.join(wide, on="stay_id", how="left")
    n_compared = 0
    for vital in S.VITALS:
        for stat in ("mean", "min", "max"):
            want = joined[f"{vital}_{stat}"].to_numpy().astype(float)
            sql_col = f"{stat}_{vital}"
            have = joined[sql_col].to_numpy().astype(float) if sql_col in joined.columns else np.full(len(want), np.nan)
            assert np.array_equal(np.isnan(want), np.isnan(have)), (vital, stat)
            ok = ~np.isnan(want)
            np.testing.assert_allclose(have[ok], want[ok], rtol=1e-12, atol=1e-9)
            n_compared += int(ok.sum())
    assert n_compared > 2000 * 21 * 0.9
    # some stays really lack a vital, and temperatures are in Celsius
    assert truth["temperature_mean"].null_count() > 0
    assert 35.0 < truth["temperature_mean"].mean() < 38.5


# Quan et al. (2005) Table 1, enhanced ICD-9-CM and ICD-10 columns, as prefix ranges (lo, hi):
# a code matches when its prefix of len(lo) lies in [lo, hi].
QUAN = {
    "cci_chf": ([("39891", "39891"), ("40201", "40201"), ("40211", "40211"), ("40291", "40291"), ("40401", "40401"),
                 ("40403", "40403"), ("40411", "40411"), ("40413", "40413"), ("40491", "40491"), ("40493", "40493"),
                 ("4254", "4259"), ("428", "428")],
                [("I099", "I099"), ("I110", "I110"), ("I130", "I130"), ("I132", "I132"), ("I255", "I255"),
                 ("I420", "I420"), ("I425", "I429"), ("I43", "I43"), ("I50", "I50"), ("P290", "P290")]),
    "cci_dementia": ([("290", "290"), ("2941", "2941"), ("3312", "3312")],
                     [("F00", "F03"), ("F051", "F051"), ("G30", "G30"), ("G311", "G311")]),
    "cci_chronic_pulmonary": ([("4168", "4169"), ("490", "505"), ("5064", "5064"), ("5081", "5081"), ("5088", "5088")],
                              [("I278", "I279"), ("J40", "J47"), ("J60", "J67"), ("J684", "J684"), ("J701", "J701"),
                               ("J703", "J703")]),
    "cci_rheumatic": ([("4465", "4465"), ("7100", "7104"), ("7140", "7142"), ("7148", "7148"), ("725", "725")],
                      [("M05", "M06"), ("M315", "M315"), ("M32", "M34"), ("M351", "M351"), ("M353", "M353"),
                       ("M360", "M360")]),
    "cci_mild_liver": ([("07022", "07023"), ("07032", "07033"), ("07044", "07044"), ("07054", "07054"),
                        ("0706", "0706"), ("0709", "0709"), ("570", "571"), ("5733", "5734"), ("5738", "5739"),
                        ("V427", "V427")],
                       [("B18", "B18"), ("K700", "K703"), ("K709", "K709"), ("K713", "K715"), ("K717", "K717"),
                        ("K73", "K74"), ("K760", "K760"), ("K762", "K764"), ("K768", "K769"), ("Z944", "Z944")]),
    "cci_diabetes_complicated": ([("2504", "2507")],
                                 [(f"E1{d}{k}", f"E1{d}{k}") for d in "01234" for k in "23457"]),
    "cci_paraplegia": ([("3341", "3341"), ("342", "343"), ("3440", "3446"), ("3449", "3449")],
                       [("G041", "G041"), ("G114", "G114"), ("G801", "G802"), ("G81", "G82"), ("G830", "G834"),
                        ("G839", "G839")]),
    "cci_renal": ([("40301", "40301"), ("40311", "40311"), ("40391", "40391"), ("40402", "40403"), ("40412", "40413"),
                   ("40492", "40493"), ("582", "582"), ("5830", "5837"), ("585", "586"), ("5880", "5880"),
                   ("V420", "V420"), ("V451", "V451"), ("V56", "V56")],
                  [("I120", "I120"), ("I131", "I131"), ("N032", "N037"), ("N052", "N057"), ("N18", "N19"),
                   ("N250", "N250"), ("Z490", "Z492"), ("Z940", "Z940"), ("Z992", "Z992")]),
    "cci_malignancy": ([("140", "172"), ("174", "194"), ("1950", "1958"), ("200", "208"), ("2386", "2386")],
                       [("C00", "C26"), ("C30", "C34"), ("C37", "C41"), ("C43", "C43"), ("C45", "C58"), ("C60", "C76"),
                        ("C81", "C85"), ("C88", "C88"), ("C90", "C97")]),
    "cci_severe_liver": ([("4560", "4562"), ("5722", "5728")],
                         [("I850", "I850"), ("I859", "I859"), ("I864", "I864"), ("I982", "I982"), ("K704", "K704"),
                          ("K711", "K711"), ("K721", "K721"), ("K729", "K729"), ("K765", "K767")]),
    "cci_metastatic": ([("196", "199")], [("C77", "C80")]),
    "cci_aids": ([("042", "044")], [("B20", "B22"), ("B24", "B24")]),
}


def _quan_flags(code: str, version: int) -> set[str]:
    out = set()
    for name, (icd9, icd10) in QUAN.items():
        for lo, hi in (icd9 if version == 9 else icd10):
            if lo <= code[: len(lo)] <= hi:
                out.add(name)
    return out


def test_ground_truth_charlson_age_label_match_the_tables(small: Path) -> None:
    dx = pl.read_csv(small / "hosp/diagnoses_icd.csv.gz", schema_overrides={"icd_code": pl.String})
    flags: dict[int, set[str]] = {}
    n_hits = 0
    for hadm, code, version in dx.select("hadm_id", "icd_code", "icd_version").iter_rows():
        hit = _quan_flags(code, version)
        assert len(hit) <= 1, code  # every pool code lies in a single condition
        n_hits += len(hit)
        flags.setdefault(hadm, set()).update(hit)
    truth = pl.read_parquet(small / "ground_truth.parquet")
    assert n_hits > 1000
    for row in truth.select("hadm_id", *S.CCI_COLUMNS).iter_rows(named=True):
        want = {c for c in S.CCI_COLUMNS if row[c] == 1}
        assert flags.get(row["hadm_id"], set()) == want
    prevalence = truth.select(pl.col(S.CCI_COLUMNS).mean()).row(0)
    assert all(p > 0 for p in prevalence[:-1]) and 0.15 < prevalence[0] < 0.35  # CHF around a quarter

    con = duckdb.connect()
    check = con.sql(f"""SELECT s.stay_id, p.anchor_age + year(a.admittime) - p.anchor_year AS age,
            a.hospital_expire_flag AS label, s.first_careunit, year(s.intime) AS intime_year
        FROM read_csv({_csv(small, 'icu/icustays')}) s
        JOIN read_csv({_csv(small, 'hosp/admissions')}) a USING (hadm_id)
        JOIN read_csv({_csv(small, 'hosp/patients')}) p ON p.subject_id = s.subject_id""").pl()
    j = truth.join(check, on="stay_id", suffix="_sql")
    assert j.height == truth.height == 2000
    assert (j["age"] == j["age_sql"].cast(pl.Float64)).all()
    assert (j["label"].cast(pl.Int64) == j["label_sql"]).all()
    assert (j["first_careunit"] == j["first_careunit_sql"]).all()
    assert (j["intime_year"].cast(pl.Int64) == j["intime_year_sql"]).all()


def test_mortality_is_learnable_from_the_first_24_hours(small: Path) -> None:
    """A logistic regression on age, vitals, Charlson flags and unit reaches a clinical AUROC."""
    truth = pl.read_parquet(small / "ground_truth.parquet")
    vitals = [f"{v}_{s}" for v in S.VITALS for s in ("mean", "min", "max")]
    x = truth.select("age", *vitals).to_numpy().astype(float)
    x = np.where(np.isnan(x), np.nanmedian(x, axis=0), x)
    x = (x - x.mean(0)) / x.std(0)
    units = truth["care_unit"].to_dummies().to_numpy()
    feats = np.hstack([x, truth.select(S.CCI_COLUMNS).to_numpy(), units])
    y = truth["label"].to_numpy()
    p = cross_val_predict(LogisticRegression(max_iter=2000, C=0.3), feats, y, cv=5, method="predict_proba")[:, 1]
    auroc = roc_auc_score(y, p)
    assert 0.72 < auroc < 0.92, auroc
    assert roc_auc_score(y, truth["risk"].to_numpy()) > auroc - 0.02  # the model's own risk is the ceiling


# ------------------------------------------------------------------------------------------
# Reproducibility
# ------------------------------------------------------------------------------------------
def _digests(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a = _digests_of(tmp_path / "a", 7)
    b = _digests_of(tmp_path / "b", 7)
    c = _digests_of(tmp_path / "c", 8)
    assert len(a) == 8 and a == b
    assert a["icu/chartevents.csv.gz"] != c["icu/chartevents.csv.gz"]


def _digests_of(out: Path, seed: int) -> dict[str, str]:
    synth_mimic(out, SynthConfig(stays=300, seed=seed, chunk_stays=128))
    return _digests(out)


#: SHA-256 (16 hex digits) of the decompressed text files of the default output at 300 stays, seed 7,
#: as written before the --heterogeneity option existed: the default stays byte-identical
DEFAULT_TEXT_DIGESTS = {
    "hosp/admissions.csv.gz": "01d47e0a283a05fb", "hosp/diagnoses_icd.csv.gz": "41ab91197bf5f1f3",
    "hosp/patients.csv.gz": "14bd239ed7bfbf53", "icu/chartevents.csv.gz": "6415dd9040381ba4",
    "icu/d_items.csv.gz": "c588c8a7c484d03c", "icu/icustays.csv.gz": "db3a8f892e995ffa",
    "synth_manifest.json": "cb687efab5036b31",
}


def _text_digests(d: Path) -> dict[str, str]:
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_file() and p.suffix in (".gz", ".json"):
            data = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
            out[str(p.relative_to(d))] = hashlib.sha256(data).hexdigest()[:16]
    return out


def test_default_heterogeneity_leaves_the_output_unchanged(tmp_path: Path) -> None:
    synth_mimic(tmp_path / "d", SynthConfig(stays=300, seed=7, chunk_stays=128))
    assert _text_digests(tmp_path / "d") == DEFAULT_TEXT_DIGESTS
    synth_mimic(tmp_path / "h", SynthConfig(stays=300, seed=7, chunk_stays=128, heterogeneity=2.0,
                                            chartevents=False))
    manifest = (tmp_path / "h" / MANIFEST).read_text()
    assert '"heterogeneity": 2.0' in manifest and "heterogeneity" not in (tmp_path / "d" / MANIFEST).read_text()


# ------------------------------------------------------------------------------------------
# Heterogeneity of the care units (--heterogeneity)
# ------------------------------------------------------------------------------------------
def test_unit_model_scales_the_distance_from_the_mean_unit() -> None:
    w1, m1 = S.unit_model(1.0)
    assert np.array_equal(w1, S.unit_weights()) and np.array_equal(m1, S.UNIT_MORTALITY)  # exactly the default
    w_bar = S.UNIT_SHARE @ S.unit_weights()
    logit = np.log(S.UNIT_MORTALITY / (1 - S.UNIT_MORTALITY))
    l_bar = S.UNIT_SHARE @ logit
    w0, m0 = S.unit_model(0.0)
    assert np.allclose(w0, w_bar[None, :], rtol=0, atol=1e-15) and np.allclose(m0, m0[0], rtol=0, atol=1e-15)
    assert m0[0] == pytest.approx(1 / (1 + np.exp(-l_bar)), rel=1e-12)
    w3, m3 = S.unit_model(3.0)
    # three times as far from the mean unit, on the weights and on the logit of the base rates
    assert np.allclose(w3 - w_bar, 3 * (S.unit_weights() - w_bar), rtol=0, atol=1e-12)
    assert np.allclose(np.log(m3 / (1 - m3)) - l_bar, 3 * (logit - l_bar), rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="heterogeneity"):
        S.unit_model(-0.5)


def test_heterogeneity_widens_the_measured_differences_between_units() -> None:
    """Per unit of the six partition units, measured on drawn cohorts: the observed mortality and the
    coefficients of a logistic regression (scikit-learn) of death on age and the latent vitals."""
    spread = {}
    for h in (0.0, 1.0, 2.0, 4.0):
        c = build_cohort(40_000, seed=11, heterogeneity=h)
        y = c.label[c.stay_adm]
        x = np.column_stack([c.stay_age(), c.vital_mu[:, [0, 3, 4, 5, 6]]]).astype(np.float64)
        x = (x - x.mean(axis=0)) / x.std(axis=0)
        rates, coefs = [], []
        for u in range(6):
            m = c.unit == u
            rates.append(y[m].mean())
            coefs.append(LogisticRegression(C=1e6, max_iter=2000).fit(x[m], y[m]).coef_[0])
        rates = np.array(rates)
        if h == 0.0:  # one shared base rate: every unit within 4 binomial standard errors of the pooled rate
            pooled = y[c.unit < 6].mean()
            se = np.sqrt(pooled * (1 - pooled) / np.bincount(c.unit, minlength=6)[:6])
            assert np.all(np.abs(rates - pooled) < 4 * se), rates
        spread[h] = (np.std(np.log(rates / (1 - rates))), np.std(np.array(coefs), axis=0).mean())
    base = [spread[h][0] for h in (0.0, 1.0, 2.0, 4.0)]
    coef = [spread[h][1] for h in (0.0, 1.0, 2.0, 4.0)]
    assert base == sorted(base) and base[0] < 0.1 < 0.3 < base[1], base
    assert coef == sorted(coef) and coef[3] > 1.5 * coef[1] > 1.5 * coef[0], coef


# ------------------------------------------------------------------------------------------
# Population shape
# ------------------------------------------------------------------------------------------
def test_mortality_per_unit_near_v31_targets() -> None:
    c = build_cohort(40_000, seed=11)
    label = c.label[c.stay_adm]
    for u, (_name, short, size, target) in enumerate(S.CARE_UNITS[:6]):
        m = c.unit == u
        assert abs(m.mean() - size / 94_458) < 0.01, short
        assert abs(label[m].mean() - target) < 0.015, (short, label[m].mean())
    assert 1.38 < c.n_stays / c.n_patients < 1.52
    # slow drift: mortality falls across shifted years (intercept -0.5 per 45 years)
    year = year_of(c.intime)
    six = c.unit < 6
    early = label[six & (year < 2145)].mean()
    late = label[six & (year >= 2165)].mean()
    assert early > late + 0.01


def test_partition_gives_about_230_centers_at_quarter_scale(tmp_path: Path) -> None:
    """Independent DuckDB count of the default ETL partition over the files (threshold 50 / 4)."""
    out = tmp_path / "quarter"
    synth_mimic(out, SynthConfig(stays=S.DEFAULT_STAYS // 4, seed=3, chartevents=False))
    rows = duckdb.connect().execute(f"""
        WITH j AS (
          SELECT s.first_careunit, year(s.intime) AS y, p.anchor_age + year(a.admittime) - p.anchor_year AS age
          FROM read_csv({_csv(out, 'icu/icustays')}) s
          JOIN read_csv({_csv(out, 'hosp/admissions')}) a USING (hadm_id)
          JOIN read_csv({_csv(out, 'hosp/patients')}) p ON p.subject_id = s.subject_id)
        SELECT first_careunit, 2110 + 2 * ((y - 2110) // 2) AS w, count(*) AS n FROM j
        WHERE age BETWEEN 18 AND 95 AND first_careunit IN ({", ".join(f"'{n}'" for n in S.UNIT_NAMES[:6])})
        GROUP BY ALL""").fetchall()
    sizes = np.array([r[2] for r in rows])
    kept = sizes[sizes >= 50 / 4]
    assert 218 <= kept.size <= 242, kept.size
    assert 50 < np.median(kept) * 4 < 800  # a few hundred stays per center at full scale
    assert not (out / "icu" / "chartevents.csv.gz").exists()
    assert pl.read_parquet(out / "ground_truth.parquet")["heart_rate_mean"].null_count() == S.DEFAULT_STAYS // 4


# ------------------------------------------------------------------------------------------
# Bad input and the CLI
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config, fragment", [
    (SynthConfig(stays=0), "--stays"),
    (SynthConfig(seed=-1), "--seed"),
    (SynthConfig(chart_hours_step=0.0), "--chart-hours-step"),
    (SynthConfig(chart_hours_step=0.01), "--chart-hours-step"),
    (SynthConfig(compresslevel=0), "--compress-level"),
    (SynthConfig(heterogeneity=-1.0), "--heterogeneity"),
    (SynthConfig(heterogeneity=float("nan")), "--heterogeneity"),
])
def test_bad_options_raise_input_error(tmp_path: Path, config: SynthConfig, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment):
        synth_mimic(tmp_path / "x", config)
    assert not (tmp_path / "x").exists()


def test_out_must_be_new_empty_or_previous_synth(tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="not a previous synth output"):
        synth_mimic(busy, SynthConfig(stays=5))
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        synth_mimic(afile, SynthConfig(stays=5))
    again = tmp_path / "again"
    synth_mimic(again, SynthConfig(stays=20, seed=1))
    summary = synth_mimic(again, SynthConfig(stays=30, seed=2))  # a previous synth output is replaced
    assert summary.stays == 30 and (again / MANIFEST).is_file()
    assert pl.read_parquet(again / "ground_truth.parquet").height == 30
    assert (busy / "notes.txt").read_text() == "keep me"
    # replaced whole: a run without chartevents leaves none of the earlier data set's behind
    assert (again / "icu" / "chartevents.csv.gz").is_file()
    synth_mimic(again, SynthConfig(stays=25, seed=3, chartevents=False))
    assert not (again / "icu" / "chartevents.csv.gz").exists()
    assert sorted(p.name for p in (again / "icu").iterdir()) == ["d_items.csv.gz", "icustays.csv.gz"]


def test_cli_main_writes_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.app import main

    main(["synth", "mimic", "--out", str(tmp_path / "m"), "--stays", "150", "--seed", "4"])
    line = capsys.readouterr().out.strip()
    assert line.startswith("synth mimic: 150 stays,") and "chartevents rows" in line
    assert pl.read_parquet(tmp_path / "m" / "ground_truth.parquet").height == 150
    with pytest.raises(SystemExit) as exc:
        main(["synth", "mimic", "--out", str(tmp_path / "n"), "--stays", "0"])
    assert exc.value.code == 2
    assert "error: --stays must be between 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["synth", "mimic", "--out", str(tmp_path / "h"), "--stays", "10", "--heterogeneity", "1e300"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == "error: --heterogeneity must be a number from 0 to 10, got 1e+300"
    assert not (tmp_path / "h").exists()


def test_console_script_subprocess(tmp_path: Path) -> None:
    exe = REPO / ".venv" / "bin" / "abps"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from cli.app import main; main()"]
    res = subprocess.run([*cmd, "synth", "mimic", "--out", str(tmp_path / "s"), "--stays", "60", "--seed", "9",
                          "--chart-hours-step", "2"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "60 stays" in res.stdout
    assert _header(tmp_path / "s" / "icu" / "icustays.csv.gz").startswith("subject_id,hadm_id,stay_id")
    res = subprocess.run([*cmd, "synth", "mimic", "--out", str(REPO / "etl"), "--stays", "5"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 2 and res.stderr.startswith("error: --out")


def test_a_string_column_of_only_nulls_is_written():
    """``--stays 3000 --seed 3`` drew a column whose values were all null; polars refused the object
    array (``cannot cast 'Object' type``). The column is a String series of nulls."""
    import numpy as np

    from etl.synth import _strings

    s = _strings(("a", "b"), np.array([-1, -1]))
    assert s.dtype == pl.String and s.null_count() == 2
    assert _strings(("a", "b"), np.array([1, -1, 0])).to_list() == ["b", None, "a"]

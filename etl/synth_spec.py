"""Fixed facts of the synthetic MIMIC-IV v3.1 generator (``abps synth mimic``), independent of the
seed: table headers, care units, categories, chartevents items, valid ranges, Charlson code pools,
the mortality model. Sources: docs/etl.md, "Module notes".
"""

from __future__ import annotations

import math

import numpy as np

# --------------------------------------------------------------------------------------------
# Table headers, exactly as in MIMIC-IV v2.2 / v3.1.
# --------------------------------------------------------------------------------------------
PATIENTS_COLUMNS = ("subject_id", "gender", "anchor_age", "anchor_year", "anchor_year_group", "dod")
ADMISSIONS_COLUMNS = (
    "subject_id", "hadm_id", "admittime", "dischtime", "deathtime", "admission_type",
    "admit_provider_id", "admission_location", "discharge_location", "insurance", "language",
    "marital_status", "race", "edregtime", "edouttime", "hospital_expire_flag",
)
DIAGNOSES_COLUMNS = ("subject_id", "hadm_id", "seq_num", "icd_code", "icd_version")
ICUSTAYS_COLUMNS = (
    "subject_id", "hadm_id", "stay_id", "first_careunit", "last_careunit", "intime", "outtime", "los",
)
CHARTEVENTS_COLUMNS = (
    "subject_id", "hadm_id", "stay_id", "caregiver_id", "charttime", "storetime", "itemid", "value",
    "valuenum", "valueuom", "warning",
)
D_ITEMS_COLUMNS = (
    "itemid", "label", "abbreviation", "linksto", "category", "unitname", "param_type",
    "lownormalvalue", "highnormalvalue",
)

# --------------------------------------------------------------------------------------------
# Care units: (first_careunit string, short name, v3.1 stays, in-hospital mortality).
# The six units of the ABPS partition come first (mimic-iv-etl-facts.md, "Care units").
# --------------------------------------------------------------------------------------------
CARE_UNITS: tuple[tuple[str, str, int, float], ...] = (
    ("Medical Intensive Care Unit (MICU)", "MICU", 20_700, 0.166),
    ("Medical/Surgical Intensive Care Unit (MICU/SICU)", "MICU/SICU", 15_400, 0.155),
    ("Cardiac Vascular Intensive Care Unit (CVICU)", "CVICU", 14_800, 0.044),
    ("Surgical Intensive Care Unit (SICU)", "SICU", 13_000, 0.119),
    ("Coronary Care Unit (CCU)", "CCU", 10_800, 0.137),
    ("Trauma SICU (TSICU)", "TSICU", 10_500, 0.110),
    ("Neuro Intermediate", "Neuro Intermediate", 5_000, 0.060),
    ("Neuro Surgical Intensive Care Unit (Neuro SICU)", "Neuro SICU", 2_600, 0.110),
    ("Neuro Stepdown", "Neuro Stepdown", 1_658, 0.035),
)
UNIT_NAMES = tuple(u[0] for u in CARE_UNITS)
UNIT_SHORT = tuple(u[1] for u in CARE_UNITS)
UNIT_SHARE = np.array([u[2] for u in CARE_UNITS], dtype=np.float64) / sum(u[2] for u in CARE_UNITS)
UNIT_MORTALITY = np.array([u[3] for u in CARE_UNITS], dtype=np.float64)
N_UNITS = len(CARE_UNITS)
PARTITION_UNITS = UNIT_SHORT[:6]
DEFAULT_STAYS = 94_458  # icustays rows in MIMIC-IV v3.1
FIRST_YEAR, LAST_YEAR = 2110, 2200  # shifted years of ICU intime

# Stay-weighted era shares (v3.1: about 29.8k stays in 2008-2010 and 10.7k in 2020-2022).
ERAS = ("2008 - 2010", "2011 - 2013", "2014 - 2016", "2017 - 2019", "2020 - 2022")
ERA_START = np.array([2008, 2011, 2014, 2017, 2020])
ERA_SHARE = np.array([0.316, 0.19, 0.19, 0.19, 0.114])

# --------------------------------------------------------------------------------------------
# Admissions categories.
# --------------------------------------------------------------------------------------------
ADMISSION_TYPES = (
    "EW EMER.", "URGENT", "DIRECT EMER.", "OBSERVATION ADMIT", "EU OBSERVATION", "DIRECT OBSERVATION",
    "AMBULATORY OBSERVATION", "ELECTIVE", "SURGICAL SAME DAY ADMISSION",
)
# Profiles of admission_type per care unit (rows sum to 1): medical, cardiac surgery, surgical,
# coronary, trauma, neuro.
_TYPE_PROFILES = {
    "medical": (0.66, 0.14, 0.06, 0.07, 0.03, 0.015, 0.005, 0.012, 0.008),
    "cardiac_surgery": (0.20, 0.15, 0.05, 0.04, 0.01, 0.01, 0.0, 0.24, 0.29),
    "surgical": (0.45, 0.14, 0.05, 0.06, 0.02, 0.01, 0.0, 0.12, 0.15),
    "coronary": (0.55, 0.22, 0.09, 0.06, 0.03, 0.02, 0.0, 0.02, 0.01),
    "trauma": (0.74, 0.10, 0.05, 0.04, 0.03, 0.01, 0.0, 0.01, 0.02),
    "neuro": (0.52, 0.16, 0.06, 0.05, 0.02, 0.01, 0.0, 0.08, 0.10),
}
UNIT_TYPE_PROFILE = ("medical", "medical", "cardiac_surgery", "surgical", "coronary", "trauma",
                     "neuro", "neuro", "neuro")
UNIT_TYPE_P = np.array([_TYPE_PROFILES[p] for p in UNIT_TYPE_PROFILE], dtype=np.float64)
UNIT_TYPE_P /= UNIT_TYPE_P.sum(axis=1, keepdims=True)
# Logit contribution of the admission type (before the per-unit weight "admission_type").
ADMISSION_TYPE_RISK = np.array([0.55, 0.45, 0.55, 0.15, 0.15, 0.05, 0.0, -0.7, -0.7])
EMERGENCY_TYPES = np.array([True, True, True, False, False, False, False, False, False])

ADMISSION_LOCATIONS = (
    "EMERGENCY ROOM", "PHYSICIAN REFERRAL", "TRANSFER FROM HOSPITAL", "CLINIC REFERRAL", "PROCEDURE SITE",
    "WALK-IN/SELF REFERRAL", "TRANSFER FROM SKILLED NURSING FACILITY", "PACU",
    "AMBULATORY SURGERY TRANSFER", "INTERNAL TRANSFER TO OR FROM PSYCH", "INFORMATION NOT AVAILABLE",
)
# admission_location given admission_type (rows follow ADMISSION_TYPES); a small share is null.
_LOC = {
    "emergency": (0.84, 0.01, 0.08, 0.0, 0.0, 0.03, 0.025, 0.0, 0.0, 0.005, 0.01),
    "urgent": (0.10, 0.20, 0.58, 0.08, 0.02, 0.0, 0.01, 0.0, 0.0, 0.0, 0.01),
    "direct": (0.02, 0.58, 0.20, 0.16, 0.02, 0.0, 0.01, 0.0, 0.0, 0.0, 0.01),
    "observation": (0.50, 0.22, 0.05, 0.03, 0.08, 0.02, 0.0, 0.09, 0.0, 0.0, 0.01),
    "elective": (0.0, 0.80, 0.01, 0.05, 0.06, 0.0, 0.0, 0.0, 0.07, 0.0, 0.01),
}
_TYPE_LOC = ("emergency", "urgent", "direct", "observation", "observation", "observation",
             "observation", "elective", "elective")
TYPE_LOCATION_P = np.array([_LOC[k] for k in _TYPE_LOC], dtype=np.float64)
TYPE_LOCATION_P /= TYPE_LOCATION_P.sum(axis=1, keepdims=True)
LOCATION_NULL_RATE = 0.004

DISCHARGE_LOCATIONS_ALIVE = (
    "HOME", "HOME HEALTH CARE", "SKILLED NURSING FACILITY", "REHAB", "CHRONIC/LONG TERM ACUTE CARE",
    "HOSPICE", "AGAINST ADVICE", "ACUTE HOSPITAL", "PSYCH FACILITY", "OTHER FACILITY",
)
DISCHARGE_ALIVE_P = np.array([0.27, 0.27, 0.22, 0.09, 0.05, 0.03, 0.02, 0.02, 0.01, 0.02])

# v3.1 insurance strings; the probabilities depend on age (>= 65 or not).
INSURANCES = ("Medicare", "Medicaid", "Private", "Self-pay", "No charge", "Other")
INSURANCE_P_OLD = np.array([0.80, 0.05, 0.10, 0.005, 0.005, 0.04])
INSURANCE_P_YOUNG = np.array([0.17, 0.28, 0.40, 0.03, 0.02, 0.10])
INSURANCE_NULL_RATE = 0.01
INSURANCE_RISK = np.array([0.10, 0.25, -0.20, 0.45, 0.35, 0.0])

LANGUAGES = ("English", "Spanish", "Chinese", "Russian", "Portuguese", "Kabuverdianu", "Haitian",
             "Vietnamese", "Other")
LANGUAGE_P = np.array([0.88, 0.04, 0.015, 0.015, 0.012, 0.008, 0.008, 0.005, 0.017])
MARITAL = ("MARRIED", "SINGLE", "WIDOWED", "DIVORCED")
MARITAL_P = np.array([0.44, 0.31, 0.14, 0.08])  # remaining 3 % null

RACES = (
    "WHITE", "WHITE - OTHER EUROPEAN", "WHITE - RUSSIAN", "WHITE - EASTERN EUROPEAN", "WHITE - BRAZILIAN",
    "BLACK/AFRICAN AMERICAN", "BLACK/CAPE VERDEAN", "BLACK/CARIBBEAN ISLAND", "BLACK/AFRICAN",
    "HISPANIC/LATINO - PUERTO RICAN", "HISPANIC/LATINO - DOMINICAN", "HISPANIC OR LATINO",
    "HISPANIC/LATINO - GUATEMALAN", "HISPANIC/LATINO - SALVADORAN", "HISPANIC/LATINO - CUBAN",
    "ASIAN", "ASIAN - CHINESE", "ASIAN - SOUTH EAST ASIAN", "ASIAN - ASIAN INDIAN",
    "AMERICAN INDIAN/ALASKA NATIVE", "NATIVE HAWAIIAN OR OTHER PACIFIC ISLANDER", "PORTUGUESE",
    "SOUTH AMERICAN", "MULTIPLE RACE/ETHNICITY", "OTHER", "UNKNOWN", "UNABLE TO OBTAIN",
    "PATIENT DECLINED TO ANSWER",
)
RACE_P = np.array([
    0.600, 0.020, 0.012, 0.005, 0.003,
    0.080, 0.008, 0.004, 0.004,
    0.016, 0.010, 0.008, 0.003, 0.003, 0.002,
    0.012, 0.014, 0.004, 0.004,
    0.002, 0.001, 0.005,
    0.002, 0.002, 0.030, 0.110, 0.020,
    0.010,
])
RACE_P = RACE_P / RACE_P.sum()

# --------------------------------------------------------------------------------------------
# Charlson conditions (Quan 2011 order, as etl.charlson.CCI_COLUMNS) and code pools.
# --------------------------------------------------------------------------------------------
CCI_COLUMNS = (
    "cci_chf", "cci_dementia", "cci_chronic_pulmonary", "cci_rheumatic", "cci_mild_liver",
    "cci_diabetes_complicated", "cci_paraplegia", "cci_renal", "cci_malignancy", "cci_severe_liver",
    "cci_metastatic", "cci_aids",
)
# (ICD-9-CM codes, ICD-10-CM codes), no dots; every code is in exactly one condition of
# Quan (2005) Table 1 and in none of the other 16.
CCI_CODES: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("4280", "42820", "42832", "4254"), ("I500", "I509", "I5022", "I420")),        # 428.x, 425.4-425.9 / I50.x, I42.0
    (("2900", "29410", "3312"), ("F0390", "G309", "F0150")),                       # 290.x, 294.1, 331.2 / F01-F03, G30
    (("496", "49121", "4928", "49390"), ("J449", "J441", "J45909", "J439")),       # 490-505 / J40-J47
    (("7140", "7100", "725"), ("M069", "M329", "M353")),                           # 714.0, 710.0, 725 / M06, M32, M35.3
    (("5715", "5712", "07054", "5718"), ("K7460", "K760", "B182", "K7030")),       # 571.x, 070.54 / K74, K76.0, B18, K70.3
    (("25040", "25050", "25060", "25041"), ("E1122", "E1140", "E1121", "E1042")),  # 250.4-250.6 / E10.4, E11.2, E11.4
    (("3441", "34290", "34400"), ("G8190", "G8220", "G8194")),                     # 344.1, 342.x, 344.0 / G81, G82
    (("5856", "5859", "40391", "V4511"), ("N186", "N185", "I120", "Z992")),        # 585.x, 403.91, V45.1 / N18, I12.0, Z99.2
    (("1629", "1749", "1541", "20510", "1890"), ("C349", "C509", "C189", "C9110", "C8590")),  # 140-208 / C00-C97
    (("4560", "5722", "5723", "5724"), ("I8500", "K7290", "K766", "K7040", "K767")),  # 456.0, 572.2-572.8 / I85.0, K72.9 ...
    (("1970", "1985", "1983", "1991"), ("C787", "C7951", "C771", "C800")),        # 196-199 / C77-C80
    (("042",), ("B20",)),                                                          # 042 / B20
)
# Prevalence of each condition among ICU admissions (base rate, before unit and age factors).
CCI_BASE_P = np.array([0.24, 0.035, 0.20, 0.03, 0.07, 0.09, 0.05, 0.19, 0.10, 0.03, 0.05, 0.007])
# Per-unit multipliers of the base prevalence (rows: CARE_UNITS order).
CCI_UNIT_MULT = np.array([
    # chf  dem  pulm rheu mliv diab para renal malig sliv meta aids
    [1.0, 1.2, 1.4, 1.2, 1.8, 1.1, 0.6, 1.2, 1.1, 2.0, 1.2, 2.0],  # MICU
    [1.0, 1.0, 1.1, 1.0, 1.3, 1.0, 0.8, 1.1, 1.3, 1.3, 1.4, 1.2],  # MICU/SICU
    [1.6, 0.4, 0.8, 0.8, 0.5, 1.1, 0.3, 1.0, 0.5, 0.3, 0.3, 0.3],  # CVICU
    [0.7, 0.7, 0.8, 1.0, 0.9, 0.8, 0.8, 0.8, 1.8, 0.8, 2.0, 0.7],  # SICU
    [2.2, 0.9, 1.0, 0.9, 0.6, 1.3, 0.4, 1.4, 0.6, 0.5, 0.4, 0.5],  # CCU
    [0.4, 1.0, 0.6, 0.6, 0.8, 0.5, 2.5, 0.5, 0.4, 0.6, 0.4, 0.5],  # TSICU
    [0.5, 2.0, 0.7, 0.8, 0.6, 0.8, 3.0, 0.6, 0.8, 0.5, 1.2, 0.5],  # Neuro Intermediate
    [0.4, 1.2, 0.6, 0.7, 0.5, 0.7, 3.5, 0.5, 1.2, 0.4, 2.0, 0.5],  # Neuro SICU
    [0.5, 1.8, 0.7, 0.8, 0.6, 0.8, 2.5, 0.6, 0.8, 0.5, 1.0, 0.5],  # Neuro Stepdown
])
# Change of log-prevalence per 10 years of age over 65 (chronic conditions rise with age).
CCI_AGE_SLOPE = np.array([0.35, 0.9, 0.15, 0.05, -0.15, 0.05, -0.15, 0.3, 0.15, -0.15, 0.05, -0.6])

# Unrelated diagnosis pools (no Charlson condition of the 12). Distractors on purpose: ICD-9
# 25000 / ICD-10 E119 (diabetes WITHOUT complication), 5849 / N179 (acute kidney failure, not
# renal disease), 486 / J189 (pneumonia, not chronic pulmonary), 41401 / I2510 (coronary
# atherosclerosis, not heart failure).
UNRELATED_ICD9 = (
    "4019", "2724", "53081", "2449", "42731", "5849", "5990", "486", "2859", "311", "V5861", "41401",
    "25000", "0389", "99592", "2762", "2851", "3051", "E8788", "V1582", "2720", "2768", "5180",
    "78552", "4241", "V5867", "3572", "2875", "27651", "78820",
)
UNRELATED_ICD10 = (
    "I10", "E785", "K219", "E039", "I4891", "N179", "N390", "J189", "D649", "F329", "Z7901", "I2510",
    "E119", "A419", "R6520", "E872", "Z87891", "F17210", "D696", "I959", "E871", "J9601", "Y92239",
    "Z794", "G4733", "E876", "R0902", "I480", "K5900", "Z951",
)

# --------------------------------------------------------------------------------------------
# chartevents items (d_items rows as in MIMIC-IV) and vital-sign semantics.
# --------------------------------------------------------------------------------------------
# itemid, label, abbreviation, linksto, category, unitname, param_type, lownormal, highnormal
D_ITEMS: tuple[tuple[int, str, str, str, str, str, str, str, str], ...] = (
    (220045, "Heart Rate", "HR", "chartevents", "Routine Vital Signs", "bpm", "Numeric", "", ""),
    (220046, "Heart rate Alarm - High", "HR Alarm - High", "chartevents", "Alarms", "bpm", "Numeric", "", ""),
    (220047, "Heart Rate Alarm - Low", "HR Alarm - Low", "chartevents", "Alarms", "bpm", "Numeric", "", ""),
    (220048, "Heart Rhythm", "Heart Rhythm", "chartevents", "Routine Vital Signs", "", "Text", "", ""),
    (220050, "Arterial Blood Pressure systolic", "ABPs", "chartevents", "Routine Vital Signs", "mmHg",
     "Numeric", "90", "140"),
    (220051, "Arterial Blood Pressure diastolic", "ABPd", "chartevents", "Routine Vital Signs", "mmHg",
     "Numeric", "60", "90"),
    (220052, "Arterial Blood Pressure mean", "ABPm", "chartevents", "Routine Vital Signs", "mmHg", "Numeric",
     "", ""),
    (220179, "Non Invasive Blood Pressure systolic", "NBPs", "chartevents", "Routine Vital Signs", "mmHg",
     "Numeric", "", ""),
    (220180, "Non Invasive Blood Pressure diastolic", "NBPd", "chartevents", "Routine Vital Signs", "mmHg",
     "Numeric", "", ""),
    (220181, "Non Invasive Blood Pressure mean", "NBPm", "chartevents", "Routine Vital Signs", "mmHg",
     "Numeric", "", ""),
    (220210, "Respiratory Rate", "RR", "chartevents", "Respiratory", "insp/min", "Numeric", "", ""),
    (220277, "O2 saturation pulseoxymetry", "SpO2", "chartevents", "Respiratory", "%", "Numeric", "", ""),
    (220739, "GCS - Eye Opening", "Eye Opening", "chartevents", "Neurological", "", "Text", "", ""),
    (223761, "Temperature Fahrenheit", "Temperature F", "chartevents", "Routine Vital Signs", "°F",
     "Numeric", "", ""),
    (223762, "Temperature Celsius", "Temperature C", "chartevents", "Routine Vital Signs", "°C", "Numeric",
     "", ""),
    (223835, "Inspired O2 Fraction", "FiO2", "chartevents", "Respiratory", "None", "Numeric", "", ""),
    (224690, "Respiratory Rate (Total)", "Respiratory Rate (Total)", "chartevents", "Respiratory",
     "insp/min", "Numeric", "", "36"),
    (225309, "ART BP Systolic", "ART BP Systolic", "chartevents", "Routine Vital Signs", "mmHg", "Numeric",
     "", ""),
    (225310, "ART BP Diastolic", "ART BP Diastolic", "chartevents", "Routine Vital Signs", "mmHg", "Numeric",
     "", ""),
    (225312, "ART BP Mean", "ART BP Mean", "chartevents", "Routine Vital Signs", "mmHg", "Numeric", "", ""),
)

VITALS = ("heart_rate", "sbp", "dbp", "mbp", "resp_rate", "spo2", "temperature")
# itemid -> (vital index, lower bound exclusive, upper bound, upper inclusive?, Fahrenheit?)
VITAL_ITEMS: dict[int, tuple[int, float, float, bool, bool]] = {
    220045: (0, 0.0, 300.0, False, False),
    220179: (1, 0.0, 400.0, False, False),
    220050: (1, 0.0, 400.0, False, False),
    225309: (1, 0.0, 400.0, False, False),
    220180: (2, 0.0, 300.0, False, False),
    220051: (2, 0.0, 300.0, False, False),
    225310: (2, 0.0, 300.0, False, False),
    220181: (3, 0.0, 300.0, False, False),
    220052: (3, 0.0, 300.0, False, False),
    225312: (3, 0.0, 300.0, False, False),
    220210: (4, 0.0, 70.0, False, False),
    224690: (4, 0.0, 70.0, False, False),
    220277: (5, 0.0, 100.0, True, False),
    223761: (6, 70.0, 120.0, False, True),
    223762: (6, 10.0, 50.0, False, False),
}
TRUTH_WINDOW_HOURS = 24.0  # intime <= charttime <= intime + 24 h, both ends inclusive

# --------------------------------------------------------------------------------------------
# Mortality model of a stay in unit u, shifted intime year y, tau = (y - 2155) / 45:
#   logit p = b_u + DRIFT_INTERCEPT tau + sum_k w_uk x_k + tau sum_k d_k w_uk (x_k - mean_k)
# (b_u calibrated to UNIT_MORTALITY; an admission dies with the noisy-OR of its stays' p).
# --------------------------------------------------------------------------------------------
RISK_FEATURES = (
    "age", "hr", "hr_abn", "mbp_low", "spo2_low", "rr", "temp", "temp_abn", *CCI_COLUMNS,
    "admission_type", "insurance", "unobserved",
)
_BASE_W = np.array([
    0.55, 0.30, 0.15, 0.50, 0.45, 0.35, 0.0, 0.25,                      # age, vitals
    0.35, 0.30, 0.20, 0.10, 0.35, 0.10, 0.25, 0.30, 0.45, 0.90, 1.00, 0.60,  # Charlson
    1.0, 1.0, 0.85,                                                      # type, insurance, unobserved
])
# Per-unit multipliers on _BASE_W plus per-unit signed temperature effects (fever in surgical
# units, hypothermia after cardiac surgery): different units, different models.
_UNIT_MULT = {
    "MICU":      dict(age=0.9, hr=1.0, mbp_low=1.0, spo2_low=1.6, rr=1.5, temp_abn=1.0, liver=1.6, malig=1.2),
    "MICU/SICU": dict(age=1.0, hr=1.0, mbp_low=1.1, spo2_low=1.1, rr=1.1, temp_abn=1.0, malig=1.2),
    "CVICU":     dict(age=1.4, hr=1.5, mbp_low=2.0, spo2_low=0.6, rr=0.7, temp_abn=0.6, chf=1.5, renal=1.4,
                      malig=0.4, admission_type=1.8, temp=-0.45),
    "SICU":      dict(age=1.2, hr=0.8, mbp_low=1.3, spo2_low=0.9, rr=0.9, temp_abn=1.6, malig=1.5, temp=0.35),
    "CCU":       dict(age=1.0, hr=0.6, hr_abn=3.0, mbp_low=1.6, spo2_low=1.0, rr=0.8, chf=1.7, renal=1.5,
                      malig=0.7),
    "TSICU":     dict(age=1.9, hr=0.8, mbp_low=1.4, spo2_low=0.8, rr=0.8, para=2.2, comorb=0.6,
                      admission_type=0.5),
    "Neuro Intermediate": dict(age=1.4, vitals=0.7, para=1.6, dementia=1.5),
    "Neuro SICU": dict(age=1.3, vitals=0.8, para=1.8, malig=1.3),
    "Neuro Stepdown": dict(age=1.4, vitals=0.6, para=1.5, dementia=1.5),
}
# Drift over the shifted year: vital weights scale by (1 + 0.3 tau), comorbidity and age weights
# by (1 - 0.3 tau), both acting on features centred on the cohort mean; the intercept moves by
# -0.5 tau (mortality falls slowly across years).
DRIFT_VITALS, DRIFT_CHRONIC, DRIFT_INTERCEPT = 0.3, -0.3, -0.5
YEAR_CENTER, YEAR_SCALE = 2155.0, 45.0


def unit_weights() -> np.ndarray:
    """Per-unit logistic weights of the mortality model at tau = 0.

    Returns an array ``[N_UNITS, len(RISK_FEATURES)]`` (float64) built from ``_BASE_W`` and the
    per-unit multipliers ``_UNIT_MULT`` (this module). Raises nothing.
    """
    idx = {name: k for k, name in enumerate(RISK_FEATURES)}
    vitals = [idx[k] for k in ("hr", "hr_abn", "mbp_low", "spo2_low", "rr", "temp_abn")]
    liver = [idx["cci_mild_liver"], idx["cci_severe_liver"]]
    malig = [idx["cci_malignancy"], idx["cci_metastatic"]]
    comorb = [idx[c] for c in CCI_COLUMNS]
    w = np.tile(_BASE_W, (N_UNITS, 1))
    for u, short in enumerate(UNIT_SHORT):
        for key, m in _UNIT_MULT[short].items():
            if key == "temp":
                w[u, idx["temp"]] = m
            elif key == "vitals":
                w[u, vitals] *= m
            elif key == "liver":
                w[u, liver] *= m
            elif key == "malig":
                w[u, malig] *= m
            elif key == "comorb":
                w[u, comorb] *= m
            elif key == "para":
                w[u, idx["cci_paraplegia"]] *= m
            elif key in ("chf", "renal", "dementia"):
                w[u, idx[{"chf": "cci_chf", "renal": "cci_renal", "dementia": "cci_dementia"}[key]]] *= m
            else:
                w[u, idx[key]] *= m
    return w


def unit_model(heterogeneity: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """The care units' mortality models at a heterogeneity ``h`` (``abps synth mimic --heterogeneity``).

    Each unit's logistic weights ``w_u`` (:func:`unit_weights`) and the logit of its base rate
    (:data:`UNIT_MORTALITY`) are placed at ``h`` times their distance from the stay-share-weighted
    mean unit (``UNIT_SHARE``): ``w_u(h) = w_bar + h (w_u - w_bar)``,
    ``logit m_u(h) = l_bar + h (logit m_u - l_bar)``. ``h = 0``: every unit shares one model and one
    base rate; ``h = 1`` (default): the built-in units, returned exactly; ``h = 2``: twice as far apart
    (a weight may change sign: a feature harmful in one unit, protective in another).

    Returns:
        ``(weights [N_UNITS, len(RISK_FEATURES)], mortality [N_UNITS])`` (float64).

    Raises:
        ValueError: ``heterogeneity`` negative or not finite.
    """
    h = float(heterogeneity)
    if not (math.isfinite(h) and h >= 0.0):
        raise ValueError(f"heterogeneity must be a finite number >= 0, got {heterogeneity}")
    w, m = unit_weights(), UNIT_MORTALITY.copy()
    if h == 1.0:
        return w, m
    w_bar = UNIT_SHARE @ w
    logit = np.log(m) - np.log1p(-m)
    l_bar = float(UNIT_SHARE @ logit)
    return w_bar + h * (w - w_bar), 1.0 / (1.0 + np.exp(-(l_bar + h * (logit - l_bar))))


def drift_factors() -> np.ndarray:
    """Per-feature drift coefficients ``d``, shape ``[len(RISK_FEATURES)]``.

    The effective weight of feature k at ``tau`` is ``w_uk (1 + d_k tau)``, applied to the feature
    centred on the cohort mean (``etl.synth_cohort._features``).
    """
    d = np.zeros(len(RISK_FEATURES))
    idx = {name: k for k, name in enumerate(RISK_FEATURES)}
    for k in ("hr", "hr_abn", "mbp_low", "spo2_low", "rr", "temp", "temp_abn"):
        d[idx[k]] = DRIFT_VITALS
    for k in ("age", *CCI_COLUMNS):
        d[idx[k]] = DRIFT_CHRONIC
    return d

"""The cohort schema: column contract of cohort.parquet and centers.parquet (docs/data_dictionary.md).

Defined once here and used by both ETL sources (etl/mimic.py, etl/eicu.py, etl/pipeline.py) and by
the runtime (federation/data/tensors.py, federation/data/synthetic.py). The Charlson column list has a single
source, :data:`etl.charlson.CCI_COLUMNS`.
"""

from __future__ import annotations

from etl.charlson import CCI_COLUMNS  # the 12 updated-Charlson flags (Quan et al. 2011), in contract order

#: First-24 h vital signs, in contract order.
VITALS: tuple[str, ...] = ("heart_rate", "sbp", "dbp", "mbp", "resp_rate", "spo2", "temperature")

#: 21 vital aggregates: heart_rate_mean, heart_rate_min, heart_rate_max, sbp_mean, ...
VITAL_COLUMNS: tuple[str, ...] = tuple(f"{v}_{a}" for v in VITALS for a in ("mean", "min", "max"))

#: Numeric model features: age + 21 vitals (imputed with the center's train median, standardized).
NUMERIC_FEATURES: tuple[str, ...] = ("age",) + VITAL_COLUMNS

#: Binary model features (used as 0/1, null -> 0).
BINARY_FEATURES: tuple[str, ...] = CCI_COLUMNS

#: Categorical model features, one-hot over the categories present in the whole cohort file.
CATEGORICAL_FEATURES: tuple[str, ...] = (
    "gender",
    "race",
    "admission_type",
    "admission_location",
    "insurance",
)

#: Identifier and bookkeeping columns of cohort.parquet (never model features, never logged).
COHORT_ID_COLUMNS: tuple[str, ...] = ("stay_id", "subject_id", "hadm_id")

#: All cohort.parquet columns, in contract order.
COHORT_COLUMNS: tuple[str, ...] = (
    "stay_id",
    "subject_id",
    "hadm_id",
    "center_id",
    "care_unit",
    "split",
    "label",
    "admit_year",
    "anchor_year_group",
    "age",
    "gender",
    "race",
    "admission_type",
    "admission_location",
    "insurance",
    *CCI_COLUMNS,
    *VITAL_COLUMNS,
)

#: The 3-dim base metadata vector v_i (ABPS paper Sec. 4.1 / 6.3).
META_BASE_COLUMNS: tuple[str, ...] = ("meta_pos_rate", "meta_log_n_train", "meta_year")

#: The 15-dim metadata vector: base + 12 Charlson prevalences over the train split.
META_COLUMNS: tuple[str, ...] = META_BASE_COLUMNS + tuple(f"meta_{c}" for c in CCI_COLUMNS)

#: All centers.parquet columns, in contract order.
CENTER_COLUMNS: tuple[str, ...] = (
    "center_id",
    "care_unit",
    "window_start",
    "window_end",
    "n_train",
    "n_val",
    "n_test",
    "pos_rate",
    *META_COLUMNS,
)

SPLITS: tuple[str, ...] = ("train", "val", "test")

#: Exact MIMIC-IV ``icustays.first_careunit`` strings -> the short names of the ``care_unit``
#: column (reference/mimic-iv-etl-facts.md).
CARE_UNITS: dict[str, str] = {
    "Medical Intensive Care Unit (MICU)": "MICU",
    "Medical/Surgical Intensive Care Unit (MICU/SICU)": "MICU/SICU",
    "Cardiac Vascular Intensive Care Unit (CVICU)": "CVICU",
    "Surgical Intensive Care Unit (SICU)": "SICU",
    "Coronary Care Unit (CCU)": "CCU",
    "Trauma SICU (TSICU)": "TSICU",
    "Neuro Intermediate": "Neuro Intermediate",
    "Neuro Surgical Intensive Care Unit (Neuro SICU)": "Neuro SICU",
    "Neuro Stepdown": "Neuro Stepdown",
}

#: The ABPS paper's six care units (Sec. 6.1), the default of ``--care-units``.
DEFAULT_CARE_UNITS: tuple[str, ...] = ("MICU", "MICU/SICU", "CVICU", "SICU", "CCU", "TSICU")

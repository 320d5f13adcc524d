-- Concept: the ICU stays of a MEDS dataset in the shape of MIMIC-IV icu.icustays
-- (stay_id, subject_id, hadm_id, first_careunit, intime), one row per distinct ICU_ADMISSION event.
-- Source: MEDS schema (meds 0.3.3: subject_id, time, code, numeric_value; extra columns allowed),
-- the MIMIC-IV MEDS ETL (MEDS_transforms 0.0.9, MIMIC-IV "ICU_ADMISSION//{first_careunit}" at
-- icustays.intime with extra columns hadm_id and icustay_id = icustays.stay_id), ABPS paper
-- Sec. 6.1 (ICU stays of six care units). Identical repeated events are collapsed here; two
-- different admissions of one icustay_id are refused by etl/meds.py.
-- Parameters: <events> (table expression over the shards: subject_id, time, code, hadm_id,
--   icustay_id, ...).
SELECT DISTINCT icustay_id AS stay_id, subject_id, hadm_id,
       substr(code, length('ICU_ADMISSION//') + 1) AS first_careunit,
       time AS intime
FROM ${events}
WHERE starts_with(code, 'ICU_ADMISSION//') AND icustay_id IS NOT NULL

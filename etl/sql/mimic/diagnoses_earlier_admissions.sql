-- Concept: the diagnosis codes of a stay's comorbidity flags without label leakage: the codes
-- of the patient's admissions that started before this one (comorbidity source
-- "earlier-admissions", discharge codes of the same admission are written after the outcome).
-- Source: ABPS paper Sec. 6.1 names diagnoses_icd, the leakage-free variant is this project's
-- option (docs/decisions.md). Codes are attributed to the current hadm_id.
-- Parameters: <diagnoses_icd> <admissions> (table expressions), relation kept
--   (hadm_id, subject_id, admittime).
-- Output: hadm_id, icd_code, icd_version (input of etl/sql/charlson.sql).
SELECT cur.hadm_id AS hadm_id, d.icd_code, d.icd_version
FROM (SELECT DISTINCT hadm_id, subject_id, admittime FROM kept) cur
JOIN ${admissions} prev ON prev.subject_id = cur.subject_id AND prev.admittime < cur.admittime
JOIN ${diagnoses_icd} d ON d.hadm_id = prev.hadm_id

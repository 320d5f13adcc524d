-- Concept: the diagnosis codes the Charlson flags of a stay are computed from, in the paper's
-- setting: every code of the stay's own admission (comorbidity source "same-admission").
-- Source: ABPS paper Sec. 6.1 (Charlson comorbidities from diagnoses_icd), MIT-LCP mimic-code
-- mimic-iv/concepts/comorbidity/charlson.sql (codes of the hadm_id).
-- Parameters: <diagnoses_icd> (table expression), relation kept (hadm_id) of the kept stays.
-- Output: hadm_id, icd_code, icd_version (input of etl/sql/charlson.sql).
SELECT d.hadm_id, d.icd_code, d.icd_version
FROM ${diagnoses_icd} d
JOIN (SELECT DISTINCT hadm_id FROM kept) k USING (hadm_id)

-- Concept: the diagnosis codes of a MEDS dataset in the shape of MIMIC-IV hosp.diagnoses_icd as
-- the Charlson concepts use it (hadm_id, icd_code, icd_version).
-- Source: MEDS schema (meds 0.3.3), the MIMIC-IV MEDS ETL ("DIAGNOSIS//ICD//{icd_version}//
-- {icd_code}" at the admission's dischtime, extra column hadm_id; the code without dots as in
-- diagnoses_icd; codes.parquet's parent_codes carry the dotted ICD9CM/ICD10CM form), ABPS paper
-- Sec. 6.1 (Charlson comorbidities from the ICD codes). seq_num is not carried: one event per
-- distinct (hadm_id, code) is read (a code listed twice for an admission counts once, as it
-- does in the Charlson flags).
-- Parameters: <events> (table expression over the shards).
SELECT DISTINCT hadm_id, split_part(code, '//', 4) AS icd_code,
       TRY_CAST(split_part(code, '//', 3) AS INTEGER) AS icd_version
FROM ${events}
WHERE starts_with(code, 'DIAGNOSIS//ICD//') AND hadm_id IS NOT NULL

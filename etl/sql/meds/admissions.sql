-- Concept: the hospital admissions of a MEDS dataset in the shape of MIMIC-IV hosp.admissions
-- (hadm_id, subject_id, admittime, admission_type, admission_location, insurance, race,
-- hospital_expire_flag), one row per distinct HOSPITAL_ADMISSION event.
-- Source: MEDS schema (meds 0.3.3), the MIMIC-IV MEDS ETL's codes
-- "HOSPITAL_ADMISSION//{admission_type}//{admission_location}" at admittime (insurance and race
-- as extra columns of that event) and "HOSPITAL_DISCHARGE//{discharge_location}" at dischtime;
-- "UNK" is that ETL's marker of a null field (mapped back to null, which stays.sql makes
-- UNKNOWN). ABPS paper Sec. 6.1: the label is in-hospital mortality; MIMIC-IV sets
-- hospital_expire_flag = 1 exactly when discharge_location is DIED, so the label is a
-- HOSPITAL_DISCHARGE//DIED event of the admission (null when the admission has no discharge event).
-- Parameters: <events> (table expression over the shards).
WITH adm AS (
    SELECT DISTINCT hadm_id, subject_id, time AS admittime,
           nullif(split_part(code, '//', 2), 'UNK') AS admission_type,
           nullif(split_part(code, '//', 3), 'UNK') AS admission_location,
           insurance, race
    FROM ${events}
    WHERE starts_with(code, 'HOSPITAL_ADMISSION//') AND hadm_id IS NOT NULL
),
dis AS (
    SELECT hadm_id, max(CASE WHEN code = 'HOSPITAL_DISCHARGE//DIED' THEN 1 ELSE 0 END) AS died
    FROM ${events}
    WHERE starts_with(code, 'HOSPITAL_DISCHARGE//') AND hadm_id IS NOT NULL
    GROUP BY hadm_id
)
SELECT adm.*, CAST(dis.died AS INTEGER) AS hospital_expire_flag
FROM adm LEFT JOIN dis USING (hadm_id)

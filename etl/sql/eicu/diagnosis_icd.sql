-- Concept: eICU diagnosis strings as (hadm_id := stay_id, icd_code, icd_version) rows, the
-- input of etl/sql/charlson.sql.
-- Source: eICU-CRD documentation, table diagnosis: icd9code lists ICD-9 and ICD-10 codes in
-- one string ("401.9, I10"), the ICD-9 code first. A token starting with a digit is ICD-9, a
-- token starting with V or E is ICD-9 when it is the first of two or more tokens, ICD-10
-- otherwise, any other letter is ICD-10 (docs/eicu.md).
-- Parameters: <diagnosis> (table expression), relation kept (stay_id).
SELECT stay_id AS hadm_id, replace(tok, '.', '') AS icd_code,
       CASE WHEN regexp_matches(tok, '^[0-9]') THEN 9
            WHEN regexp_matches(tok, '^[VE]') AND pos = 1 AND n > 1 THEN 9
            ELSE 10 END AS icd_version
FROM (
    SELECT d.patientunitstayid AS stay_id, trim(t.tok) AS tok, t.pos, len(string_split(d.icd9code, ',')) AS n
    FROM ${diagnosis} d,
         LATERAL (SELECT unnest(string_split(d.icd9code, ',')) AS tok,
                         generate_subscripts(string_split(d.icd9code, ','), 1) AS pos) t
    WHERE d.icd9code IS NOT NULL AND d.icd9code <> ''
      AND d.patientunitstayid IN (SELECT stay_id FROM kept)
)
WHERE tok <> ''

-- Concept: the patients of a MEDS dataset in the shape of MIMIC-IV hosp.patients as the
-- cohort concepts use it (subject_id, gender, anchor_age, anchor_year, anchor_year_group).
-- Source: MEDS schema (meds 0.3.3: MEDS_BIRTH, the standard birth code), the MIMIC-IV MEDS ETL
-- (MEDS_BIRTH on 1 January of anchor_year - anchor_age; static "GENDER//{gender}" without a
-- time), mimic-code mimic-iv/concepts/demographics/age.sql (age = anchor_age + year(admittime)
-- - anchor_year). With anchor_age = 0 and anchor_year = year(MEDS_BIRTH), etl/sql/mimic/stays.sql
-- computes the same age. MEDS does not carry anchor_year_group: it is null (docs/meds.md).
-- Parameters: <events> (table expression over the shards).
WITH birth AS (
    SELECT subject_id, min(year(time)) AS birth_year, count(DISTINCT time) AS n_birth
    FROM ${events} WHERE code = 'MEDS_BIRTH' GROUP BY subject_id
),
sex AS (
    SELECT subject_id, min(substr(code, length('GENDER//') + 1)) AS gender,
           count(DISTINCT code) AS n_gender
    FROM ${events} WHERE starts_with(code, 'GENDER//') GROUP BY subject_id
)
SELECT b.subject_id, s.gender, 0 AS anchor_age, CAST(b.birth_year AS INTEGER) AS anchor_year,
       CAST(NULL AS VARCHAR) AS anchor_year_group, b.n_birth, s.n_gender
FROM birth b LEFT JOIN sex s USING (subject_id)

-- Concept: ICU stays with their admission and patient fields, age at admission, the
-- in-hospital-mortality label and the care unit's short name (one row per stay).
-- Source: ABPS paper Sec. 6.1 and Appendix A (cohort: adult ICU stays, label
-- hospital_expire_flag), MIMIC-IV v2.2-v3.1 hosp.patients, hosp.admissions, icu.icustays
-- (reference/mimic-iv-etl-facts.md), age as in mimic-code mimic-iv/concepts/demographics/age.sql
-- (anchor_age + year(admittime) - anchor_year), race grouping as docs/etl.md.
-- Parameters: <icustays> <admissions> <patients> (table expressions),
--   <care_units> VALUES rows (first_careunit, short name) from etl.schema.CARE_UNITS.
SELECT i.stay_id, i.subject_id, i.hadm_id, i.first_careunit,
       coalesce(cu.short_name, i.first_careunit) AS care_unit,
       i.intime, CAST(year(i.intime) AS INTEGER) AS admit_year, a.admittime,
       p.anchor_year_group, p.gender,
       CAST(p.anchor_age + (year(a.admittime) - p.anchor_year) AS DOUBLE) AS age,
       CASE
           WHEN upper(a.race) LIKE 'WHITE%' OR upper(a.race) IN ('PORTUGUESE') THEN 'WHITE'
           WHEN upper(a.race) LIKE 'BLACK%' THEN 'BLACK'
           WHEN upper(a.race) LIKE 'HISPANIC%' OR upper(a.race) = 'SOUTH AMERICAN' THEN 'HISPANIC'
           WHEN upper(a.race) LIKE 'ASIAN%' THEN 'ASIAN'
           WHEN a.race IS NULL OR upper(a.race) IN ('UNKNOWN', 'UNABLE TO OBTAIN', 'PATIENT DECLINED TO ANSWER')
                THEN 'UNKNOWN'
           ELSE 'OTHER' END AS race,
       coalesce(a.admission_type, 'UNKNOWN') AS admission_type,
       coalesce(a.admission_location, 'UNKNOWN') AS admission_location,
       coalesce(a.insurance, 'UNKNOWN') AS insurance,
       CAST(a.hospital_expire_flag AS TINYINT) AS label
FROM ${icustays} i
JOIN ${admissions} a ON a.hadm_id = i.hadm_id
JOIN ${patients} p ON p.subject_id = i.subject_id
LEFT JOIN (VALUES ${care_units}) cu(first_careunit, short_name) ON cu.first_careunit = i.first_careunit

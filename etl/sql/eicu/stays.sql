-- Concept: eICU unit stays mapped onto the cohort contract (one row per patientunitstayid),
-- center = hospital (hospitalid).
-- Source: eICU-CRD documentation, table patient (Pollard et al. 2018, Sci Data 5:180178):
-- patientunitstayid, patienthealthsystemstayid, uniquepid, age ("> 89" for ages above 89),
-- hospitaldischargestatus ('Alive' / 'Expired'), unittype, unitstaytype, unitadmitsource,
-- ABPS paper Sec. 6.1 (label: in-hospital mortality). Mapping: docs/eicu.md.
-- Parameters: <patient> (table expression).
SELECT p.patientunitstayid AS stay_id,
       dense_rank() OVER (ORDER BY p.uniquepid) AS subject_id,
       p.patienthealthsystemstayid AS hadm_id,
       p.hospitalid,
       'hosp-' || CAST(p.hospitalid AS VARCHAR) AS center_id,
       coalesce(nullif(p.unittype, ''), 'UNKNOWN') AS care_unit,
       p.hospitaldischargeyear AS admit_year,
       CAST(p.hospitaldischargeyear AS VARCHAR) AS anchor_year_group,
       CASE WHEN trim(CAST(p.age AS VARCHAR)) = '> 89' THEN 90.0 ELSE TRY_CAST(p.age AS DOUBLE) END AS age,
       CASE p.gender WHEN 'Male' THEN 'M' WHEN 'Female' THEN 'F' ELSE 'UNKNOWN' END AS gender,
       CASE p.ethnicity WHEN 'Caucasian' THEN 'WHITE' WHEN 'African American' THEN 'BLACK'
            WHEN 'Hispanic' THEN 'HISPANIC' WHEN 'Asian' THEN 'ASIAN'
            WHEN 'Native American' THEN 'OTHER' WHEN 'Other/Unknown' THEN 'OTHER' ELSE 'UNKNOWN' END AS race,
       coalesce(nullif(p.unitstaytype, ''), 'UNKNOWN') AS admission_type,
       coalesce(nullif(p.unitadmitsource, ''), 'UNKNOWN') AS admission_location,
       'UNKNOWN' AS insurance,
       CASE p.hospitaldischargestatus WHEN 'Expired' THEN 1 WHEN 'Alive' THEN 0 END::TINYINT AS label
FROM ${patient} p

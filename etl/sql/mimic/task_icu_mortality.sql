-- Concept: task label icu-mortality - death before ICU discharge (one row per stay: stay_id, label).
-- Source: MIMIC-Extract (Wang et al. 2020, CHIL), outcome mort_icu: the admission's deathtime
-- falls inside the ICU stay [intime, outtime]; YAIB (van de Water et al. 2024) ICU mortality;
-- MIMIC-IV v2.2-v3.1 admissions.deathtime (in-hospital death time), patients.dod (date of death,
-- day resolution, also out-of-hospital deaths), icustays.intime / outtime
-- (reference/mimic-iv-etl-facts.md, mimic-code mimic-iv/concepts/demographics/icustay_detail.sql).
-- When deathtime is empty, dod counts if its day lies within [day of intime, day of outtime].
-- A stay without outtime has no label (NULL, dropped).
-- Parameters: <icustays> <admissions> <patients> (table expressions).
SELECT i.stay_id,
       CASE WHEN i.outtime IS NULL OR i.intime IS NULL THEN NULL
            WHEN a.deathtime IS NOT NULL THEN CAST(a.deathtime BETWEEN i.intime AND i.outtime AS TINYINT)
            WHEN p.dod IS NOT NULL
                 THEN CAST(p.dod BETWEEN CAST(i.intime AS DATE) AND CAST(i.outtime AS DATE) AS TINYINT)
            ELSE 0 END AS label
FROM ${icustays} i
JOIN ${admissions} a ON a.hadm_id = i.hadm_id
JOIN ${patients} p ON p.subject_id = i.subject_id

-- Concept: task label decompensation - death within <horizon_hours> h after the first
-- <at_hours> h of the ICU stay (one row per stay: stay_id, label).
-- Source: Harutyunyan et al. 2019 (Sci Data 6:96), decompensation benchmark: at hour t of an
-- ICU stay (t <= length of stay and t <= time of death), label 1 when the patient dies within the
-- next 24 h (in-hospital death; time of death admissions.deathtime, MIMIC-IV v2.2-v3.1,
-- reference/mimic-iv-etl-facts.md); we take their sample at t = <at_hours> h, the end of the
-- first-day feature window. A stay that left the ICU or died before t has no label (NULL,
-- dropped: its features would overlap the outcome); so has a stay without intime / outtime, and
-- an in-hospital death (hospital_expire_flag = 1) without deathtime.
-- Parameters: <icustays> <admissions> (table expressions), <at_hours>, <horizon_hours> (numbers).
SELECT i.stay_id,
       CASE WHEN i.intime IS NULL OR i.outtime IS NULL THEN NULL
            WHEN a.hospital_expire_flag = 1 AND a.deathtime IS NULL THEN NULL
            WHEN i.outtime < i.intime + to_hours(${at_hours}) THEN NULL
            WHEN a.deathtime < i.intime + to_hours(${at_hours}) THEN NULL
            ELSE CAST(coalesce(a.hospital_expire_flag = 1
                               AND a.deathtime < i.intime + to_hours(${at_hours} + ${horizon_hours}), false)
                      AS TINYINT) END AS label
FROM ${icustays} i
JOIN ${admissions} a ON a.hadm_id = i.hadm_id

-- Concept: task label los-<days> - unit length of stay above <days> days (one row per unit stay: stay_id, label).
-- Source: eICU-CRD documentation, table patient (Pollard et al. 2018, Sci Data 5:180178):
-- unitdischargeoffset = minutes from unit admission to unit discharge, so LOS days =
-- unitdischargeoffset / 1440; thresholds of MIMIC-Extract (Wang et al. 2020) los_3 / los_7,
-- YAIB (van de Water et al. 2024) length of stay on eICU. A missing offset has no label.
-- Parameters: <patient> (table expression), <days> (threshold in days, a number).
SELECT p.patientunitstayid AS stay_id,
       CASE WHEN p.unitdischargeoffset IS NULL THEN NULL
            ELSE CAST(p.unitdischargeoffset / 1440.0 > ${days} AS TINYINT) END AS label
FROM ${patient} p

-- Concept: task label icu-mortality - death before unit discharge (one row per unit stay: stay_id, label).
-- Source: eICU-CRD documentation, table patient (Pollard et al. 2018, Sci Data 5:180178):
-- unitdischargestatus ('Alive' / 'Expired', status at unit discharge); YAIB (van de Water et
-- al. 2024) ICU mortality on eICU. An empty status has no label (NULL, dropped).
-- Parameters: <patient> (table expression).
SELECT p.patientunitstayid AS stay_id,
       CASE p.unitdischargestatus WHEN 'Expired' THEN 1 WHEN 'Alive' THEN 0 END::TINYINT AS label
FROM ${patient} p

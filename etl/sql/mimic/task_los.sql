-- Concept: task label los-<days> - ICU length of stay above <days> days (one row per stay: stay_id, label).
-- Source: MIMIC-Extract (Wang et al. 2020, CHIL), outcomes los_3 / los_7 (length of stay > 3 and
-- > 7 days); YAIB (van de Water et al. 2024) length-of-stay task; MIMIC-IV icustays.los
-- (fractional days between intime and outtime, reference/mimic-iv-etl-facts.md).
-- A stay without los has no label (NULL, dropped).
-- Parameters: <icustays> (table expression), <days> (threshold in days, a number).
SELECT i.stay_id,
       CASE WHEN i.los IS NULL THEN NULL ELSE CAST(i.los > ${days} AS TINYINT) END AS label
FROM ${icustays} i

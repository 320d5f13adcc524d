-- Concept: first-day vital signs per stay on the cohort contract (etl.schema.VITAL_COLUMNS).
-- Source: eICU-CRD documentation, tables apacheApsVar (the APACHE IV worst first-day values:
-- heartrate, meanbp, respiratoryrate, temperature, -1 marks missing) and vitalAperiodic
-- (non-invasive BP, observationoffset in minutes from unit admission), valid ranges as
-- mimic-code mimic-iv/concepts/measurement/vitalsign.sql, ABPS paper Appendix A. APACHE gives
-- one value per stay, used for mean, min and max alike, SpO2 has no source in the demo.
-- Parameters: <apacheApsVar> <vitalAperiodic> (table expressions), <from_minutes> (window
--   start), relation kept (stay_id).
WITH aps AS (
    SELECT patientunitstayid AS stay_id,
           CASE WHEN heartrate > 0 AND heartrate < 300 THEN heartrate END AS hr,
           CASE WHEN meanbp > 0 AND meanbp < 300 THEN meanbp END AS mbp_aps,
           CASE WHEN respiratoryrate > 0 AND respiratoryrate < 70 THEN respiratoryrate END AS rr,
           CASE WHEN temperature > 10 AND temperature < 50 THEN temperature END AS temp
    FROM ${apacheApsVar}
), nibp_ok AS (
    SELECT patientunitstayid AS stay_id,
           CASE WHEN noninvasivesystolic > 0 AND noninvasivesystolic < 400 THEN noninvasivesystolic END AS sbp,
           CASE WHEN noninvasivediastolic > 0 AND noninvasivediastolic < 300 THEN noninvasivediastolic END AS dbp,
           CASE WHEN noninvasivemean > 0 AND noninvasivemean < 300 THEN noninvasivemean END AS mbp
    FROM ${vitalAperiodic}
    WHERE observationoffset >= ${from_minutes} AND observationoffset <= 1440
), nibp AS (
    SELECT stay_id,
           avg(sbp) AS sbp_mean, min(sbp) AS sbp_min, max(sbp) AS sbp_max,
           avg(dbp) AS dbp_mean, min(dbp) AS dbp_min, max(dbp) AS dbp_max,
           avg(mbp) AS mbp_mean, min(mbp) AS mbp_min, max(mbp) AS mbp_max
    FROM nibp_ok
    GROUP BY stay_id
)
SELECT k.stay_id,
       round(a.hr, 6) AS heart_rate_mean, round(a.hr, 6) AS heart_rate_min, round(a.hr, 6) AS heart_rate_max,
       round(n.sbp_mean, 6) AS sbp_mean, round(n.sbp_min, 6) AS sbp_min, round(n.sbp_max, 6) AS sbp_max,
       round(n.dbp_mean, 6) AS dbp_mean, round(n.dbp_min, 6) AS dbp_min, round(n.dbp_max, 6) AS dbp_max,
       round(coalesce(n.mbp_mean, a.mbp_aps), 6) AS mbp_mean, round(coalesce(n.mbp_min, a.mbp_aps), 6) AS mbp_min,
       round(coalesce(n.mbp_max, a.mbp_aps), 6) AS mbp_max,
       round(a.rr, 6) AS resp_rate_mean, round(a.rr, 6) AS resp_rate_min, round(a.rr, 6) AS resp_rate_max,
       CAST(NULL AS DOUBLE) AS spo2_mean, CAST(NULL AS DOUBLE) AS spo2_min, CAST(NULL AS DOUBLE) AS spo2_max,
       round(a.temp, 6) AS temperature_mean, round(a.temp, 6) AS temperature_min, round(a.temp, 6) AS temperature_max
FROM kept k LEFT JOIN aps a USING (stay_id) LEFT JOIN nibp n USING (stay_id)

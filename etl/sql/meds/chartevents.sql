-- Concept: the ICU chart events of a MEDS dataset in the shape of MIMIC-IV icu.chartevents as
-- the vital concepts use it (stay_id, charttime, itemid, valuenum); etl/sql/mimic/vital_rows.sql
-- then keeps the vital itemids, exactly as on the CSV path.
-- Source: MEDS schema (meds 0.3.3: numeric_value is float32), the MIMIC-IV MEDS ETL (a
-- chartevents row becomes "LAB//{itemid}//{valueuom}" at charttime, numeric_value = valuenum,
-- extra column icustay_id = stay_id), ABPS paper Appendix A (first-24-h vitals).
-- numeric_value is read through its shortest decimal text, which gives back the CSV's valuenum
-- for values with at most 7 significant digits (a float32 widened to double would not: 97.8
-- becomes 97.80000305); docs/meds.md.
-- Parameters: <events> (table expression over the shards).
SELECT icustay_id AS stay_id, time AS charttime, itemid,
       CAST(CAST(numeric_value AS VARCHAR) AS DOUBLE) AS valuenum
FROM (SELECT *, TRY_CAST(split_part(code, '//', 2) AS INTEGER) AS itemid
      FROM ${events} WHERE starts_with(code, 'LAB//') AND icustay_id IS NOT NULL)
WHERE itemid IS NOT NULL

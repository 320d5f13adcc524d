-- Concept: the chartevents rows of the vital signs: one row per distinct
-- (stay_id, itemid, charttime, valuenum) of a vital itemid with a valid value, with n_rows the
-- number of source rows it stands for (identical duplicated rows are collapsed here and counted).
-- Source: MIT-LCP mimic-code mimic-iv/concepts/measurement/vitalsign.sql (itemids and valid
-- ranges, Fahrenheit 223761 converted to Celsius), ABPS paper Appendix A (first-24-h vitals).
-- Parameters: <chartevents> (table expression: the source, or its rows inside the vital window,
--   vital_window.sql).
-- No window here: the chartevents cache (etl/chart_cache.py) stores vitalsign.sql over the
-- whole file, and each run applies the window to it. Used as a subquery of vitalsign.sql.
WITH vital_item(itemid, vital, lo, hi, hi_incl, f2c) AS (
    VALUES
        (220045, 'heart_rate', 0, 300, false, false),
        (220179, 'sbp', 0, 400, false, false),
        (220050, 'sbp', 0, 400, false, false),
        (225309, 'sbp', 0, 400, false, false),
        (220180, 'dbp', 0, 300, false, false),
        (220051, 'dbp', 0, 300, false, false),
        (225310, 'dbp', 0, 300, false, false),
        (220181, 'mbp', 0, 300, false, false),
        (220052, 'mbp', 0, 300, false, false),
        (225312, 'mbp', 0, 300, false, false),
        (220210, 'resp_rate', 0, 70, false, false),
        (224690, 'resp_rate', 0, 70, false, false),
        (220277, 'spo2', 0, 100, true, false),
        (223761, 'temperature', 70, 120, false, true),
        (223762, 'temperature', 10, 50, false, false)
),
distinct_rows AS (
    -- the distinct-row key is (stay_id, charttime, itemid, valuenum): itemid fixes vital and f2c,
    -- so grouping on four fixed-width columns gives the same groups at a lower hashing cost
    SELECT c.stay_id, c.charttime, c.itemid, c.valuenum, count(*) AS n_rows
    FROM ${chartevents} c
    JOIN vital_item m ON c.itemid = m.itemid
    WHERE c.valuenum > m.lo AND (c.valuenum < m.hi OR (m.hi_incl AND c.valuenum = m.hi))
    GROUP BY c.stay_id, c.charttime, c.itemid, c.valuenum
)
SELECT r.stay_id, m.vital, r.charttime, r.itemid,
       CASE WHEN m.f2c THEN (r.valuenum - 32) / 1.8 ELSE r.valuenum END AS v,
       r.n_rows
FROM distinct_rows r
JOIN vital_item m ON r.itemid = m.itemid

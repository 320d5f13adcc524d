-- Concept: the chartevents rows of the first-day vital signs: one row per distinct
-- (stay_id, itemid, charttime, valuenum) inside the stay's window, with n_rows the number of
-- source rows it stands for (identical duplicated rows are collapsed here and counted).
-- Source: MIT-LCP mimic-code mimic-iv/concepts/measurement/vitalsign.sql (itemids and valid
-- ranges, Fahrenheit 223761 converted to Celsius) and firstday/first_day_vitalsign.sql (window
-- intime - 6 h .. intime + 24 h, here intime + <from_hours> h .. intime + 24 h, default 0),
-- ABPS paper Appendix A (first-24-h vitals).
-- Parameters: <chartevents> (table expression), <from_hours> (window start, hours), relation
--   kept (stay_id, intime) of the kept stays.
-- chartevents is scanned once, streaming: only vital itemids of kept stays in their window.
-- Used as a subquery of vitalsign.sql (never materialized: one aggregation pass less).
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
win AS (
    SELECT stay_id,
           intime + to_microseconds(CAST(${from_hours} * 3600e6 AS BIGINT)) AS t0,
           intime + INTERVAL 24 HOUR AS t1
    FROM kept
),
distinct_rows AS (
    -- the distinct-row key is (stay_id, charttime, itemid, valuenum): itemid fixes vital and f2c,
    -- so grouping on four fixed-width columns gives the same groups at a lower hashing cost
    SELECT c.stay_id, c.charttime, c.itemid, c.valuenum, count(*) AS n_rows
    FROM ${chartevents} c
    JOIN vital_item m ON c.itemid = m.itemid
    JOIN win w ON c.stay_id = w.stay_id
    WHERE c.valuenum > m.lo AND (c.valuenum < m.hi OR (m.hi_incl AND c.valuenum = m.hi))
      AND c.charttime >= w.t0 AND c.charttime <= w.t1
    GROUP BY c.stay_id, c.charttime, c.itemid, c.valuenum
)
SELECT r.stay_id, m.vital, r.charttime, r.itemid,
       CASE WHEN m.f2c THEN (r.valuenum - 32) / 1.8 ELSE r.valuenum END AS v,
       r.n_rows
FROM distinct_rows r
JOIN vital_item m ON r.itemid = m.itemid

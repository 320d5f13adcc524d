-- Concept: the rows of <rows> charted inside their stay's vital window, for the stays of <stays>.
-- Source: MIT-LCP mimic-code mimic-iv/concepts/firstday/first_day_vitalsign.sql (window
-- intime - 6 h .. intime + 24 h, here intime + <from_hours> h .. intime + 24 h, default 0),
-- ABPS paper Appendix A (first-24-h vitals).
-- Parameters: <rows> (table expression with stay_id and charttime: raw chartevents rows, or the
--   per-charttime rows of vitalsign.sql read from the chartevents cache), <from_hours> (window
--   start, hours), <stays> (relation with stay_id and intime: kept, the kept stays; or all_stays
--   with the earliest --vitals-from-hours, the rows the chartevents cache holds).
-- The window depends on a row's stay and charttime only, so it gives the same result before
-- the per-charttime aggregation (uncached: fewer rows to aggregate) or after it (cached).
SELECT r.*
FROM ${rows} r
JOIN (
    SELECT stay_id,
           intime + to_microseconds(CAST(${from_hours} * 3600e6 AS BIGINT)) AS t0,
           intime + INTERVAL 24 HOUR AS t1
    FROM ${stays}
) w ON r.stay_id = w.stay_id
WHERE r.charttime >= w.t0 AND r.charttime <= w.t1

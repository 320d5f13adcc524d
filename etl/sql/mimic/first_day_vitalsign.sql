-- Concept: first-day vital signs per stay: mean, min and max of the per-charttime values of
-- each vital over the window (columns of etl.schema.VITAL_COLUMNS, in contract order).
-- Source: MIT-LCP mimic-code mimic-iv/concepts/firstday/first_day_vitalsign.sql (min / max /
-- mean per stay over the first day), ABPS paper Appendix A (first-24-h vitals as features).
-- Values are rounded to 1e-6 so that the thread-dependent order of floating-point sums cannot
-- change the output (same input, same bytes).
-- Input: relation vitalsign (etl/sql/mimic/vitalsign.sql). A stay without a valid value of a
-- vital gets nulls (imputed per center at training time, federation/data.py).
SELECT stay_id,
    round(avg(v) FILTER (WHERE vital = 'heart_rate'), 6) AS heart_rate_mean,
    round(min(v) FILTER (WHERE vital = 'heart_rate'), 6) AS heart_rate_min,
    round(max(v) FILTER (WHERE vital = 'heart_rate'), 6) AS heart_rate_max,
    round(avg(v) FILTER (WHERE vital = 'sbp'), 6) AS sbp_mean,
    round(min(v) FILTER (WHERE vital = 'sbp'), 6) AS sbp_min,
    round(max(v) FILTER (WHERE vital = 'sbp'), 6) AS sbp_max,
    round(avg(v) FILTER (WHERE vital = 'dbp'), 6) AS dbp_mean,
    round(min(v) FILTER (WHERE vital = 'dbp'), 6) AS dbp_min,
    round(max(v) FILTER (WHERE vital = 'dbp'), 6) AS dbp_max,
    round(avg(v) FILTER (WHERE vital = 'mbp'), 6) AS mbp_mean,
    round(min(v) FILTER (WHERE vital = 'mbp'), 6) AS mbp_min,
    round(max(v) FILTER (WHERE vital = 'mbp'), 6) AS mbp_max,
    round(avg(v) FILTER (WHERE vital = 'resp_rate'), 6) AS resp_rate_mean,
    round(min(v) FILTER (WHERE vital = 'resp_rate'), 6) AS resp_rate_min,
    round(max(v) FILTER (WHERE vital = 'resp_rate'), 6) AS resp_rate_max,
    round(avg(v) FILTER (WHERE vital = 'spo2'), 6) AS spo2_mean,
    round(min(v) FILTER (WHERE vital = 'spo2'), 6) AS spo2_min,
    round(max(v) FILTER (WHERE vital = 'spo2'), 6) AS spo2_max,
    round(avg(v) FILTER (WHERE vital = 'temperature'), 6) AS temperature_mean,
    round(min(v) FILTER (WHERE vital = 'temperature'), 6) AS temperature_min,
    round(max(v) FILTER (WHERE vital = 'temperature'), 6) AS temperature_max
FROM vitalsign
GROUP BY stay_id

-- Concept: first-day vital signs per stay, wide: mean, min and max of each vital (columns of
-- etl.schema.VITAL_COLUMNS, in contract order).
-- Source: MIT-LCP mimic-code mimic-iv/concepts/firstday/first_day_vitalsign.sql (min / max /
-- mean per stay over the first day), ABPS paper Appendix A (first-24-h vitals as features).
-- Values are rounded to 1e-6 so that the thread-dependent order of floating-point sums cannot
-- change the output (same input, same bytes).
-- Input: relation vital_per_stay (etl/sql/mimic/vital_per_stay.sql, one row per stay and vital).
-- A stay without a valid value of a vital gets nulls (imputed per center at training time,
-- federation/data.py).
SELECT stay_id,
    round(any_value(v_mean) FILTER (WHERE vital = 'heart_rate'), 6) AS heart_rate_mean,
    round(any_value(v_min) FILTER (WHERE vital = 'heart_rate'), 6) AS heart_rate_min,
    round(any_value(v_max) FILTER (WHERE vital = 'heart_rate'), 6) AS heart_rate_max,
    round(any_value(v_mean) FILTER (WHERE vital = 'sbp'), 6) AS sbp_mean,
    round(any_value(v_min) FILTER (WHERE vital = 'sbp'), 6) AS sbp_min,
    round(any_value(v_max) FILTER (WHERE vital = 'sbp'), 6) AS sbp_max,
    round(any_value(v_mean) FILTER (WHERE vital = 'dbp'), 6) AS dbp_mean,
    round(any_value(v_min) FILTER (WHERE vital = 'dbp'), 6) AS dbp_min,
    round(any_value(v_max) FILTER (WHERE vital = 'dbp'), 6) AS dbp_max,
    round(any_value(v_mean) FILTER (WHERE vital = 'mbp'), 6) AS mbp_mean,
    round(any_value(v_min) FILTER (WHERE vital = 'mbp'), 6) AS mbp_min,
    round(any_value(v_max) FILTER (WHERE vital = 'mbp'), 6) AS mbp_max,
    round(any_value(v_mean) FILTER (WHERE vital = 'resp_rate'), 6) AS resp_rate_mean,
    round(any_value(v_min) FILTER (WHERE vital = 'resp_rate'), 6) AS resp_rate_min,
    round(any_value(v_max) FILTER (WHERE vital = 'resp_rate'), 6) AS resp_rate_max,
    round(any_value(v_mean) FILTER (WHERE vital = 'spo2'), 6) AS spo2_mean,
    round(any_value(v_min) FILTER (WHERE vital = 'spo2'), 6) AS spo2_min,
    round(any_value(v_max) FILTER (WHERE vital = 'spo2'), 6) AS spo2_max,
    round(any_value(v_mean) FILTER (WHERE vital = 'temperature'), 6) AS temperature_mean,
    round(any_value(v_min) FILTER (WHERE vital = 'temperature'), 6) AS temperature_min,
    round(any_value(v_max) FILTER (WHERE vital = 'temperature'), 6) AS temperature_max
FROM vital_per_stay
GROUP BY stay_id

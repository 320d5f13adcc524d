-- Concept: first-day vital signs per stay and vital: mean, min and max of the per-charttime
-- values over the window, and the source / distinct rows behind them.
-- Source: MIT-LCP mimic-code mimic-iv/concepts/firstday/first_day_vitalsign.sql (min / max /
-- mean per stay over the first day), ABPS paper Appendix A (first-24-h vitals as features).
-- Parameters: <vitalsign> (vitalsign.sql rows inside the window, vital_window.sql).
-- One group per (stay, vital) with three aggregates: the same values as 21 filtered
-- aggregates per stay, at a fraction of the cost; first_day_vitalsign.sql turns it wide.
SELECT stay_id, vital, avg(v) AS v_mean, min(v) AS v_min, max(v) AS v_max,
       sum(n_rows) AS n_rows, sum(n_distinct) AS n_distinct
FROM ${vitalsign}
GROUP BY stay_id, vital

-- Concept: vital signs per charttime: one value per (stay_id, vital, charttime), the mean of
-- the valid values charted at that time (e.g. a non-invasive and an arterial SBP).
-- Source: MIT-LCP mimic-code mimic-iv/concepts/measurement/vitalsign.sql (one row per
-- stay and charttime, values averaged with AVG(CASE ...)), ABPS paper Appendix A.
-- n_rows / n_distinct: source rows and distinct rows behind the value (their totals give the
-- identical duplicates collapsed, an attrition row).
-- Parameters: <vital_rows> (etl/sql/mimic/vital_rows.sql as a subquery, one row per distinct
--   source row). This relation, over the rows of the stays' widest vital windows, is what the
--   chartevents cache stores (etl.mimic.cached_vitalsign_sql).
SELECT stay_id, vital, charttime, avg(v) AS v, sum(n_rows) AS n_rows, count(*) AS n_distinct
FROM ${vital_rows}
GROUP BY stay_id, vital, charttime

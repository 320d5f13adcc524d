-- Concept: the 12 updated-Charlson flags per eICU stay, the union (max) of three sources:
-- pastHistory paths, apachePredVar chronic-condition flags and the stay's ICD codes.
-- Source: eICU-CRD documentation, tables pastHistory (pasthistorypath) and apachePredVar
-- (APACHE IV chronic health items aids, hepaticfailure, lymphoma, metastaticcancer, leukemia,
-- cirrhosis), Charlson conditions of Quan et al. (2011), ABPS paper Sec. 6.1. The mapping table
-- is docs/eicu.md. A path matches a fragment when it contains it, one path can set several flags.
-- Parameters: <pastHistory> <apachePredVar> (table expressions), <icd_flags> (the wide output
--   of etl/sql/charlson.sql over etl/sql/eicu/diagnosis_icd.sql, hadm_id = stay_id),
--   relation kept (stay_id).
-- Output: one row per stay with at least one flag: stay_id, cci_chf ... cci_aids (TINYINT).
WITH past_history_map(fragment, flag) AS (
    VALUES
        ('/Congestive Heart Failure/', 'cci_chf'),
        ('/Neurologic/Dementia/', 'cci_dementia'),
        ('/Pulmonary/COPD/', 'cci_chronic_pulmonary'),
        ('/Pulmonary/Asthma/', 'cci_chronic_pulmonary'),
        ('/Pulmonary/Restrictive Disease/', 'cci_chronic_pulmonary'),
        ('/Rheumatic/Rheumatoid Arthritis/', 'cci_rheumatic'),
        ('/Rheumatic/SLE/', 'cci_rheumatic'),
        ('/Rheumatic/Scleroderma/', 'cci_rheumatic'),
        ('/Cirrhosis/', 'cci_mild_liver'),
        ('/Cirrhosis/varices', 'cci_severe_liver'),
        ('/Cirrhosis/encephalopathy', 'cci_severe_liver'),
        ('/Cirrhosis/ascites', 'cci_severe_liver'),
        ('/Cirrhosis/UGI bleeding', 'cci_severe_liver'),
        ('/Renal Failure/', 'cci_renal'),
        ('/Renal Insufficiency/', 'cci_renal'),
        ('/s/p Renal Transplant/', 'cci_renal'),
        ('/Cancer/Cancer-Primary Site/', 'cci_malignancy'),
        ('/Cancer/Hematologic Malignancy/', 'cci_malignancy'),
        ('/Cancer/Metastases/', 'cci_metastatic'),
        ('/HIV (only)', 'cci_aids')
), apache_map(item, flag) AS (
    VALUES
        ('aids', 'cci_aids'), ('hepaticfailure', 'cci_severe_liver'), ('lymphoma', 'cci_malignancy'),
        ('leukemia', 'cci_malignancy'), ('metastaticcancer', 'cci_metastatic'), ('cirrhosis', 'cci_mild_liver')
), flags(stay_id, flag) AS (
    SELECT h.patientunitstayid, m.flag
    FROM ${pastHistory} h JOIN past_history_map m ON contains(h.pasthistorypath, m.fragment)
    WHERE h.patientunitstayid IN (SELECT stay_id FROM kept)
    UNION ALL
    SELECT u.stay_id, m.flag
    FROM (UNPIVOT (SELECT patientunitstayid AS stay_id, aids, hepaticfailure, lymphoma, metastaticcancer,
                          leukemia, cirrhosis
                   FROM ${apachePredVar} WHERE patientunitstayid IN (SELECT stay_id FROM kept))
          ON aids, hepaticfailure, lymphoma, metastaticcancer, leukemia, cirrhosis
          INTO NAME item VALUE value) u
    JOIN apache_map m USING (item)
    WHERE u.value = 1
    UNION ALL
    SELECT u.stay_id, u.flag
    FROM (UNPIVOT (SELECT hadm_id AS stay_id, * EXCLUDE (hadm_id) FROM (${icd_flags}))
          ON COLUMNS(* EXCLUDE (stay_id)) INTO NAME flag VALUE value) u
    WHERE u.value = 1
)
SELECT stay_id,
    max(flag = 'cci_chf')::TINYINT AS cci_chf,
    max(flag = 'cci_dementia')::TINYINT AS cci_dementia,
    max(flag = 'cci_chronic_pulmonary')::TINYINT AS cci_chronic_pulmonary,
    max(flag = 'cci_rheumatic')::TINYINT AS cci_rheumatic,
    max(flag = 'cci_mild_liver')::TINYINT AS cci_mild_liver,
    max(flag = 'cci_diabetes_complicated')::TINYINT AS cci_diabetes_complicated,
    max(flag = 'cci_paraplegia')::TINYINT AS cci_paraplegia,
    max(flag = 'cci_renal')::TINYINT AS cci_renal,
    max(flag = 'cci_malignancy')::TINYINT AS cci_malignancy,
    max(flag = 'cci_severe_liver')::TINYINT AS cci_severe_liver,
    max(flag = 'cci_metastatic')::TINYINT AS cci_metastatic,
    max(flag = 'cci_aids')::TINYINT AS cci_aids
FROM flags
GROUP BY stay_id

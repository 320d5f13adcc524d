-- Concept: updated-Charlson comorbidity flags (12 binaries) per admission, from ICD-9-CM and
-- ICD-10 diagnosis codes. Shared by both sources.
-- Source: the 12 conditions of the updated Charlson index, Quan et al. (2011), Am J Epidemiol
-- 173:676-682, code lists per condition: Quan et al. (2005), Med Care 43:1130-1139, Table 1
-- (enhanced ICD-9-CM and ICD-10), the lists MIT-LCP mimic-code implements in
-- mimic-iv/concepts/comorbidity/charlson.sql. ABPS paper Sec. 6.1 / 6.3 (features and v_i).
-- Differences from mimic-code (docs/charlson.md): no hierarchy (every flag independent), no
-- weighted score, prefix matching on trimmed, upper-cased, dot-less codes.
-- Parameters (filled by etl.charlson.charlson_flags_sql from etl.charlson.CCI_PREFIXES):
--   <prefixes>      VALUES rows (condition, icd_version, prefix)
--   <trim_chars>    the characters trimmed from a code
--   <flag_columns>  one count(*) FILTER pivot per condition, in etl.schema order
--   <diagnoses>     a relation with columns hadm_id, icd_code, icd_version
-- Output: one row per distinct non-null hadm_id: hadm_id, cci_chf ... cci_aids (TINYINT 0/1).
WITH cci_prefix(condition, icd_version, prefix) AS (
    VALUES
        ${prefixes}
),
cci_diagnoses AS (
    SELECT
        src.hadm_id AS hadm_id,
        CAST(src.icd_version AS INTEGER) AS icd_version,
        replace(upper(trim(CAST(src.icd_code AS VARCHAR), ${trim_chars})), '.', '') AS icd_code
    FROM ${diagnoses} AS src
    WHERE src.hadm_id IS NOT NULL
),
cci_code_condition AS (
    -- the distinct codes (about 30 k in full MIMIC-IV against 6.4 M rows) matched once
    SELECT DISTINCT codes.icd_version, codes.icd_code, p.condition
    FROM (
        SELECT DISTINCT icd_version, icd_code
        FROM cci_diagnoses
        WHERE icd_code IS NOT NULL AND icd_code <> ''
    ) AS codes
    JOIN cci_prefix AS p
      ON codes.icd_version = p.icd_version AND starts_with(codes.icd_code, p.prefix)
)
SELECT
    d.hadm_id,
    ${flag_columns}
FROM cci_diagnoses AS d
LEFT JOIN cci_code_condition AS cc
  ON d.icd_version = cc.icd_version AND d.icd_code = cc.icd_code
GROUP BY d.hadm_id
ORDER BY d.hadm_id

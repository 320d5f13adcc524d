-- Concept: task label decompensation - death within <horizon_hours> h after the first
-- <at_hours> h of the unit stay (one row per unit stay: stay_id, label).
-- Source: Harutyunyan et al. 2019 (Sci Data 6:96), decompensation benchmark (label at hour t:
-- death within the next 24 h, for t within the stay and before death), sample t = <at_hours> h;
-- eICU-CRD documentation, table patient (Pollard et al. 2018, Sci Data 5:180178): offsets are
-- minutes from unit admission. Time of death: unitdischargeoffset when unitdischargestatus =
-- 'Expired' (death in the unit), else hospitaldischargeoffset when hospitaldischargestatus =
-- 'Expired'. A stay that left the unit or died before t has no label (NULL, dropped), nor has
-- one with an empty unit offset, or with an empty hospital status and no death in the unit.
-- Parameters: <patient> (table expression), <at_hours>, <horizon_hours> (numbers).
SELECT stay_id,
       CASE WHEN unitdischargeoffset IS NULL THEN NULL
            WHEN unitdischargeoffset < ${at_hours} * 60 THEN NULL
            WHEN death_offset IS NOT NULL AND death_offset < ${at_hours} * 60 THEN NULL
            WHEN death_offset IS NOT NULL THEN CAST(death_offset < (${at_hours} + ${horizon_hours}) * 60 AS TINYINT)
            WHEN hospitaldischargestatus = 'Alive' THEN 0
            END::TINYINT AS label
FROM (SELECT p.patientunitstayid AS stay_id, p.unitdischargeoffset, p.hospitaldischargestatus,
             CASE WHEN p.unitdischargestatus = 'Expired' THEN p.unitdischargeoffset
                  WHEN p.hospitaldischargestatus = 'Expired' THEN p.hospitaldischargeoffset END AS death_offset
      FROM ${patient} p)

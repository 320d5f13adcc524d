"""Data in: MIMIC-IV cohort ETL, synthetic MIMIC-format data, partitions into centers, reports."""

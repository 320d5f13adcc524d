"""Every reader names its file (and column): Parquet tables whose integer columns are stored as
DECIMAL are refused, not rounded, when a value is fractional, as in a CSV."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb

from cli.app import main

TABLES = ("hosp/patients", "hosp/admissions", "hosp/diagnoses_icd", "icu/icustays", "icu/chartevents")


def _as_parquet(src: Path, dst: Path, decimal_age: float | None) -> Path:
    con = duckdb.connect()
    for rel in TABLES:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        sel = "*"
        if rel == "hosp/patients" and decimal_age is not None:  # anchor_age stored as DECIMAL(6, 1)
            sel = (f"* REPLACE (CAST(CASE WHEN row_number() OVER () = 1 THEN {decimal_age} ELSE anchor_age END "
                   "AS DECIMAL(6, 1)) AS anchor_age)")
        con.execute(f"COPY (SELECT {sel} FROM read_csv_auto('{src / rel}.csv.gz')) TO '{dst / rel}.parquet' "
                    "(FORMAT parquet)")
    return dst


def _etl(capsys, src: Path, out: Path) -> tuple[int, str]:
    try:
        main(["etl", "--mimic-dir", str(src), "--out", str(out), "--window-years", "20", "--min-center-stays", "1",
              "--threads", "1", "--chart-cache", "off"])
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_a_fractional_decimal_in_an_integer_column_is_refused(mimic_demo_dir, tmp_path, capsys):
    whole = _as_parquet(mimic_demo_dir, tmp_path / "whole", 52.0)  # a DECIMAL holding a whole number reads
    code, err = _etl(capsys, whole, tmp_path / "o1")
    assert code == 0, err
    frac = _as_parquet(mimic_demo_dir, tmp_path / "frac", 52.5)
    code, err = _etl(capsys, frac, tmp_path / "o2")
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("warning:")]
    assert code == 2 and len(lines) == 1, err
    assert "patients.parquet" in lines[0] and "anchor_age" in lines[0] and "whole" in lines[0], lines[0]
    assert not (tmp_path / "o2").exists()


def test_an_empty_diagnoses_table_gives_a_warning(mimic_demo_dir, tmp_path, capsys):
    import gzip

    src = tmp_path / "m"
    for rel in TABLES:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(mimic_demo_dir / f"{rel}.csv.gz", src / f"{rel}.csv.gz")
    dx = src / "hosp" / "diagnoses_icd.csv.gz"
    dx.chmod(0o644)
    dx.write_bytes(gzip.compress(gzip.decompress(dx.read_bytes()).split(b"\n", 1)[0] + b"\n"))  # header only
    code, err = _etl(capsys, src, tmp_path / "o")
    assert code == 0, err
    (line,) = [ln for ln in err.splitlines() if "diagnoses_icd" in ln]
    assert line.startswith("warning: ") and "diagnoses_icd.csv.gz: no data rows" in line

"""The chartevents Parquet cache (etl/chart_cache.py): the same cohort with and without it on the
real MIMIC-IV demo, and every change of the source (size, mtime, content with size and mtime
kept) or of the cache file rebuilds it instead of reading stale rows."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest

from etl.chart_cache import default_cache_dir, fingerprint, use_cache
from etl.errors import InputError
from etl.mimic import REQUIRED, TYPES, EtlOptions, run_etl
from etl.sources import connect, locate

COLS = REQUIRED[("icu", "chartevents")]
OPTS = dict(window_years=20, min_center_stays=1, seed=7)


def _frames(out: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    return pl.read_parquet(out / "cohort.parquet"), pl.read_parquet(out / "centers.parquet")


def _demo_copy(mimic_demo_dir: Path, dest: Path) -> Path:
    """The demo with links to its tables, except a real copy of chartevents (changed by tests)."""
    for sub in ("hosp", "icu"):
        (dest / sub).mkdir(parents=True)
        for f in (mimic_demo_dir / sub).iterdir():
            if f.name.startswith(("patients", "admissions", "diagnoses_icd", "icustays")):
                (dest / sub / f.name).symlink_to(f)
    shutil.copy2(mimic_demo_dir / "icu/chartevents.csv.gz", dest / "icu/chartevents.csv.gz")
    return dest


def test_same_cohort_with_and_without_cache_on_the_demo(mimic_demo_dir, tmp_path):
    cache = tmp_path / "cache"
    off = run_etl(mimic_demo_dir, tmp_path / "off", EtlOptions(**OPTS, chart_cache="off"))
    first = run_etl(mimic_demo_dir, tmp_path / "first", EtlOptions(**OPTS, chart_cache=str(cache)))
    again = run_etl(mimic_demo_dir, tmp_path / "again", EtlOptions(**OPTS, chart_cache=str(cache)))
    assert off["chartevents_cache"]["status"] == "off"
    assert first["chartevents_cache"]["status"] == "written"
    assert again["chartevents_cache"]["status"] == "hit"
    # rows in the cache = data lines of the source, counted without DuckDB
    with gzip.open(mimic_demo_dir / "icu/chartevents.csv.gz", "rt") as fh:
        n_lines = sum(1 for _ in fh) - 1
    assert first["chartevents_cache"]["rows"] == again["chartevents_cache"]["rows"] == n_lines
    base = _frames(tmp_path / "off")
    for d in ("first", "again"):
        got = _frames(tmp_path / d)
        assert got[0].equals(base[0]) and got[1].equals(base[1])
    assert first["attrition"] == off["attrition"] == again["attrition"]
    assert "chartevents Parquet cache: hit" in (tmp_path / "again" / "cohort_report.md").read_text()
    # the cached rows are the source's rows, typed (an independent Polars read of the CSV)
    parquet = next(cache.glob("*.parquet"))
    src = (pl.read_csv(mimic_demo_dir / "icu/chartevents.csv.gz", columns=list(COLS), infer_schema_length=0)
           .with_columns(pl.col("stay_id").cast(pl.Int64), pl.col("itemid").cast(pl.Int32),
                         pl.col("valuenum").cast(pl.Float64),
                         pl.col("charttime").str.to_datetime("%Y-%m-%d %H:%M:%S", time_unit="us")))
    got = pl.read_parquet(parquet).select(COLS)
    key = list(COLS)
    assert got.sort(key, nulls_last=True).equals(src.sort(key, nulls_last=True))


def test_changed_demo_source_rebuilds_and_matches_uncached(mimic_demo_dir, tmp_path):
    demo = _demo_copy(mimic_demo_dir, tmp_path / "demo")
    cache = tmp_path / "cache"
    run_etl(demo, tmp_path / "a", EtlOptions(**OPTS, chart_cache=str(cache)))
    # drop every heart-rate row of the source: a real change of the cohort's vitals
    ce = demo / "icu/chartevents.csv.gz"
    lines = gzip.open(ce, "rt").read().splitlines(keepends=True)
    kept = [ln for ln in lines if ",220045," not in ln]
    assert len(kept) < len(lines)
    with gzip.open(ce, "wt") as fh:
        fh.writelines(kept)
    rep = run_etl(demo, tmp_path / "b", EtlOptions(**OPTS, chart_cache=str(cache)))
    assert rep["chartevents_cache"]["status"] == "rebuilt"
    assert rep["chartevents_cache"]["reason"] == "source size changed"
    assert rep["chartevents_cache"]["rows"] == len(kept) - 1
    run_etl(demo, tmp_path / "c", EtlOptions(**OPTS, chart_cache="off"))
    b, c = _frames(tmp_path / "b"), _frames(tmp_path / "c")
    assert b[0].equals(c[0]) and b[1].equals(c[1])
    assert not _frames(tmp_path / "a")[0].equals(b[0])  # the change reached the cohort
    assert len(list(cache.iterdir())) == 2  # one entry (Parquet + manifest) per source file


def _small_csv(path: Path, rows: list[tuple]) -> None:
    text = "subject_id,stay_id,charttime,itemid,value,valuenum\n"
    text += "".join(f"1,{s},{t},{i},x,{v}\n" for s, t, i, v in rows)
    path.write_text(text)


ROWS = [(30000001, "2150-01-01 10:00:00", 220045, 81.0), (30000001, "2150-01-01 11:00:00", 220045, 90.0),
        (30000002, "2150-02-01 10:00:00", 220210, 17.0)]


def _src(tmp_path: Path, rows: list[tuple] = ROWS) -> Path:
    src = tmp_path / "m/icu/chartevents.csv"
    src.parent.mkdir(parents=True, exist_ok=True)
    _small_csv(src, rows)
    return src


def _use(path: Path, cache: Path):
    table = locate(path.parent.parent, "icu", "chartevents", COLS, TYPES)
    with contextlib.closing(connect()) as con:
        res = use_cache(con, table, TYPES, COLS, str(cache))
        rows = con.execute(f"SELECT * FROM {res.table.scan_sql(TYPES)} ORDER BY charttime").fetchall()
    return res, rows


def test_content_change_with_same_size_and_mtime_is_caught(tmp_path):
    src = _src(tmp_path)
    cache = tmp_path / "cache"
    res, rows = _use(src, cache)
    assert res.status == "written" and res.rows == 3 and res.table.is_parquet
    assert [r[3] for r in rows] == [81.0, 90.0, 17.0]
    res, _ = _use(src, cache)
    assert res.status == "hit"
    st = src.stat()
    _src(tmp_path, [ROWS[0], (30000001, "2150-01-01 11:00:00", 220045, 99.0), ROWS[2]])  # 90 -> 99
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert src.stat().st_size == st.st_size and src.stat().st_mtime_ns == st.st_mtime_ns
    res, rows = _use(src, cache)
    assert (res.status, res.reason) == ("rebuilt", "source content hash changed")
    assert [r[3] for r in rows] == [81.0, 99.0, 17.0]
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched only
    res, _ = _use(src, cache)
    assert (res.status, res.reason) == ("rebuilt", "source mtime changed")


def test_damaged_or_foreign_cache_file_is_rebuilt(tmp_path):
    src = _src(tmp_path)
    cache = tmp_path / "cache"
    res, _ = _use(src, cache)
    parquet = res.table.path
    pl.DataFrame({"stay_id": [1], "charttime": [None], "itemid": [1], "valuenum": [1.0]}).write_parquet(parquet)
    res, rows = _use(src, cache)
    assert (res.status, res.reason) == ("rebuilt", "cache file row count differs from its manifest")
    assert len(rows) == 3
    parquet.write_bytes(b"not parquet")
    res, rows = _use(src, cache)
    assert res.status == "rebuilt" and len(rows) == 3
    manifest = next(cache.glob("*.json"))
    doc = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**doc, "format": 0}))
    res, _ = _use(src, cache)
    assert (res.status, res.reason) == ("rebuilt", "cache format changed")
    assert doc["source"] == fingerprint(src) and doc["rows"] == 3


def test_unwritable_cache_reads_the_source(tmp_path):
    src = _src(tmp_path)
    blocker = tmp_path / "cache"
    blocker.write_text("a file, not a folder")
    res, rows = _use(src, blocker)
    assert res.status == "unwritable" and res.table.path == src and len(rows) == 3


def test_auto_skips_small_sources_and_other_sources_refuse_the_option(mimic_demo_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ABPS_CACHE_DIR", str(tmp_path / "home-cache"))
    assert default_cache_dir() == tmp_path / "home-cache" / "chartevents"
    rep = run_etl(mimic_demo_dir, tmp_path / "o", EtlOptions(**OPTS))  # auto: the 2.6 MB demo is not cached
    assert rep["chartevents_cache"]["status"] == "off" and not (tmp_path / "home-cache").exists()
    with pytest.raises(InputError, match="--chart-cache does not apply to --source eicu"):
        EtlOptions(min_center_stays=10, chart_cache="off").validate("eicu")
    with pytest.raises(InputError, match="--chart-cache does not apply to --source meds"):
        EtlOptions(chart_cache="off").validate("meds")

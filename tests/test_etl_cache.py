"""The chartevents Parquet cache (etl/chart_cache.py): the same cohort with and without it on the
real MIMIC-IV demo, the cached rows equal an independent Polars computation of the vitals per
charttime, and every change of the source (size, mtime, content with size and mtime kept), of
the cached query (itemids, ranges, ETL version) or of the cache file rebuilds it instead of
reading stale rows."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

import etl.mimic
from etl.chart_cache import default_cache_dir, fingerprint, may_hold, use_cache
from etl.errors import InputError
from etl.mimic import REQUIRED, TYPES, VITALSIGN_ORDER, EtlOptions, run_etl, vitalsign_sql
from etl.sources import connect, locate

COLS = REQUIRED[("icu", "chartevents")]
OPTS = dict(window_years=20, min_center_stays=1, seed=7)
#: mimic-code measurement/vitalsign: itemid -> (vital, lo, hi, hi inclusive, Fahrenheit)
ITEMS = {220045: ("heart_rate", 0, 300, False, False), 220179: ("sbp", 0, 400, False, False),
         220050: ("sbp", 0, 400, False, False), 225309: ("sbp", 0, 400, False, False),
         220180: ("dbp", 0, 300, False, False), 220051: ("dbp", 0, 300, False, False),
         225310: ("dbp", 0, 300, False, False), 220181: ("mbp", 0, 300, False, False),
         220052: ("mbp", 0, 300, False, False), 225312: ("mbp", 0, 300, False, False),
         220210: ("resp_rate", 0, 70, False, False), 224690: ("resp_rate", 0, 70, False, False),
         220277: ("spo2", 0, 100, True, False), 223761: ("temperature", 70, 120, False, True),
         223762: ("temperature", 10, 50, False, False)}


def _stay_windows(mimic_dir: Path) -> pl.DataFrame:
    """Polars: the stays of icustays with an admission and a patient, and the widest vital window
    [intime - 48 h, intime + 24 h] (the earliest --vitals-from-hours)."""
    icu = pl.read_csv(mimic_dir / "icu/icustays.csv.gz", infer_schema_length=0)
    adm = pl.read_csv(mimic_dir / "hosp/admissions.csv.gz", columns=["hadm_id"], infer_schema_length=0)
    pat = pl.read_csv(mimic_dir / "hosp/patients.csv.gz", columns=["subject_id"], infer_schema_length=0)
    intime = pl.col("intime").str.to_datetime("%Y-%m-%d %H:%M:%S", time_unit="us")
    return (icu.join(adm, on="hadm_id", how="semi").join(pat, on="subject_id", how="semi")
            .select(pl.col("stay_id").cast(pl.Int64), (intime - pl.duration(hours=48)).alias("t0"),
                    (intime + pl.duration(hours=24)).alias("t1")))


def _vitals_per_charttime(csv: Path, mimic_dir: Path | None = None) -> pl.DataFrame:
    """Polars, from the CSV: valid vital rows (of ``mimic_dir``'s stays inside their widest window
    when given), identical rows collapsed, one mean per (stay_id, vital, charttime), with the
    source rows (n_rows) and distinct rows (n_distinct)."""
    items = pl.DataFrame({"itemid": list(ITEMS), "vital": [v[0] for v in ITEMS.values()],
                          "lo": [float(v[1]) for v in ITEMS.values()], "hi": [float(v[2]) for v in ITEMS.values()],
                          "incl": [v[3] for v in ITEMS.values()], "f2c": [v[4] for v in ITEMS.values()]},
                         schema_overrides={"itemid": pl.Int32})
    src = (pl.read_csv(csv, columns=list(COLS), infer_schema_length=0)
           .with_columns(pl.col("stay_id").cast(pl.Int64), pl.col("itemid").cast(pl.Int32),
                         pl.col("valuenum").cast(pl.Float64),
                         pl.col("charttime").str.to_datetime("%Y-%m-%d %H:%M:%S", time_unit="us")))
    ok = (pl.col("valuenum") > pl.col("lo")) & ((pl.col("valuenum") < pl.col("hi"))
                                                | (pl.col("incl") & (pl.col("valuenum") == pl.col("hi"))))
    if mimic_dir is not None:
        src = (src.join(_stay_windows(mimic_dir), on="stay_id")
               .filter((pl.col("charttime") >= pl.col("t0")) & (pl.col("charttime") <= pl.col("t1"))))
    rows = (src.join(items, on="itemid").filter(ok)
            .group_by("stay_id", "charttime", "itemid", "valuenum", "vital", "f2c").agg(pl.len().alias("n"))
            .with_columns(v=pl.when(pl.col("f2c")).then((pl.col("valuenum") - 32) / 1.8).otherwise(pl.col("valuenum"))))
    return (rows.group_by("stay_id", "vital", "charttime")
            .agg(pl.col("v").mean(), pl.col("n").sum().alias("n_rows"), pl.len().alias("n_distinct"))
            .sort("stay_id", "charttime", "vital"))


def _assert_cache_rows(parquet: Path, mimic_dir: Path) -> None:
    got = pl.read_parquet(parquet)
    want = _vitals_per_charttime(mimic_dir / "icu/chartevents.csv.gz", mimic_dir)
    assert got.columns == ["stay_id", "vital", "charttime", "v", "n_rows", "n_distinct"]
    assert got.height == want.height > 0
    # written sorted by stay, charttime, vital (VITALSIGN_ORDER)
    assert got.select("stay_id", "charttime", "vital").equals(want.select("stay_id", "charttime", "vital"))
    assert got["n_rows"].cast(pl.Int64).equals(want["n_rows"].cast(pl.Int64))
    assert got["n_distinct"].cast(pl.Int64).equals(want["n_distinct"].cast(pl.Int64))
    assert (got["v"] - want["v"]).abs().max() < 1e-9


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
    # rows in the cache = (stay, vital, charttime) groups of the source inside the stays' widest
    # windows, counted without DuckDB: 24,299 of the file's 87,221
    ce = mimic_demo_dir / "icu/chartevents.csv.gz"
    n_groups = _vitals_per_charttime(ce, mimic_demo_dir).height
    assert first["chartevents_cache"]["rows"] == again["chartevents_cache"]["rows"] == n_groups == 24_299
    assert _vitals_per_charttime(ce).height == 87_221
    base = _frames(tmp_path / "off")
    for d in ("first", "again"):
        got = _frames(tmp_path / d)
        assert got[0].equals(base[0]) and got[1].equals(base[1])
    assert first["attrition"] == off["attrition"] == again["attrition"]
    assert "chartevents Parquet cache: hit" in (tmp_path / "again" / "cohort_report.md").read_text()
    # the cached rows are the vitals per charttime of the source (an independent Polars computation)
    _assert_cache_rows(next(cache.glob("*.parquet")), mimic_demo_dir)


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
    _assert_cache_rows(next(cache.glob("*.parquet")), demo)
    run_etl(demo, tmp_path / "c", EtlOptions(**OPTS, chart_cache="off"))
    b, c = _frames(tmp_path / "b"), _frames(tmp_path / "c")
    assert b[0].equals(c[0]) and b[1].equals(c[1])
    assert not _frames(tmp_path / "a")[0].equals(b[0])  # the change reached the cohort
    assert len(list(cache.iterdir())) == 2  # one entry (Parquet + manifest) per source file


def test_the_widest_window_is_read_from_the_cache_and_changed_stays_rebuild_it(mimic_demo_dir, tmp_path):
    demo = _demo_copy(mimic_demo_dir, tmp_path / "demo")
    cache = tmp_path / "cache"
    widest = dict(OPTS, vitals_from_hours=-48)
    assert run_etl(demo, tmp_path / "a", EtlOptions(**OPTS, chart_cache=str(cache)))["chartevents_cache"]["status"] == "written"
    rep = run_etl(demo, tmp_path / "w", EtlOptions(**widest, chart_cache=str(cache)))
    run_etl(demo, tmp_path / "w_off", EtlOptions(**widest, chart_cache="off"))
    assert rep["chartevents_cache"]["status"] == "hit"
    w, w_off, a = _frames(tmp_path / "w"), _frames(tmp_path / "w_off"), _frames(tmp_path / "a")
    assert w[0].equals(w_off[0]) and not w[0].equals(a[0])  # rows charted before intime reach the cohort
    # one kept stay admitted 12 hours later: the cached rows of its window are stale, the entry is rebuilt
    icu = demo / "icu/icustays.csv.gz"
    lines = gzip.decompress(icu.read_bytes()).decode().splitlines(keepends=True)
    head = lines[0].rstrip().split(",")
    t, s = head.index("intime"), head.index("stay_id")
    kept = set(a[0]["stay_id"].to_list())
    i = next(i for i, ln in enumerate(lines[1:], 1) if int(ln.split(",")[s]) in kept)
    cells = lines[i].rstrip("\n").split(",")
    cells[t] = str(datetime.fromisoformat(cells[t]) + timedelta(hours=12))
    lines[i] = ",".join(cells) + "\n"
    icu.unlink()
    icu.write_bytes(gzip.compress("".join(lines).encode()))
    rep = run_etl(demo, tmp_path / "b", EtlOptions(**OPTS, chart_cache=str(cache)))
    assert (rep["chartevents_cache"]["status"], rep["chartevents_cache"]["reason"]) == (
        "rebuilt", "cached stays changed (stay_id or intime)")
    run_etl(demo, tmp_path / "b_off", EtlOptions(**OPTS, chart_cache="off"))
    b, b_off = _frames(tmp_path / "b"), _frames(tmp_path / "b_off")
    assert b[0].equals(b_off[0]) and b[1].equals(b_off[1]) and not b[0].equals(a[0])
    _assert_cache_rows(next(cache.glob("*.parquet")), demo)


def test_cache_of_another_itemid_set_or_etl_version_is_not_reused(mimic_demo_dir, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    a = run_etl(mimic_demo_dir, tmp_path / "a", EtlOptions(**OPTS, chart_cache=str(cache)))
    assert a["chartevents_cache"]["status"] == "written"
    # another ETL version: heart rate valid below 120 instead of 300 (the cached query's text changes)
    orig = etl.mimic.vitalsign_sql
    narrow = "(220045, 'heart_rate', 0, 120, false, false)"

    def version_b(ce: str) -> str:
        text = orig(ce)
        assert "(220045, 'heart_rate', 0, 300, false, false)" in text
        return text.replace("(220045, 'heart_rate', 0, 300, false, false)", narrow)

    monkeypatch.setattr(etl.mimic, "vitalsign_sql", version_b)
    b = run_etl(mimic_demo_dir, tmp_path / "b", EtlOptions(**OPTS, chart_cache=str(cache)))
    assert (b["chartevents_cache"]["status"], b["chartevents_cache"]["reason"]) == (
        "rebuilt", "cached query changed (itemids, valid ranges or ETL version)")
    run_etl(mimic_demo_dir, tmp_path / "b_off", EtlOptions(**OPTS, chart_cache="off"))
    fb, fb_off, fa = _frames(tmp_path / "b"), _frames(tmp_path / "b_off"), _frames(tmp_path / "a")
    assert fb[0].equals(fb_off[0]) and fb[0]["heart_rate_max"].max() < 120 <= fa[0]["heart_rate_max"].max()
    monkeypatch.setattr(etl.mimic, "vitalsign_sql", orig)  # back to this version: rebuilt again, same cohort as a
    c = run_etl(mimic_demo_dir, tmp_path / "c", EtlOptions(**OPTS, chart_cache=str(cache)))
    assert c["chartevents_cache"]["status"] == "rebuilt" and _frames(tmp_path / "c")[0].equals(fa[0])


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


def _use(path: Path, cache: Path | str, query=vitalsign_sql):
    """use_cache on a small source; the per-charttime rows it gives (from the cache or the source)."""
    table = locate(path.parent.parent, "icu", "chartevents", COLS, TYPES)
    with contextlib.closing(connect()) as con:
        res = use_cache(con, table, TYPES, COLS, str(cache), query, VITALSIGN_ORDER)
        rel = res.relation or f"({query(table.scan_sql(TYPES))})"
        rows = con.execute(f"SELECT stay_id, vital, charttime, v FROM {rel} ORDER BY charttime").fetchall()
    return res, rows


def test_content_change_with_same_size_and_mtime_is_caught(tmp_path):
    src = _src(tmp_path)
    cache = tmp_path / "cache"
    res, rows = _use(src, cache)
    assert res.status == "written" and res.rows == 3 and res.relation.startswith("read_parquet(")
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
    # the same source under another query (another itemid set): rebuilt, its own rows
    res, rows = _use(src, cache, lambda ce: f"SELECT * FROM ({vitalsign_sql(ce)}) WHERE vital = 'resp_rate'")
    assert (res.status, res.reason, res.rows) == ("rebuilt", "cached query changed (itemids, valid ranges or ETL version)", 1)
    assert [r[3] for r in rows] == [17.0]


def test_damaged_or_foreign_cache_file_is_rebuilt(tmp_path):
    src = _src(tmp_path)
    cache = tmp_path / "cache"
    res, _ = _use(src, cache)
    parquet = next(cache.glob("*.parquet"))
    pl.DataFrame({"stay_id": [1], "charttime": [None], "itemid": [1], "valuenum": [1.0]}).write_parquet(parquet)
    res, rows = _use(src, cache)
    assert (res.status, res.reason) == ("rebuilt", "cache file row count differs from its manifest")
    assert len(rows) == 3
    parquet.write_bytes(b"not parquet")
    res, rows = _use(src, cache)
    assert res.status == "rebuilt" and len(rows) == 3
    raw = parquet.read_bytes()  # bytes zeroed inside the file: same size, same footer row count
    parquet.write_bytes(raw[:8] + b"\0" * 16 + raw[24:])  # inside the first column chunk
    res, rows = _use(src, cache)
    assert (res.status, res.reason) == ("rebuilt", "cache file content differs from its manifest (SHA-256)")
    assert [r[3] for r in rows] == [81.0, 90.0, 17.0] and parquet.read_bytes() == raw
    manifest = next(cache.glob("*.json"))
    doc = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**doc, "format": 0}))
    res, _ = _use(src, cache)
    assert (res.status, res.reason) == ("rebuilt", "cache format changed")
    assert doc["source"] == fingerprint(src) and doc["rows"] == 3


@pytest.mark.parametrize("doc", ["[]", "null", "3", '"text"', '{"source": null}', '{"source": []}',
                                 '{"source": {"size": "x"}}', "{", "[" * 100000])
def test_manifest_of_another_shape_is_rebuilt(tmp_path, doc):
    """A manifest that is not a JSON object, or whose source is not one, is an entry to rebuild,
    for the early look (may_hold) and for use_cache alike."""
    src = _src(tmp_path)
    cache = tmp_path / "cache"
    _use(src, cache)
    manifest = next(cache.glob("*.json"))
    table = locate(src.parent.parent, "icu", "chartevents", COLS, TYPES)
    assert may_hold(table, str(cache))
    manifest.write_text(doc)
    assert not may_hold(table, str(cache))
    res, rows = _use(src, cache)
    assert res.status == "rebuilt" and res.rows == 3 and [r[3] for r in rows] == [81.0, 90.0, 17.0]
    assert json.loads(manifest.read_text())["source"] == fingerprint(src) and may_hold(table, str(cache))


def test_manifest_that_cannot_be_written_leaves_no_entry(tmp_path, monkeypatch):
    """The manifest's write fails (a full disk): the run reads the source, and no cache file is
    left without its manifest."""
    import etl.chart_cache

    def full(path, text, exclusive=False):
        raise InputError(f"cannot write {path}: No space left on device")

    monkeypatch.setattr(etl.chart_cache, "atomic_write_text", full)
    src = _src(tmp_path)
    cache = tmp_path / "cache"
    res, rows = _use(src, cache)
    assert res.status == "unwritable" and res.relation is None and res.reason.startswith("cannot write ")
    assert [r[3] for r in rows] == [81.0, 90.0, 17.0]
    assert list(cache.iterdir()) == []


def test_parquet_source_is_cached_and_checked_like_a_csv(tmp_path):
    src = _src(tmp_path)
    want = _use(src, "off")[1]  # read from the source, no cache
    pq = src.with_suffix(".parquet")
    pl.read_csv(src).write_parquet(pq)
    src.unlink()
    res, rows = _use(pq, tmp_path / "cache")
    assert res.status == "written" and res.rows == 3 and rows == want
    assert _use(pq, tmp_path / "cache")[0].status == "hit"
    pl.read_csv(_src(tmp_path, ROWS[:2])).write_parquet(pq)  # rewritten with one row less
    src.with_suffix(".csv").unlink()
    res, rows = _use(pq, tmp_path / "cache")
    assert res.status == "rebuilt" and res.rows == 2 and rows == want[:2]


def test_unwritable_cache_reads_the_source(tmp_path):
    src = _src(tmp_path)
    blocker = tmp_path / "cache"
    blocker.write_text("a file, not a folder")
    res, rows = _use(src, blocker)
    assert res.status == "unwritable" and res.relation is None and len(rows) == 3


def test_auto_skips_small_sources_and_other_sources_refuse_the_option(mimic_demo_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ABPS_CACHE_DIR", str(tmp_path / "home-cache"))
    assert default_cache_dir() == tmp_path / "home-cache" / "chartevents"
    rep = run_etl(mimic_demo_dir, tmp_path / "o", EtlOptions(**OPTS))  # auto: the 2.6 MB demo is not cached
    assert rep["chartevents_cache"]["status"] == "off" and not (tmp_path / "home-cache").exists()
    with pytest.raises(InputError, match="--chart-cache does not apply to --source eicu"):
        EtlOptions(min_center_stays=10, chart_cache="off").validate("eicu")
    with pytest.raises(InputError, match="--chart-cache does not apply to --source meds"):
        EtlOptions(chart_cache="off").validate("meds")


def test_a_cache_folder_that_cannot_be_written_is_said_on_the_console(mimic_demo_dir, tmp_path, capsys):
    """``--chart-cache FILE`` (a file, not a folder): the run reads the source, and says so in one
    warning line as well as in the report."""
    from tests.cli_helpers import run_main

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    args = ["etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(tmp_path / "o"), "--window-years", "20",
            "--min-center-stays", "1", "--chart-cache", str(blocker)]
    assert run_main(args) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "--chart-cache" in ln]
    assert len(lines) == 1 and lines[0].startswith(f"warning: --chart-cache {blocker}: not written (")
    assert "read from the source" in lines[0]
    assert json.loads((tmp_path / "o/cohort_report.json").read_text())["chartevents_cache"]["status"] == "unwritable"


@pytest.mark.parametrize("value", ["OFF", "Auto", " off "])
def test_chart_cache_settings_are_written_in_lower_case(mimic_demo_dir, tmp_path, monkeypatch, value):
    """``--chart-cache OFF`` is refused (it would name a folder ./OFF); blanks around a setting
    are not part of it."""
    from tests.cli_helpers import run_main

    monkeypatch.chdir(tmp_path)
    args = ["etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(tmp_path / "o"), "--window-years", "20",
            "--min-center-stays", "1", "--chart-cache", value]
    if value.strip() == "off":
        assert run_main(args) == 0
    else:
        assert run_main(args) == 2 and not (tmp_path / "o").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["o"] if value.strip() == "off" else [])


def test_chartevents_reading_starts_early_only_when_the_run_reads_it(mimic_demo_dir, tmp_path):
    """``start_chartevents`` starts the source's reading before the checks unless a cache entry may
    be valid: no manifest, cache off or a changed source -> a reading; a written entry -> none."""
    demo = _demo_copy(mimic_demo_dir, tmp_path / "demo")
    table = locate(demo, "icu", "chartevents", REQUIRED[("icu", "chartevents")], TYPES)
    cache = str(tmp_path / "cache")

    def started(setting: str) -> bool:
        batches = etl.mimic.start_chartevents(table, EtlOptions(**OPTS, chart_cache=setting))
        if batches is not None:
            batches.close()
        return batches is not None

    assert not may_hold(table, cache) and started(cache) and started("off")
    run_etl(demo, tmp_path / "a", EtlOptions(**OPTS, chart_cache=cache))
    assert may_hold(table, cache) and not started(cache)
    assert started("off") and not may_hold(table, "off")
    ce = demo / "icu/chartevents.csv.gz"
    os.utime(ce, ns=(ce.stat().st_atime_ns, ce.stat().st_mtime_ns + 10**9))
    assert not may_hold(table, cache) and started(cache)
    rep = run_etl(demo, tmp_path / "b", EtlOptions(**OPTS, chart_cache=cache))
    assert rep["chartevents_cache"]["status"] == "rebuilt" and rep["chartevents_cache"]["read_by"] == "stream"
    assert _frames(tmp_path / "a")[0].equals(_frames(tmp_path / "b")[0])

"""The streamed chartevents pass (etl/chart_stream.py): its vitals per charttime equal hand-computed
values and an independent Polars computation, spilling to disk changes nothing, the demo is read
by the stream with the same cohort bytes as DuckDB's scan, and a file the stream does not read
the way DuckDB does goes to DuckDB's scan (same cohort, same errors)."""

from __future__ import annotations

import gzip
import json
import shutil
from datetime import datetime
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from etl import chart_stream
from etl.errors import InputError
from etl.mimic import REQUIRED, TYPES, EtlOptions, run_etl
from etl.sources import locate

COLS = REQUIRED[("icu", "chartevents")]
OPTS = dict(window_years=20, min_center_stays=1, seed=7)


def _csv(path: Path, rows: list[tuple]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "subject_id,stay_id,charttime,itemid,value,valuenum\n"
    text += "".join(f"1,{s},{t},{'' if i is None else i},x,{'' if v is None else v}\n" for s, t, i, v in rows)
    path.write_bytes(gzip.compress(text.encode()))
    return path


def _pass(path: Path, bounds=(), budget: int | None = None) -> pl.DataFrame:
    table = locate(path.parent.parent, "icu", "chartevents", COLS, TYPES)
    vp = chart_stream.VitalPass(table, np.array(bounds, np.int64), "2GB", path.parent / "spill")
    if budget is not None:
        vp.budget = budget
    parts: list[pa.Table] = []
    vp.run(parts.append)
    assert not (path.parent / "spill").exists() or not list((path.parent / "spill").iterdir())
    return pl.from_arrow(pa.concat_tables(parts)) if parts else pl.DataFrame()


def _demo_copy(mimic_demo_dir: Path, tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """A copy of the demo under tmp_path/demo: its folder, its chartevents path and that file's lines."""
    demo = tmp_path / "demo"
    for sub in ("hosp", "icu"):
        shutil.copytree(mimic_demo_dir / sub, demo / sub, symlinks=True)
    ce = demo / "icu/chartevents.csv.gz"
    return demo, ce, gzip.decompress(ce.read_bytes()).decode().splitlines()


T0, T1 = "2150-01-01 10:00:00", "2150-01-01 11:00:00"
ROWS = [
    (30000001, T0, 220045, 80.0), (30000001, T0, 220045, 80.0),   # identical rows: one distinct, n_rows 2
    (30000001, T0, 220045, 90.0),                                 # a second value at the same time
    (30000001, T0, 220179, 120.0), (30000001, T0, 220050, 110.0),  # sbp from two itemids
    (30000001, T0, 225309, 100.0),                                # and a third
    (30000001, T1, 223761, 98.6),                                 # Fahrenheit -> Celsius
    (30000001, T1, 220277, 100.0), (30000001, T1, 220045, 300.0),  # spo2 100 valid, heart rate 300 not
    (30000001, T1, 220210, 0.0), (30000001, T1, 220210, None),     # resp rate 0 and empty: not valid
    (30000001, T1, 220046, 50.0),                                 # not a vital itemid
    (30000002, T0, 220045, 70.0),
    (30000001, T1, 220277, 100.00000000000001),                   # the double next above spo2's 100: not valid
]


def test_hand_computed_vitals_per_charttime(tmp_path):
    got = _pass(_csv(tmp_path / "m/icu/chartevents.csv.gz", ROWS))
    t0, t1 = datetime(2150, 1, 1, 10), datetime(2150, 1, 1, 11)
    want = [  # (stay, vital, charttime, v, n_rows, n_distinct), sorted by stay, charttime, vital
        (30000001, "heart_rate", t0, 85.0, 3, 2),
        (30000001, "sbp", t0, 110.0, 3, 3),
        (30000001, "spo2", t1, 100.0, 1, 1),
        (30000001, "temperature", t1, (98.6 - 32) / 1.8, 1, 1),
        (30000002, "heart_rate", t0, 70.0, 1, 1),
    ]
    assert got.columns == ["stay_id", "vital", "charttime", "v", "n_rows", "n_distinct"]
    assert got.rows() == want
    # one distinct row per (stay, vital, charttime), one of them listed twice: the value itself
    single = [ROWS[0], ROWS[0], ROWS[6], ROWS[7], ROWS[12]]
    got = _pass(_csv(tmp_path / "s/icu/chartevents.csv.gz", single))
    assert got.rows() == [(30000001, "heart_rate", t0, 80.0, 2, 1), (30000001, "spo2", t1, 100.0, 1, 1),
                          (30000001, "temperature", t1, (98.6 - 32) / 1.8, 1, 1), (30000002, "heart_rate", t0, 70.0, 1, 1)]


def test_rows_without_stay_or_charttime(tmp_path):
    """A row with no stay_id or no charttime is read when it is not a valid vital row (DuckDB's
    scan reads NULL there and never joins it); a valid vital row without one, or a charttime of
    another length, is left to DuckDB's scan."""
    def csv(extra: str) -> Path:
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}/icu/chartevents.csv.gz"
        path.parent.mkdir(parents=True)
        text = "subject_id,stay_id,charttime,itemid,value,valuenum\n" + "".join(
            f"1,{st},{t},{i},x,{'' if v is None else v}\n" for st, t, i, v in ROWS) + extra
        path.write_bytes(gzip.compress(text.encode()))
        return path

    hand = _pass(_csv(tmp_path / "h/icu/chartevents.csv.gz", ROWS))
    assert hand["vital"].to_list() == ["heart_rate", "sbp", "spo2", "temperature", "heart_rate"]
    for extra in (f"1,,{T0},220046,x,50\n", f"1,,{T0},220045,x,300\n", f"1,,{T0},220277,x,\n",
                  "1,30000001,,220046,x,50\n"):
        assert _pass(csv(extra), bounds=(30000002,)).equals(hand)
    for extra, why in ((f"1,,{T0},220045,x,80\n", "without stay_id or charttime"),
                       ("1,30000001,,220045,x,80\n", "without stay_id or charttime"),
                       ("1,30000001,2150-01-01 10:00,220046,x,50\n", "fixed_size_binary")):
        with pytest.raises(chart_stream.StreamUnreadable, match=why):
            _pass(csv(extra))


def test_partitions_and_spilling_change_nothing(tmp_path):
    rng = np.random.default_rng(3)
    n = 4000
    items = [220045, 220179, 220050, 220277, 223761, 220210, 220046]
    rows = [(int(30000000 + rng.integers(0, 40)), f"2150-01-0{1 + int(rng.integers(0, 3))} {int(rng.integers(0, 24)):02d}:00:00",
             int(rng.choice(items)), float(rng.integers(0, 130))) for _ in range(n)]
    rows += rows[:300]  # identical duplicates
    src = _csv(tmp_path / "m/icu/chartevents.csv.gz", rows)
    whole = _pass(src)
    split = _pass(src, bounds=(30000010, 30000020, 30000030))
    spilled = _pass(src, bounds=(30000010, 30000020, 30000030), budget=1)  # every batch spilled
    assert whole.height > 100 and whole["n_rows"].sum() > whole["n_distinct"].sum()
    assert split.equals(whole) and spilled.equals(whole)
    # rows listed stay by stay, as chartevents lists them: the same
    by_stay = _csv(tmp_path / "s/icu/chartevents.csv.gz", sorted(rows, key=lambda r: r[0]))
    assert _pass(by_stay, bounds=(30000010, 30000020, 30000030)).equals(whole)
    # an independent computation (Polars): valid rows, identical rows collapsed, mean per charttime
    it = chart_stream.vital_items()
    ref = pl.DataFrame({"itemid": it.itemid, "vital": [it.vitals[v] for v in it.vital], "lo": it.lo, "hi": it.hi,
                        "incl": it.hi_incl, "f2c": it.f2c})
    src_df = pl.DataFrame(rows, schema=["stay_id", "charttime", "itemid", "valuenum"], orient="row").with_columns(
        pl.col("charttime").str.to_datetime("%Y-%m-%d %H:%M:%S", time_unit="us"), pl.col("itemid").cast(pl.Int32))
    ok = (pl.col("valuenum") > pl.col("lo")) & ((pl.col("valuenum") < pl.col("hi")) | (pl.col("incl") & (pl.col("valuenum") == pl.col("hi"))))
    want = (src_df.join(ref, on="itemid").filter(ok)
            .group_by("stay_id", "charttime", "itemid", "valuenum", "vital", "f2c").agg(pl.len().alias("n"))
            .with_columns(v=pl.when(pl.col("f2c")).then((pl.col("valuenum") - 32) / 1.8).otherwise(pl.col("valuenum")))
            .group_by("stay_id", "vital", "charttime")
            .agg(pl.col("v").mean(), pl.col("n").sum().alias("n_rows"), pl.len().alias("n_distinct"))
            .sort("stay_id", "charttime", "vital"))
    assert whole.select("stay_id", "vital", "charttime").equals(want.select("stay_id", "vital", "charttime"))
    assert whole["n_rows"].equals(want["n_rows"].cast(pl.Int64))
    assert whole["n_distinct"].equals(want["n_distinct"].cast(pl.Int64))
    assert (whole["v"] - want["v"]).abs().max() < 1e-12


def test_parse_jobs_cut_at_any_byte_give_the_same_rows(tmp_path, monkeypatch):
    """The text is cut into parse jobs at line ends: jobs of 61 bytes (lines straddle every cut,
    some jobs hold no line end) give the batches of one job over the whole file; the header is
    skipped once; a file without a final line end keeps its last row; stopping early or a
    damaged gzip leaves no reading thread behind."""
    import threading

    rng = np.random.default_rng(9)
    rows = [(30000000 + int(rng.integers(0, 40)), f"2150-01-0{1 + int(rng.integers(0, 3))} 1{int(rng.integers(0, 9))}:00:00",
             int(rng.choice([220045, 220179, 220277, 220046])), float(rng.integers(1, 200))) for _ in range(400)]
    path = _csv(tmp_path / "m/icu/chartevents.csv.gz", rows)
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()).rstrip(b"\n")))
    table = locate(path.parent.parent, "icu", "chartevents", COLS, TYPES)
    whole = pa.Table.from_batches(list(chart_stream.ChartBatches(table)))
    monkeypatch.setattr(chart_stream, "BLOCK_BYTES", 61)
    given, text_buffer = [], chart_stream.ChartBatches._text_buffer
    monkeypatch.setattr(chart_stream.ChartBatches, "_text_buffer",
                        lambda self, size: given.append(text_buffer(self, size)) or given[-1])
    cut = pa.Table.from_batches(list(chart_stream.ChartBatches(table)))
    # the batches are held while later jobs' text is inflated into the buffers of earlier ones
    assert len(given) > 100 and len({id(b) for b in given}) < len(given) / 2
    assert whole.num_rows == cut.num_rows == 400 and cut.equals(whole)
    assert cut.column("stay_id").to_pylist() == [r[0] for r in rows]
    assert cut.column("valuenum").to_pylist() == [r[3] for r in rows]
    # the same text as plain CSV, and as a gzip of several members (as bgzip and `cat a.gz b.gz` write)
    text = gzip.decompress(path.read_bytes())
    plain = tmp_path / "p/icu/chartevents.csv"
    plain.parent.mkdir(parents=True)
    plain.write_bytes(text)
    members = tmp_path / "g/icu/chartevents.csv.gz"
    members.parent.mkdir(parents=True)
    members.write_bytes(b"".join(gzip.compress(text[k:k + 997]) for k in range(0, len(text), 997)))
    for other in (plain, members):
        got = pa.Table.from_batches(list(chart_stream.ChartBatches(locate(other.parent.parent, "icu", "chartevents",
                                                                           COLS, TYPES))))
        assert got.equals(whole)
    reading = chart_stream.ChartBatches(table)
    next(iter(reading))
    reading.close()
    bad = tmp_path / "b/icu/chartevents.csv.gz"
    bad.parent.mkdir(parents=True)
    raw = path.read_bytes()
    bad.write_bytes(raw[:-30])  # cut inside the member: refused by the stream, naming the file
    with pytest.raises(InputError, match="unreadable gzip \\(the compressed data ends early\\)"):
        list(chart_stream.ChartBatches(locate(bad.parent.parent, "icu", "chartevents", COLS, TYPES)))
    bad.write_bytes(raw[:len(raw) // 2] + bytes([raw[len(raw) // 2] ^ 0xFF]) + raw[len(raw) // 2 + 1:])
    with pytest.raises(chart_stream.StreamUnreadable):  # damaged inside: DuckDB words it
        list(chart_stream.ChartBatches(locate(bad.parent.parent, "icu", "chartevents", COLS, TYPES)))
    names = {t.name for t in threading.enumerate()}
    assert not {n for n in names if n.startswith(("chartevents-read", "chartevents-parse"))}, names


def test_a_reading_started_early_holds_more_jobs_at_a_lower_priority(tmp_path, monkeypatch):
    """Before its first batch is taken, a reading started early holds up to EARLY_AHEAD jobs and,
    on Linux, parses them on threads EARLY_NICE nice levels lower; the jobs cut once the consumer
    is there are parsed at the process's priority, with the usual MAX_AHEAD; the same batches."""
    import os
    import sys
    import threading
    import time

    rows = [(30000000 + k // 50, T0, 220045, float(60 + k % 50)) for k in range(3000)]
    path = _csv(tmp_path / "m/icu/chartevents.csv.gz", rows)
    table = locate(path.parent.parent, "icu", "chartevents", COLS, TYPES)
    usual = pa.Table.from_batches(list(chart_stream.ChartBatches(table)))
    monkeypatch.setattr(chart_stream, "BLOCK_BYTES", 2000)  # about 45 jobs
    monkeypatch.setattr(chart_stream, "EARLY_AHEAD", 4)
    parse, seen = chart_stream.ChartBatches._parse, []

    def spy(self, text, size, header, quoted, rows_whole=False):
        seen.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        return parse(self, text, size, header, quoted, rows_whole)

    monkeypatch.setattr(chart_stream.ChartBatches, "_parse", spy)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    early = chart_stream.ChartBatches(table, early=True)
    assert early._jobs.maxsize == 4
    deadline = time.monotonic() + 30
    while not (early._jobs.qsize() == 4 and all(f.done() for f in list(early._jobs.queue))):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    first = "chartevents-early" if sys.platform == "linux" else "chartevents-parse"
    assert all(name.startswith(first) for name, p in seen) and len(seen) >= 4
    got = pa.Table.from_batches(list(early))
    assert early._jobs.maxsize == chart_stream.MAX_AHEAD
    assert got.equals(usual) and got.num_rows == 3000 and len(seen) > 30
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    by_pool = {}
    for name, p in seen:
        by_pool.setdefault(name.split("_")[0], set()).add(p)
    if sys.platform == "linux":  # the four queued jobs and the one the reading held: early
        assert sum(name.startswith("chartevents-early") for name, p in seen) == 5
        assert by_pool == {"chartevents-early": {min(19, base + chart_stream.EARLY_NICE)}, "chartevents-parse": {base}}


def test_jobs_with_and_without_quotes_read_as_duckdb_does(tmp_path, monkeypatch):
    """A job whose text holds a '"' is parsed with DuckDB's quoting rules, one without with quoting
    off: the quoted ``value`` cells of the first rows (a comma and a doubled quote inside) keep
    their columns, and every job gives DuckDB's reading of the whole file."""
    import duckdb

    lines = ["subject_id,stay_id,charttime,itemid,value,valuenum"]
    lines += [f'1,3000000{k % 3},2150-01-01 1{k % 10}:00:00,220045,"a, ""b""",{60 + k}' for k in range(3)]
    lines += [f"1,3000000{k % 3},2150-01-02 1{k % 10}:00:00,220045,x,{70 + k}" for k in range(40)]
    path = tmp_path / "m/icu/chartevents.csv.gz"
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    monkeypatch.setattr(chart_stream, "BLOCK_BYTES", 200)
    seen: list[bool] = []
    parse = chart_stream.ChartBatches._parse

    def spy(self, text, size, header, quoted, rows_whole=False):
        seen.append(quoted)
        return parse(self, text, size, header, quoted, rows_whole)

    monkeypatch.setattr(chart_stream.ChartBatches, "_parse", spy)
    got = pa.Table.from_batches(list(chart_stream.ChartBatches(locate(path.parent.parent, "icu", "chartevents", COLS, TYPES))))
    assert seen[0] and not seen[-1] and len(seen) > 3
    want = duckdb.sql(f"SELECT stay_id, charttime::VARCHAR AS charttime, itemid, valuenum "
                      f"FROM read_csv('{path}', header=true, quote='\"', escape='\"')").fetchall()
    got = got.set_column(1, "charttime", got.column("charttime").cast(pa.binary()).cast(pa.string()))  # its 19 bytes
    assert list(zip(*(got.column(c).to_pylist() for c in ("stay_id", "charttime", "itemid", "valuenum")))) == want
    assert got.column("valuenum").to_pylist()[:4] == [60.0, 61.0, 62.0, 70.0]


def test_packed_key_and_column_sort_reduce_alike(monkeypatch):
    """reduce_partition sorts on one packed 64-bit key and reads the distinct rows' stay, charttime
    and vital back from it; ranges too wide to pack are sorted on the columns: both give the same
    table, with whole-second and microsecond charttimes."""
    rng = np.random.default_rng(5)
    n = 6000
    items = chart_stream.vital_items()
    stay = rng.integers(30_000_000, 30_000_060, n)
    hours = np.datetime64("2150-01-01T00:00:00", "us").astype(np.int64) + rng.integers(0, 48, n) * 3_600_000_000
    j = rng.integers(0, len(items.itemid), n).astype(np.uint8)
    code = (items.vital[j] << 4) | j
    val = rng.integers(1, 40, n).astype(np.float64)
    for t in (hours, hours + rng.integers(0, 2, n)):
        packed = chart_stream.reduce_partition(stay, t, code, val.copy(), items)
        with monkeypatch.context() as m:
            m.setattr(chart_stream, "_bits", lambda k: 40)  # 40 + 40 + 8 bits: too wide to pack
            columns = chart_stream.reduce_partition(stay, t, code, val.copy(), items)
        assert packed.num_rows > 1000 and packed.column("n_distinct").to_numpy().max() > 1
        assert packed.equals(columns)
        assert packed.column("n_rows").to_numpy().sum() == n


def test_vital_items_are_read_from_the_sql():
    it = chart_stream.vital_items()
    assert len(it.itemid) == 15 and it.vitals == ("dbp", "heart_rate", "mbp", "resp_rate", "sbp", "spo2", "temperature")
    f = dict(zip(it.itemid.tolist(), it.f2c.tolist()))
    assert f[223761] and not f[223762]
    assert chart_stream.memory_bytes("2GB") == 2_000_000_000 and chart_stream.memory_bytes("512MiB") == 512 * 2**20


def test_demo_is_streamed_with_the_bytes_of_the_duckdb_scan(mimic_demo_dir, tmp_path, monkeypatch):
    rep = run_etl(mimic_demo_dir, tmp_path / "s", EtlOptions(**OPTS, chart_cache="off"))
    assert rep["chartevents_cache"]["read_by"] == "stream"
    assert {"chartevents_read_s", "chartevents_reduce_write_s", "checks_s", "centers_split_write_s"} <= set(rep["timings_s"])
    monkeypatch.setattr(chart_stream, "streamable", lambda table: False)
    ref = run_etl(mimic_demo_dir, tmp_path / "d", EtlOptions(**OPTS, chart_cache="off"))
    assert ref["chartevents_cache"]["read_by"] == "duckdb"
    for f in ("cohort.parquet", "centers.parquet"):
        assert (tmp_path / "s" / f).read_bytes() == (tmp_path / "d" / f).read_bytes()
    assert rep["attrition"] == ref["attrition"]


def test_text_the_stream_does_not_read_goes_to_duckdb(mimic_demo_dir, tmp_path):
    """``12.0`` in stay_id is a whole number DuckDB's scan accepts and Arrow's integer parser
    refuses: the run falls back to DuckDB and gives the demo's cohort."""
    demo, ce, lines = _demo_copy(mimic_demo_dir, tmp_path)
    head = lines[0].split(",")
    k = head.index("stay_id")
    cells = lines[1].split(",")
    cells[k] = cells[k] + ".0"
    lines[1] = ",".join(cells)
    ce.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=1))
    got = run_etl(demo, tmp_path / "o", EtlOptions(**OPTS, chart_cache="off"))
    run_etl(mimic_demo_dir, tmp_path / "r", EtlOptions(**OPTS, chart_cache="off"))
    assert got["chartevents_cache"]["read_by"] == "duckdb"
    assert (tmp_path / "o/cohort.parquet").read_bytes() == (tmp_path / "r/cohort.parquet").read_bytes()


def test_no_progress_line_under_tests():
    assert not chart_stream.progress_wanted()


# charttime text -> (read by DuckDB's scan format, the value it reads); Arrow's ISO 8601 parser
# alone would read the first four as well
ODD_TIMES = {"2180-07-23": None, "2180-07-23T14:00:00": None, "2180-07-23 14:00": None,
             "2180-07-23 14:00:00.5": None, "2180-02-30 14:00:00": None,
             "2180-7-23 14:00:00": datetime(2180, 7, 23, 14), " 2180-07-23 14:00:00": datetime(2180, 7, 23, 14)}


def test_the_stream_converts_only_the_scans_timestamp_form():
    got = chart_stream.charttime_us(pa.array(["2180-07-23 14:00:00", None, "2152-02-29 23:59:59"]))
    assert got.to_pylist() == [datetime(2180, 7, 23, 14), None, datetime(2152, 2, 29, 23, 59, 59)]
    for text in ODD_TIMES:
        with pytest.raises(chart_stream.StreamUnreadable):
            chart_stream.charttime_us(pa.array(["2180-07-23 14:00:00", text]))


def test_the_byte_matrix_reading_equals_arrows_cast():
    """The NumPy reading of zero-padded charttimes gives Arrow's timestamps to the microsecond
    (leap days, century years, the first and last second of a day, year 0001), also on a slice;
    a value it does not take (None) is left to Arrow's cast, which reads or refuses it."""
    rng = np.random.default_rng(3)
    sec = np.r_[rng.integers(-62_135_596_800, 253_402_300_799, 5000), rng.integers(4_102_444_800, 7_258_118_400, 5000),
                0, 951_782_400, 951_868_799, 4_107_542_399, -62_135_596_800, 253_402_300_799]
    text = pa.array([str(np.datetime64(int(x), "s")).replace("T", " ") for x in sec])
    assert text[-6:].to_pylist() == ["1970-01-01 00:00:00", "2000-02-29 00:00:00", "2000-02-29 23:59:59",
                                     "2100-02-28 23:59:59", "0001-01-01 00:00:00", "9999-12-31 23:59:59"]
    want = pa.array(sec * 1_000_000, pa.timestamp("us"))
    assert chart_stream._charttime_fixed(text).equals(want)
    assert chart_stream.charttime_us(text).equals(want)
    assert chart_stream._charttime_fixed(text.slice(7, 100)).equals(want.slice(7, 100))
    for odd in ("2100-02-29 00:00:00", "2150-04-31 00:00:00", "2150-13-01 00:00:00", "2150-00-01 00:00:00",
                "2150-01-00 00:00:00", "2150-01-01 24:00:00", "2150-01-01 00:60:00", "2150-01-01 00:00:60",
                "2150-01-01T00:00:00", "2150-0a-01 00:00:00", "2150-01-01 0:00:00 "):
        assert chart_stream._charttime_fixed(pa.array(["2150-01-01 00:00:00", odd])) is None, odd
        with pytest.raises(chart_stream.StreamUnreadable):
            chart_stream.charttime_us(pa.array(["2150-01-01 00:00:00", odd]))
    assert chart_stream._charttime_fixed(pa.array(["2150-01-01 00:00:00", None])) is None
    year0 = pa.array(["0000-01-01 00:00:00"])  # left to Arrow, which reads the proleptic year 0
    assert chart_stream._charttime_fixed(year0) is None
    assert chart_stream.charttime_us(year0).cast(pa.int64()).to_pylist() == [-719_528 * 86_400_000_000]


def test_runs_of_one_charttime_are_read_once_with_the_same_result():
    """Consecutive rows with the same charttime text (a stay's vitals charted together) are read
    from the first row of each run: the result still equals Arrow's cast row by row, runs that
    differ in any one of the 19 bytes are told apart, and an odd value inside or after a run
    still sends the column to Arrow's cast."""
    rng = np.random.default_rng(5)
    sec = np.repeat(rng.integers(4_102_444_800, 7_258_118_400, 3000), rng.integers(1, 8, 3000))
    text = [str(np.datetime64(int(x), "s")).replace("T", " ") for x in sec]
    # neighbours that differ only in the last byte, in a byte of the middle word, in the first
    text[10:14] = ["2150-01-01 10:00:00", "2150-01-01 10:00:01", "2150-01-01 11:00:01", "3150-01-01 11:00:01"]
    want = pa.array([int(np.datetime64(t.replace(" ", "T"), "us").astype(np.int64)) for t in text],
                    pa.timestamp("us"))
    assert chart_stream._charttime_fixed(pa.array(text)).equals(want)
    assert chart_stream._charttime_fixed(pa.array(text).slice(11, 500)).equals(want.slice(11, 500))
    for at in (0, 1, 2):  # the odd value heads a run, repeats it, or follows it
        odd = ["2150-01-01 00:00:00"] * 3
        odd[at:] = ["2150-02-30 00:00:00"] * (3 - at)
        assert chart_stream._charttime_fixed(pa.array(text + odd)) is None, at


def test_window_mask_equals_a_row_by_row_lookup():
    """Rows grouped by stay (as chartevents lists them) and shuffled: the run-wise lookup keeps
    exactly the rows a per-row lookup of the stay's [start, end] keeps (bounds included)."""
    rng = np.random.default_rng(5)
    ids = np.unique(rng.integers(30_000_000, 30_005_000, 400))
    start = rng.integers(0, 50, len(ids))
    end = start + rng.integers(0, 50, len(ids))
    bounds = dict(zip(ids.tolist(), zip(start.tolist(), end.tolist())))
    grouped = np.repeat(rng.choice(np.r_[ids, ids + 1], 60), rng.integers(1, 40, 60))
    for stay in (grouped, rng.permutation(grouped)):
        t = rng.integers(-5, 105, len(stay))
        want = [s in bounds and bounds[s][0] <= x <= bounds[s][1] for s, x in zip(stay.tolist(), t.tolist())]
        got = chart_stream.window_mask(stay, t, (ids, start, end))
        assert got.tolist() == want and 0 < got.sum() < len(stay)
    empty = np.array([], np.int64)
    assert chart_stream.window_mask(grouped, grouped, (empty, empty, empty)).sum() == 0


def _with_charttime(src: Path, dst: Path, text: str) -> Path:
    """A copy of the demo whose first heart-rate row of chartevents is charted at ``text``."""
    for sub in ("hosp", "icu"):
        shutil.copytree(src / sub, dst / sub, symlinks=True)
    ce = dst / "icu/chartevents.csv.gz"
    lines = gzip.decompress(ce.read_bytes()).decode().split("\n")
    head = lines[0].split(",")
    t, item = head.index("charttime"), head.index("itemid")
    i = next(i for i, ln in enumerate(lines[1:], 1) if ln.split(",")[item] == "220045")
    cells = lines[i].split(",")
    cells[t] = text
    lines[i] = ",".join(cells)
    ce.unlink()
    ce.write_bytes(gzip.compress("\n".join(lines).encode(), compresslevel=1))
    return dst


@pytest.mark.parametrize("text", ["2180-07-23", "2180-07-23T14:00:00", "2180-7-23 14:00:00"])
def test_stream_and_duckdb_scan_read_the_same_timestamps(text, mimic_demo_dir, tmp_path, monkeypatch, capsys):
    """The same odd charttime given to the streamed pass and to DuckDB's scan: both refuse it
    with the same one line naming the file and the column, or both read it into the same cohort."""
    from cli_helpers import run_main

    src = _with_charttime(mimic_demo_dir, tmp_path / "src", text)
    args = ["etl", "--mimic-dir", str(src), "--window-years", "20", "--min-center-stays", "1", "--threads", "1",
            "--chart-cache", "off"]
    outcomes = []
    for path, streamable in (("s", chart_stream.streamable), ("d", lambda table: False)):
        monkeypatch.setattr(chart_stream, "streamable", streamable)
        code = run_main([*args, "--out", str(tmp_path / path)])
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
        outcomes.append((code, err))
    assert outcomes[0] == outcomes[1]
    code, err = outcomes[0]
    if ODD_TIMES[text] is None:
        assert code == 2 and err == [f"error: {src / 'icu/chartevents.csv.gz'}: column 'charttime' holds values "
                                     "that are not TIMESTAMP (ConversionException)"]
        assert not (tmp_path / "s").exists() and not (tmp_path / "d").exists()
    else:
        assert code == 0, err
        for f in ("cohort.parquet", "centers.parquet"):
            assert (tmp_path / "s" / f).read_bytes() == (tmp_path / "d" / f).read_bytes()
        rep = json.loads((tmp_path / "s" / "cohort_report.json").read_text())
        assert rep["chartevents_cache"]["read_by"] == "duckdb"  # the stream leaves it to the scan


def test_freed_memory_is_held_under_glibc_only() -> None:
    import platform

    assert chart_stream.hold_freed_memory() is (platform.libc_ver()[0] == "glibc")


def test_values_read_from_buffers_equal_arrows_own():
    """_values / _arrow / _strings give what to_numpy / pa.array give, for slices with nulls."""
    ints = pa.array([5, None, 7, 8, None, 10], pa.int32())
    floats = pa.array([1.5, None, 2.5, None, 4.0, 0.0])
    for arr in (ints, ints.slice(1), ints.slice(3, 2), floats, floats.slice(2), floats.slice(1, 1)):
        fill = -1 if pa.types.is_integer(arr.type) else np.nan
        want = np.asarray(arr.fill_null(fill).to_numpy(zero_copy_only=False))
        got = chart_stream._values(arr, np.int32 if pa.types.is_integer(arr.type) else np.float64, fill)
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError):
        chart_stream._values(ints, np.int32)
    mask = np.array([True, False, False, True, True, False, True, False, True, True])
    assert chart_stream._arrow(mask).equals(pa.array(mask))
    assert chart_stream._arrow(np.arange(4), pa.timestamp("us")).equals(pa.array(np.arange(4), pa.timestamp("us")))
    assert chart_stream._strings(("dbp", "heart_rate", "")).equals(pa.array(["dbp", "heart_rate", ""]))


def test_the_streamed_pass_does_not_import_pandas(tmp_path):
    """pyarrow imports pandas on the first pa.array, pa.scalar or to_numpy (0.3-0.4 s with the
    GIL held): the streamed pass, its window cut and its reduction use none of them."""
    import subprocess
    import sys

    path = _csv(tmp_path / "m/icu/chartevents.csv.gz", ROWS + [(30000003, T0, None, None)])
    code = f"""
import sys, numpy as np
from etl import chart_stream
from etl.mimic import REQUIRED, TYPES
from etl.sources import locate
from pathlib import Path
table = locate(Path({str(path.parent.parent)!r}), "icu", "chartevents", REQUIRED[("icu", "chartevents")], TYPES)
window = (np.array([30000001, 30000002]), np.array([0, 0]), np.array([2**62, 2**62]))
vp = chart_stream.VitalPass(table, np.array([30000002]), "2GB", Path({str(tmp_path / "spill")!r}), window=window)
parts = []
vp.run(lambda part: parts.append(chart_stream.in_window(part, window)))
assert sum(p.num_rows for p in parts) > 0 and vp.rows == {len(ROWS) + 1}
print("pandas" in sys.modules)
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "False"


@pytest.mark.parametrize("damage", ["value", "columns"])
def test_a_row_duckdb_refuses_too_is_worded_without_a_scan_of_the_file(damage, mimic_demo_dir, tmp_path, monkeypatch):
    """A late row that Arrow refuses (a valuenum that is not a number; a row with a column too
    many) and DuckDB refuses too: the error is DuckDB's wording of the whole file (the same
    line, naming the file and the column or the line), found by DuckDB reading that job's text
    alone, never the file."""
    from etl import mimic, sources
    from etl.errors import InputError

    demo, ce, lines = _demo_copy(mimic_demo_dir, tmp_path)
    k = lines[0].split(",").index("valuenum")
    row = len(lines) - 40
    cells = lines[row].split(",")
    if damage == "value":
        cells[k] = "abc"
    else:
        cells.append("1")
    lines[row] = ",".join(cells)
    ce.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=1))
    monkeypatch.setattr(chart_stream, "BLOCK_BYTES", 1 << 20)  # the bad row in a late job

    scanned: list[Path] = []
    diagnose = sources.diagnose

    def spy(tables, types):
        scanned.extend(t.read_path for t in tables)
        return diagnose(tables, types)

    monkeypatch.setattr(sources, "diagnose", spy)
    with pytest.raises(InputError) as probed:
        run_etl(demo, tmp_path / "o1", EtlOptions(**OPTS, chart_cache="off"))
    assert str(ce) in str(probed.value) and ce not in scanned
    assert "abc" not in str(probed.value)  # no row content
    monkeypatch.setattr(mimic, "refuse_as_duckdb", lambda *a: None)  # DuckDB scans the whole file
    with pytest.raises(InputError) as scanned_whole:
        run_etl(demo, tmp_path / "o2", EtlOptions(**OPTS, chart_cache="off"))
    assert str(probed.value) == str(scanned_whole.value)
    assert ("column 'valuenum'" if damage == "value" else "malformed data") in str(probed.value)


def test_a_line_of_the_refused_text_is_counted_in_the_whole_file(tmp_path, monkeypatch):
    """DuckDB counts the lines of the text it was given; the message counts the file's."""
    from etl import mimic
    from etl.errors import InputError

    path = _csv(tmp_path / "m/icu/chartevents.csv.gz", ROWS)
    table = locate(path.parent.parent, "icu", "chartevents", COLS, TYPES)
    monkeypatch.setattr(mimic, "wrap_duckdb_error",
                        lambda err, tables, types: InputError(f"{tables[0].path}: malformed data near line 3 (E)"))
    exc = chart_stream.StreamUnreadable("x", b"subject_id,stay_id,charttime,itemid,value,valuenum\n1,2,3\n")
    exc.rows_before = 1000
    import duckdb

    with duckdb.connect() as con, pytest.raises(InputError, match=r"chartevents.csv.gz: malformed data near line 1003 "):
        mimic.refuse_as_duckdb(con, table, exc, TYPES, tmp_path)
    assert not list(tmp_path.glob("*.csv"))  # the text's file is gone
    exc.text = None
    with duckdb.connect() as con:
        assert mimic.refuse_as_duckdb(con, table, exc, TYPES, tmp_path) is None


def test_a_quoted_value_with_line_ends_across_a_cut_is_read_as_duckdb_reads_it(mimic_demo_dir, tmp_path, monkeypatch):
    """A quoted value holding line ends, cut between two parse jobs: Arrow refuses both halves,
    the text of neither is whole rows, so the file goes to DuckDB's scan, which reads it (the
    stream never words an error from a text cut inside a quoted value)."""
    demo, ce, lines = _demo_copy(mimic_demo_dir, tmp_path)
    k = lines[0].split(",").index("value")
    block = 1 << 20
    at, row = len(lines[0]) + 1, 1
    while at + len(lines[row]) + 1 < block - 2000:  # the row that starts 2000 bytes before the first cut
        at += len(lines[row]) + 1
        row += 1
    cells = lines[row].split(",")
    cells[k] = '"' + "\n".join(f"note {j}" for j in range(600)) + '"'
    lines[row] = ",".join(cells)
    ce.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=1))
    monkeypatch.setattr(chart_stream, "BLOCK_BYTES", block)
    got = run_etl(demo, tmp_path / "o", EtlOptions(**OPTS, chart_cache="off"))
    run_etl(mimic_demo_dir, tmp_path / "r", EtlOptions(**OPTS, chart_cache="off"))
    assert got["chartevents_cache"]["read_by"] == "duckdb"
    assert (tmp_path / "o/cohort.parquet").read_bytes() == (tmp_path / "r/cohort.parquet").read_bytes()

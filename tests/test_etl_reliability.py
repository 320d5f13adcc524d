"""never silently wrong, on copies of the real MIMIC-IV and eICU demos.

Case 2 (time zones / threads), case 3 (duplicated source rows, both sources), case 6 (options on
the eICU path), case 5 (every dropped stay and center counted), and the two extra kinds: every
I/O or parse error names the file (and the column), and an ambiguous source is refused.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

from etl.eicu import run_eicu_etl
from etl.errors import InputError
from etl.mimic import EtlOptions, run_etl

REPO = Path(__file__).resolve().parents[1]
MIMIC_TABLES = ("hosp/patients", "hosp/admissions", "hosp/diagnoses_icd", "icu/icustays", "icu/chartevents")
EICU_TABLES = ("patient", "hospital", "apacheApsVar", "vitalAperiodic", "diagnosis", "pastHistory", "apachePredVar")
WIDE = dict(window_years=20, min_center_stays=1, seed=7)


def _copy_mimic(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    for rel in MIMIC_TABLES:
        if rel in skip:
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / f"{rel}.csv.gz", dst / f"{rel}.csv.gz")
    return dst


def _copy_eicu(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in EICU_TABLES:
        shutil.copy(src / f"{name}.csv.gz", dst / f"{name}.csv.gz")
    return dst


def _to_parquet(src: Path, dst: Path, select: str = "*", pre: str = "") -> None:
    con = duckdb.connect()
    if pre:
        con.execute(pre)
    con.execute(f"COPY (SELECT {select} FROM read_csv('{src}')) TO '{dst}' (FORMAT parquet)")
    con.close()


@pytest.fixture(scope="module")
def mimic_ref(mimic_demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "m"
    run_etl(mimic_demo_dir, out, EtlOptions(**WIDE))
    return pl.read_parquet(out / "cohort.parquet")


@pytest.fixture(scope="module")
def eicu_ref(eicu_demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "e"
    rep = run_eicu_etl(eicu_demo_dir, out, EtlOptions(min_center_stays=10, seed=1))  # threads 2
    return pl.read_parquet(out / "cohort.parquet"), rep, out


# ---------------------------------------------------------------- case 2: time zone, threads


def test_timestamptz_chartevents_same_cohort_under_two_time_zones(mimic_demo_dir, mimic_ref, tmp_path):
    src = _copy_mimic(mimic_demo_dir, tmp_path / "m", skip=("icu/chartevents",))
    _to_parquet(mimic_demo_dir / "icu/chartevents.csv.gz", src / "icu/chartevents.parquet",
                "* REPLACE (CAST(charttime AS TIMESTAMPTZ) AS charttime)", pre="SET TimeZone = 'UTC'")
    code = ("import sys; from etl.mimic import EtlOptions, run_etl; "
            "run_etl(sys.argv[1], sys.argv[2], EtlOptions(window_years=20, min_center_stays=1, seed=7, "
            "threads=int(sys.argv[3])))")
    outs = []
    for k, (tz, threads, lc) in enumerate((("UTC", 2, "C"), ("America/New_York", 1, "C.UTF-8"))):
        env = {**os.environ, "TZ": tz, "LC_ALL": lc, "PYTHONPATH": str(REPO)}
        p = subprocess.run([sys.executable, "-c", code, str(src), str(tmp_path / f"o{k}"), str(threads)],
                           env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        outs.append(tmp_path / f"o{k}")
    assert (outs[0] / "cohort.parquet").read_bytes() == (outs[1] / "cohort.parquet").read_bytes()
    assert (outs[0] / "centers.parquet").read_bytes() == (outs[1] / "centers.parquet").read_bytes()
    # and the values are those of the naive-timestamp CSV demo (135 stays chart a heart rate)
    got = pl.read_parquet(outs[1] / "cohort.parquet")
    assert got.height == mimic_ref.height == 135
    assert got["heart_rate_mean"].equals(mimic_ref["heart_rate_mean"])


def test_eicu_threads_do_not_change_the_bytes(eicu_demo_dir, eicu_ref, tmp_path):
    run_eicu_etl(eicu_demo_dir, tmp_path / "t1", EtlOptions(min_center_stays=10, seed=1, threads=1))
    assert (tmp_path / "t1" / "cohort.parquet").read_bytes() == (eicu_ref[2] / "cohort.parquet").read_bytes()


# ---------------------------------------------------------------- case 3: duplicated source rows


def _dup_rows(path: Path, pick, change=None) -> int:
    """Append copies (or changed copies) of the data lines ``pick`` selects; returns how many."""
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    extra = [ln if change is None else change(ln) for ln in lines[1:] if pick(ln)]
    path.write_bytes(gzip.compress(("\n".join(lines + extra) + "\n").encode(), compresslevel=1))
    return len(extra)


def test_eicu_identical_duplicates_collapsed_and_counted(eicu_demo_dir, eicu_ref, tmp_path):
    ref, ref_rep, _ = eicu_ref
    src = _copy_eicu(eicu_demo_dir, tmp_path / "e")
    # the recipe: duplicate the apacheApsVar row of every stay whose id is divisible by 10
    n_aps = _dup_rows(src / "apacheApsVar.csv.gz", lambda ln: int(ln.split(",")[1]) % 10 == 0)
    n_pat = _dup_rows(src / "patient.csv.gz", lambda ln: int(ln.split(",")[0]) % 7 == 0)
    assert n_aps > 100 and n_pat > 100
    rep = run_eicu_etl(src, tmp_path / "o", EtlOptions(min_center_stays=10, seed=1))
    got = pl.read_parquet(tmp_path / "o" / "cohort.parquet")
    assert got.equals(ref) and rep["stays"] == ref_rep["stays"] == 2422 and rep["centers"] == ref_rep["centers"]
    dups = {r["filter"].split(" (key")[0].rsplit(" ", 1)[1]: r for r in rep["attrition"] if r["unit"] == "rows"}
    assert dups["patient.csv.gz"]["rows_removed"] == n_pat
    assert dups["apacheApsVar.csv.gz"]["rows_removed"] == n_aps


def test_eicu_conflicting_duplicates_are_one_line_errors(eicu_demo_dir, tmp_path):
    src = _copy_eicu(eicu_demo_dir, tmp_path / "e")

    def change(ln: str) -> str:  # same stay, another heart rate
        f = ln.split(",")
        f[0] = str(int(f[0]) + 10_000_000)  # a new apacheapsvarid
        return ",".join(f)

    _dup_rows(src / "apacheApsVar.csv.gz", lambda ln: int(ln.split(",")[1]) % 50 == 0, change)
    with pytest.raises(InputError) as e:
        run_eicu_etl(src, tmp_path / "o", EtlOptions(min_center_stays=10))
    msg = str(e.value)
    assert "apacheApsVar.csv.gz" in msg and "patientunitstayid" in msg and "conflicting" in msg
    assert "\n" not in msg and not any(ch.isdigit() for ch in msg.split("conflicting duplicates:")[1].split("rows")[1])
    assert not (tmp_path / "o").exists()


def test_mimic_identical_duplicates_collapsed_and_counted(mimic_demo_dir, mimic_ref, tmp_path):
    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    n_icu = _dup_rows(src / "icu/icustays.csv.gz", lambda ln: int(ln.split(",")[2]) % 3 == 0)  # stay_id
    n_adm = _dup_rows(src / "hosp/admissions.csv.gz", lambda ln: int(ln.split(",")[1]) % 4 == 0)  # hadm_id
    n_dx = _dup_rows(src / "hosp/diagnoses_icd.csv.gz", lambda ln: ln.split(",")[2] == "1")  # seq_num 1
    # chartevents: every heart-rate row repeated (identical rows inside the window are collapsed)
    n_ce = _dup_rows(src / "icu/chartevents.csv.gz", lambda ln: ",220045," in ln)
    assert min(n_icu, n_adm, n_dx, n_ce) > 10
    rep = run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert pl.read_parquet(tmp_path / "o" / "cohort.parquet").equals(mimic_ref)
    rows = [r for r in rep["attrition"] if r["unit"] == "rows"]
    removed = {r["filter"].split(" in ")[1].split(" ")[0]: r["rows_removed"] for r in rows}
    assert removed["icu/icustays.csv.gz"] == n_icu and removed["hosp/admissions.csv.gz"] == n_adm
    assert removed["hosp/diagnoses_icd.csv.gz"] == n_dx
    assert 0 < removed["icu/chartevents.csv.gz"] <= n_ce  # only rows inside kept stays' windows
    stays = [r for r in rep["attrition"] if r["unit"] == "stays"]
    assert stays[0]["stays_in"] == 140  # stays, after collapsing


# ---------------------------------------------------------------- case 6: options work or are refused


def test_eicu_applies_memory_limit_and_threads(eicu_demo_dir, tmp_path):
    with pytest.raises(InputError, match="--memory-limit"):
        run_eicu_etl(eicu_demo_dir, tmp_path / "o", EtlOptions(min_center_stays=10, memory_limit="1MB", threads=1))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("source,opts,needle", [
    ("eicu", dict(partition="dirichlet"), "--partition"),
    ("eicu", dict(care_units=("MICU",)), "--care-units"),
    ("eicu", dict(window_years=4), "--window-years"),
    ("mimic", dict(n_centers=5), "--n-centers"),
    ("mimic", dict(partition="iid", alpha=0.1), "--alpha"),
    ("mimic", dict(partition="dirichlet", window_origin=2000), "--window-origin"),
])
def test_options_that_do_not_apply_are_refused(mimic_demo_dir, eicu_demo_dir, tmp_path, source, opts, needle):
    run = run_eicu_etl if source == "eicu" else run_etl
    with pytest.raises(InputError, match=needle):
        run(eicu_demo_dir if source == "eicu" else mimic_demo_dir, tmp_path / "o", EtlOptions(**opts))


def test_cli_eicu_refuses_partition(eicu_demo_dir, tmp_path):
    p = subprocess.run([sys.executable, "-c", "from cli.app import main; main()", "etl", "--source", "eicu",
                        "--data-dir", str(eicu_demo_dir), "--out", str(tmp_path / "o"), "--partition", "iid"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 2 and p.stderr.startswith("error: --partition does not apply to --source eicu")


# ---------------------------------------------------------------- case 5: every drop counted


def _chain(rep: dict) -> None:
    stays = [r for r in rep["attrition"] if r["unit"] == "stays"]
    for a, b in zip(stays, stays[1:]):
        assert b["stays_in"] == a["stays_out"]
    assert stays[-1]["stays_out"] == rep["stays"]
    small = next(r for r in stays if "centers_in" in r)
    assert small["centers_out"] == rep["centers"] == small["centers_in"] - small["centers_removed"]


def test_every_dropped_stay_and_center_is_counted(mimic_demo_dir, eicu_ref, tmp_path):
    rep = run_etl(mimic_demo_dir, tmp_path / "m", EtlOptions(min_center_stays=3))
    _chain(rep)
    small = next(r for r in rep["attrition"] if "centers_in" in r)
    assert small["centers_removed"] > 0 and small["stays_removed"] > 0
    _, rep_e, out_e = eicu_ref
    _chain(rep_e)
    assert rep_e["attrition"][0]["stays_in"] == 2520  # every unit stay of the demo enters
    small = next(r for r in rep_e["attrition"] if "centers_in" in r)
    assert small["centers_removed"] > 0 and small["stays_removed"] > 0
    md = (out_e / "cohort_report.md").read_text()
    assert "centers removed" in md


# ---------------------------------------------------------------- errors name the file and column


def test_ambiguous_source_is_refused_and_inputs_are_reported(mimic_demo_dir, tmp_path):
    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    rep = run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert rep["inputs"]["chartevents"] == "icu/chartevents.csv.gz"
    assert json.loads((tmp_path / "o" / "cohort_report.json").read_text())["inputs"] == rep["inputs"]
    _to_parquet(src / "icu/chartevents.csv.gz", src / "icu/chartevents.parquet")
    with pytest.raises(InputError, match=r"ambiguous table icu/chartevents: chartevents.parquet and "
                                         r"chartevents.csv.gz both exist"):
        run_etl(src, tmp_path / "o2", EtlOptions(**WIDE))
    (src / "icu/chartevents.parquet").unlink()
    shutil.copy(src / "hosp/patients.csv.gz", src / "hosp/patients.csv")
    with pytest.raises(InputError, match="ambiguous table hosp/patients"):
        run_etl(src, tmp_path / "o2", EtlOptions(**WIDE))


def test_parquet_with_wrong_column_type_names_file_and_column(mimic_demo_dir, tmp_path):
    src = _copy_mimic(mimic_demo_dir, tmp_path / "m", skip=("icu/chartevents",))
    pq = src / "icu/chartevents.parquet"
    # charttime stored as epoch seconds: readable by any Parquet tool, not a timestamp
    _to_parquet(mimic_demo_dir / "icu/chartevents.csv.gz", pq, "* REPLACE (epoch(charttime)::BIGINT AS charttime)")
    with pytest.raises(InputError, match=r"chartevents.parquet: column 'charttime' is stored as BIGINT"):
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    # valuenum stored as text with one non-number
    _to_parquet(mimic_demo_dir / "icu/chartevents.csv.gz", pq,
                "* REPLACE (CASE WHEN row_number() OVER () = 5000 THEN 'n/a' ELSE CAST(valuenum AS VARCHAR) END "
                "AS valuenum)")
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value).startswith(f"{pq}: column 'valuenum' holds values that are not DOUBLE")
    assert "n/a" not in str(e.value)


def test_csv_errors_name_file_and_column(mimic_demo_dir, tmp_path):
    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / "icu/chartevents.csv.gz"
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    cols = lines[0].split(",")
    f = next(i for i, ln in enumerate(lines) if ",220045," in ln)
    row = lines[f].split(",")
    row[cols.index("valuenum")] = "abc"
    lines[f] = ",".join(row)
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=1))
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value).startswith(f"{path}: column 'valuenum'") and "abc" not in str(e.value)


@pytest.mark.parametrize("field, text, words", [
    ("valuenum", '"25"0', "malformed data near line"),  # Arrow's quoting would read 250
    ("stay_id", "0xFFFFFFFFFFFFFFFF", "column 'stay_id' holds values that are not BIGINT"),  # Arrow: -1
    ("itemid", "0xFFFFFFFF", "column 'itemid' holds values that are not INTEGER"),
])
def test_the_stream_reads_no_row_duckdb_refuses(mimic_demo_dir, tmp_path, field, text, words):
    """Rows Arrow reads and DuckDB's scan refuses (a quoted field followed by more text, a
    hexadecimal id past its type's range) are refused with DuckDB's words, late in the file too."""
    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / "icu/chartevents.csv.gz"
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    cols = lines[0].split(",")
    k = len(lines) * 2 // 3
    row = next(ln for ln in lines[k:] if ",220045," in ln).split(",")
    row[cols.index(field)] = text
    lines.insert(k, ",".join(row))
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=1))
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value).startswith(f"{path}: ") and words in str(e.value), str(e.value)


@pytest.mark.parametrize("table, where", [("icu/chartevents.csv.gz", "row"), ("hosp/patients.csv.gz", "row"),
                                          ("hosp/patients.csv.gz", "header")])
def test_text_that_is_not_utf8_is_named_with_its_line(mimic_demo_dir, tmp_path, table, where):
    """A byte that is not UTF-8 (0xFF) in a row is refused with the file and the line, by the
    chartevents stream and by a keyed table's scan; in the header, the header is named (before,
    the header's reader decoded the rows after it and named neither)."""
    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / table
    lines = gzip.decompress(path.read_bytes()).split(b"\n")
    k = 0 if where == "header" else 5
    lines[k] = lines[k][:3] + b"\xff" + lines[k][4:]  # in the first field (subject_id), row or header
    path.write_bytes(gzip.compress(b"\n".join(lines), compresslevel=1))
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    expected = "the CSV header is not UTF-8 text" if where == "header" else "text that is not UTF-8 near line 6 "
    assert str(e.value).startswith(f"{path}: {expected}"), str(e.value)


def test_hexadecimal_ids_convert_as_duckdb_casts_them():
    """whole_number_sql: a hexadecimal id is cast as DuckDB casts it (its 'e' is no exponent),
    a fractional one still refused."""
    from etl.sources import NOT_WHOLE, whole_number_sql

    sql = whole_number_sql(Path("f.csv"), "v", "BIGINT")
    con = duckdb.connect()
    assert con.execute(f"SELECT {sql} FROM (VALUES ('0x1caa3ee'), ('30057454'), ('3.0057454e7')) t(v)").fetchall() \
        == [(30057454,)] * 3
    with pytest.raises(duckdb.Error, match=NOT_WHOLE):
        con.execute(f"SELECT {sql} FROM (VALUES ('2.5')) t(v)").fetchall()


def test_cut_chartevents_gzip_is_named_by_the_stream(mimic_demo_dir, tmp_path, monkeypatch):
    """A chartevents download cut inside a gzip member is refused where the stream meets its end,
    naming the file, without DuckDB reading the whole file again (its scan is never reached)."""
    import etl.mimic as mimic

    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / "icu/chartevents.csv.gz"
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) * 3 // 5])

    def no_scan(*args, **kwargs):
        raise AssertionError("DuckDB scanned chartevents again")

    monkeypatch.setattr(mimic, "refuse_as_duckdb", no_scan)
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value) == f"{path}: unreadable gzip (the compressed data ends early)"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("table", ["icu/chartevents.csv.gz", "hosp/patients.csv.gz"])
@pytest.mark.parametrize("field", ["crc", "length"])
def test_gzip_failing_its_trailer_check_is_refused(mimic_demo_dir, tmp_path, table, field):
    """A gzip whose text inflates to the end but whose trailer (RFC 1952: CRC-32, then the text's
    length mod 2^32, the last 8 bytes) disagrees with it is refused, naming the file, by the
    chartevents stream and by the inflated copy of a keyed table (DuckDB's reader would take it)."""
    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / table
    raw = bytearray(path.read_bytes())
    raw[-8 if field == "crc" else -4] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(gzip.BadGzipFile):  # the file is damaged in the way the test means
        gzip.decompress(bytes(raw))
    what = "CRC-32" if field == "crc" else "length"
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value).startswith(f"{path}: damaged gzip (the {what} of the inflated text does not match")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("table", ["patient", "vitalAperiodic"])
def test_eicu_gzip_failing_its_trailer_check_is_refused(eicu_demo_dir, tmp_path, table):
    """The eICU tables go through the same inflated copies: a CRC-32 that disagrees with the text
    is refused naming the file, and nothing is written."""
    src = _copy_eicu(eicu_demo_dir, tmp_path / "e")
    path = src / f"{table}.csv.gz"
    raw = bytearray(path.read_bytes())
    raw[-8] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(InputError) as e:
        run_eicu_etl(src, tmp_path / "o", EtlOptions(min_center_stays=10, seed=1))
    assert str(e.value).startswith(f"{path}: damaged gzip (the CRC-32 of the inflated text does not match")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("how", ["gzip-cut", "row-cut"])
def test_truncated_csv_gz_names_the_file(mimic_demo_dir, tmp_path, how):
    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / "icu/icustays.csv.gz"
    raw = path.read_bytes()
    if how == "gzip-cut":  # the compressed stream ends early (zcat prints most of it)
        path.write_bytes(raw[: len(raw) * 2 // 3])
    else:  # a valid gzip whose text stops inside a row
        text = gzip.decompress(raw).decode()
        path.write_bytes(gzip.compress(text[: len(text) // 2].encode(), compresslevel=1))
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)
    assert not (tmp_path / "o").exists()


def test_out_that_holds_the_source_or_the_current_folder_is_refused(eicu_demo_dir, tmp_path):
    """Replacing such an --out would move the source tables or the folder the command runs in."""
    from tests.test_cli_errors import one_line_error, run

    src = _copy_eicu(eicu_demo_dir, tmp_path / "data" / "e")
    before = sorted(p.name for p in src.iterdir())
    for out in (src, tmp_path / "data"):
        one_line_error(run("etl", "--source", "eicu", "--data-dir", str(src), "--out", str(out)),
                       f"--out {out}: it holds the source folder")
    work = tmp_path / "w" / "work"
    work.mkdir(parents=True)
    for out in (".", str(tmp_path / "w")):
        one_line_error(run("etl", "--source", "eicu", "--data-dir", str(src), "--out", out, cwd=work),
                       f"--out {out}: it holds the current folder")
    assert sorted(p.name for p in src.iterdir()) == before and list(work.iterdir()) == []


def test_inflated_copies_are_private_and_a_refused_copy_is_an_error(eicu_demo_dir, tmp_path):
    """The copies hold patient rows (owner-only); a folder that refuses the copy is an error, never
    a silent read of the gzip by DuckDB, whose reader skips the CRC-32 check."""
    import stat

    from etl.sources import inflated as inflate
    from etl.sources import locate

    table = locate(eicu_demo_dir, "", "patient", ("patientunitstayid",), {})
    copy = inflate(table, tmp_path / "inflated")
    assert copy.read_from == tmp_path / "inflated" / "patient.csv" and copy.path == table.path
    assert stat.S_IMODE((tmp_path / "inflated").stat().st_mode) == 0o700
    assert stat.S_IMODE(copy.read_from.stat().st_mode) == 0o600
    assert copy.read_from.read_bytes() == gzip.decompress(table.path.read_bytes())
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError) as e:
        inflate(table, tmp_path / "file" / "inflated")
    assert str(e.value).startswith(f"{tmp_path / 'file' / 'inflated'}: cannot write the inflated copy of {table.path}")


def test_duckdb_words_quoting_row_content_are_not_repeated(eicu_demo_dir, tmp_path):
    """A damaged stream that DuckDB words as a failed cast of what it read: the value is dropped."""
    from etl.sources import locate, wrap_duckdb_error

    src = _copy_eicu(eicu_demo_dir, tmp_path / "e")
    path = src / "vitalAperiodic.csv.gz"
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])   # a stream that does not inflate to its end
    table = locate(src, "", "vitalAperiodic", ("vitalaperiodicid",), {})
    exc = duckdb.ConversionException(f"Could not convert string '9328297910826354911' to INT64 when casting "
                                     f"from source column vitalaperiodicid in gzip file {path}")
    msg = str(wrap_duckdb_error(exc, [table]))
    assert msg.startswith(f"{path}: unreadable gzip (") and "9328297910826354911" not in msg, msg


def test_eicu_header_only_and_empty_identifier(eicu_demo_dir, tmp_path):
    """A table the cohort needs is refused when it holds no rows; one it can do without is warned
    about, saying what the cohort lacks; a row without its identifier is refused, not kept."""
    import warnings

    from etl.errors import InputWarning

    def header_only(path: Path) -> None:
        path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()).split(b"\n", 1)[0] + b"\n"))

    src = _copy_eicu(eicu_demo_dir, tmp_path / "e")
    for name in ("hospital", "pastHistory"):
        header_only(src / f"{name}.csv.gz")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InputWarning)
        run_eicu_etl(src, tmp_path / "o", EtlOptions(min_center_stays=10, seed=1))
    said = sorted(str(w.message) for w in caught if issubclass(w.category, InputWarning))
    assert said == [f"{src / 'hospital.csv.gz'}: no data rows; every hospital's region, bed count and teaching status is unknown",
                    f"{src / 'pastHistory.csv.gz'}: no data rows; the Charlson comorbidities of the past history are all 0"]
    assert pl.read_parquet(tmp_path / "o" / "centers.parquet")["region"].null_count() > 0

    header_only(src / "patient.csv.gz")
    with pytest.raises(InputError) as e:
        run_eicu_etl(src, tmp_path / "o2", EtlOptions(min_center_stays=10, seed=1))
    assert str(e.value).startswith(f"{src / 'patient.csv.gz'}: ") and "no data rows" in str(e.value)

    src = _copy_eicu(eicu_demo_dir, tmp_path / "e2")
    path = src / "patient.csv.gz"
    lines = gzip.decompress(path.read_bytes()).decode().split("\n")
    i = lines[0].split(",").index("patientunitstayid")
    cells = lines[4].split(",")
    cells[i] = ""
    lines[4] = ",".join(cells)
    path.write_bytes(gzip.compress("\n".join(lines).encode()))
    with pytest.raises(InputError) as e:
        run_eicu_etl(src, tmp_path / "o3", EtlOptions(min_center_stays=10, seed=1))
    assert str(e.value).startswith(f"{path}: 1 row without a value of 'patientunitstayid'")
    assert not (tmp_path / "o3").exists()


def test_a_table_named_in_other_letter_case_is_pointed_out(eicu_demo_dir, tmp_path):
    from tests.test_cli_errors import one_line_error, run

    src = _copy_eicu(eicu_demo_dir, tmp_path / "e")
    (src / "patient.csv.gz").rename(src / "PATIENT.CSV.GZ")
    one_line_error(run("etl", "--source", "eicu", "--data-dir", str(src), "--out", str(tmp_path / "o")),
                   f"missing table patient (.csv.gz, .csv or .parquet) under {src}; PATIENT.CSV.GZ is there")
    one_line_error(run("etl", "--source", "eicu", "--out", str(tmp_path / "o")),
                   "give the eicu folder with --data-dir")

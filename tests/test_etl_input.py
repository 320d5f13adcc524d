"""Bad or unusual input files and options of `abps etl`, on copies of the real MIMIC-IV demo:
gzip padding, empty tables, non-binary flags, non-finite options, interruption by a signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    return {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "ABPS_STATE": os.environ["ABPS_STATE"]}


def _signal_when_ready(script: str, args: tuple[str, ...], sig: int, cwd: Path,
                       settle: float = 0.0) -> tuple[bool, int, str]:
    """Run ``python -c script args``, wait for its "ready" line on stderr (at most 120 s), wait
    ``settle`` seconds more, send ``sig``; (ready seen, exit code, the rest of stderr)."""
    p = subprocess.Popen([sys.executable, "-c", script, *args], stderr=subprocess.PIPE, text=True, cwd=cwd,
                         env=_env())
    try:
        ready, deadline = False, time.monotonic() + 120
        for line in p.stderr:
            ready = line.strip() == "ready"
            if ready or time.monotonic() > deadline:
                break
        time.sleep(settle)
        p.send_signal(sig)
        err = p.stderr.read()
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    return ready, rc, err


# A child `abps etl` whose first-day vitals step first runs a DuckDB query that never ends on its
# own, on the ETL's connection, after writing "ready" to stderr: a signal sent then always
# arrives while DuckDB is executing (with --threads 1 the main thread runs the query's tasks and
# DuckDB checks for a pending signal between them).
_BUSY_CHILD = """
import signal, sys
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as under a terminal, whatever started the tests
import etl.mimic as m
real = m.first_day_vitals
def busy(con, *a, **k):
    print("ready", file=sys.stderr, flush=True)
    con.execute("SELECT sum(hash(i)) FROM range(1000000000000) t(i)").fetchall()
    return real(con, *a, **k)
m.first_day_vitals = busy
from cli.app import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signal_during_a_duckdb_query_exits_interrupted(mimic_demo_dir, tmp_path, sig, code, threads):
    """With --threads 2 the main thread waits on DuckDB's workers and never sees the signal itself:
    cli.app's watcher thread interrupts the query. SIGHUP (the terminal closed) unwinds as SIGTERM."""
    out = tmp_path / "o"
    _, rc, err = _signal_when_ready(_BUSY_CHILD, ("etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(out),
                                                  "--window-years", "20", "--min-center-stays", "1",
                                                  "--threads", threads), sig, tmp_path, settle=0.3)
    assert rc == code, err[-800:]
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "error: interrupted"
    assert not out.exists() and not [q for q in tmp_path.iterdir() if ".tmp-" in q.name]


# A child `abps` whose command modules' imports are slow: "ready" on stderr, then a sleep, inside
# cli.app._register (where torch, DuckDB and the like are imported).
_SLOW_IMPORTS = """
import sys, time
import cli.app as app
real = app._register
def slow():
    print("ready", file=sys.stderr, flush=True)
    time.sleep(60)
    real()
app._register = slow
app.main(sys.argv[1:])
"""


def test_ctrl_c_while_the_commands_are_imported_exits_interrupted(tmp_path):
    ready, rc, err = _signal_when_ready(_SLOW_IMPORTS, ("etl", "--help"), signal.SIGINT, tmp_path)
    assert ready
    assert rc == 130 and "Traceback" not in err and err.strip() == "error: interrupted", err[-800:]


# the console script's entry, with the import of cli.app held up after writing "ready"
_SLOW_APP = """
import builtins, sys, time
real = builtins.__import__
def slow(name, *a, **k):
    if name == "cli.app":
        sys.stderr.write("ready\\n"); sys.stderr.flush(); time.sleep(60)
    return real(name, *a, **k)
builtins.__import__ = slow
from cli.entry import main
sys.exit(main())
"""


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_command_line_loads_exits_interrupted(tmp_path, sig, code):
    """Before cli.app.main sets its handlers (typer, rich and pydantic load first)."""
    ready, rc, err = _signal_when_ready(_SLOW_APP, ("--help",), sig, tmp_path)
    assert ready
    assert rc == code and err.strip() == "error: interrupted", err[-800:]


def test_the_entry_freezes_the_objects_that_live_to_the_exit(monkeypatch):
    """cli.entry.main moves the imports' objects out of the collector's reach before the command,
    and the command's when it ends, also when it exits with an error."""
    import gc

    import cli.app
    import cli.entry

    seen = []

    def command():
        seen.append(gc.get_freeze_count())
        gc.unfreeze()
        _ = [[] for _ in range(100)]
        raise SystemExit(2)

    monkeypatch.setattr(cli.app, "main", command)
    gc.unfreeze()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit):
            cli.entry.main()
        assert seen and seen[0] > 1000 and gc.get_freeze_count() > 100
        # and it leaves the process ignoring the signals that would end it by the signal
        assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in handlers)
    finally:
        gc.unfreeze()
        for sig, handler in handlers.items():  # this test process is not exiting
            signal.signal(sig, handler)


def test_the_console_script_is_the_entry_module():
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["abps"] == "cli.entry:main"


def _cli(capsys, *args: str) -> tuple[int, str]:
    from cli.app import main

    with pytest.raises(SystemExit) as e:
        main(list(args))
    return e.value.code, capsys.readouterr().err


@pytest.mark.parametrize("option,value,needle", [
    ("--split", "nan,0.5,0.5", "--split"),
    ("--split", "inf,0,0", "--split"),
    ("--split", "-0.5,0.75,0.75", "--split"),
    ("--split", "0.7,0.15,0.1", "--split"),           # sums to 0.95
    ("--split", "0.7,0.15,0.15000001", "--split"),    # off by 1e-8 > 1e-9
    ("--min-age", "nan", "--min-age"),
    ("--max-age", "inf", "--max-age"),
    ("--min-age", "-inf", "--min-age"),
    ("--vitals-from-hours", "nan", "--vitals-from-hours"),
    ("--alpha", "nan", "--alpha"),
    ("--alpha", "inf", "--alpha"),
    ("--threads", "100000", "--threads must be between 1 and 1024"),
    ("--memory-limit", "99999999TB", "--memory-limit 99999999TB: "),
    ("--window-years", "2147483648", "--window-years must be between 1 and 10000, got 2147483648"),
    ("--window-origin", "99999999999999999999", "--window-origin must be between -10000 and 10000"),
    ("--n-centers", "9223372036854775808", "--n-centers must be between 1 and 1000000"),
])
def test_non_finite_or_bad_float_options_are_refused(mimic_demo_dir, tmp_path, capsys, option, value, needle):
    extra = ("--partition", "dirichlet") if option in ("--alpha", "--n-centers") else ()
    wide = () if option == "--window-years" else ("--window-years", "20")   # an option is given once
    code, err = _cli(capsys, "etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(tmp_path / "o"),
                     *wide, "--min-center-stays", "1", *extra, f"{option}={value}")
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1 and needle in lines[0], err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- copies of the demo tables

MIMIC_TABLES = ("hosp/patients", "hosp/admissions", "hosp/diagnoses_icd", "icu/icustays", "icu/chartevents")
WIDE = dict(window_years=20, min_center_stays=1)


def _copy_mimic(src: Path, dst: Path) -> Path:
    import shutil

    for rel in MIMIC_TABLES:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / f"{rel}.csv.gz", dst / f"{rel}.csv.gz")
    return dst


def _edit_column(path: Path, col: str, rows: tuple[int, ...], value: str) -> list[str]:
    """Set ``col`` of the given data rows (1 = first data row) of a gzip CSV to ``value``; returns
    the old values. The demo tables quote no field, so splitting on commas is exact for them."""
    import gzip

    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    i = lines[0].split(",").index(col)
    old = []
    for r in rows:
        cells = lines[r].split(",")
        old.append(cells[i])
        cells[i] = value
        lines[r] = ",".join(cells)
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=1))
    return old


def test_fractional_label_flag_is_refused_with_a_count(mimic_demo_dir, tmp_path):
    from etl.errors import InputError
    from etl.mimic import EtlOptions, run_etl

    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / "hosp/admissions.csv.gz"
    _edit_column(path, "hospital_expire_flag", (3, 10, 20), "0.6")  # DuckDB alone casts 0.6 to 1
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value) == f"{path}: column 'hospital_expire_flag' must be 0 or 1 (3 rows hold other values)"
    assert not (tmp_path / "o").exists()
    _edit_column(path, "hospital_expire_flag", (3, 10, 20), "1.0")  # a whole 1 written as a decimal reads as 1
    run_etl(src, tmp_path / "o", EtlOptions(**WIDE))


def test_an_icd_version_other_than_9_or_10_is_refused_with_a_count(mimic_demo_dir, tmp_path):
    # an ICD-11 code would match no Charlson code list and read as "no comorbidity", silently
    from etl.errors import InputError
    from etl.mimic import EtlOptions, run_etl

    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / "hosp/diagnoses_icd.csv.gz"
    _edit_column(path, "icd_version", (1, 5), "11")
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value) == f"{path}: column 'icd_version' must lie in [9, 10] (2 rows do not)"
    assert not (tmp_path / "o").exists()


def test_eicu_fractional_apache_flag_is_refused_with_a_count(eicu_demo_dir, tmp_path):
    import shutil

    from etl.eicu import REQUIRED, run_eicu_etl
    from etl.errors import InputError
    from etl.mimic import EtlOptions

    src = tmp_path / "e"
    src.mkdir()
    for name in REQUIRED:
        shutil.copy(eicu_demo_dir / f"{name}.csv.gz", src / f"{name}.csv.gz")
    path = src / "apachePredVar.csv.gz"
    _edit_column(path, "cirrhosis", (1, 2), "2")
    with pytest.raises(InputError) as e:
        run_eicu_etl(src, tmp_path / "o", EtlOptions(min_center_stays=10))
    assert str(e.value) == f"{path}: column 'cirrhosis' must be 0 or 1 (2 rows hold other values)"


@pytest.mark.parametrize("rel,col", [("hosp/patients", "anchor_age"), ("icu/icustays", "stay_id"),
                                     ("icu/chartevents", "itemid")])
def test_fractional_value_in_an_integer_column_is_refused_not_rounded(mimic_demo_dir, tmp_path, rel, col):
    from etl.errors import InputError
    from etl.mimic import EtlOptions, run_etl

    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / f"{rel}.csv.gz"
    old = _edit_column(path, col, (5,), "")[0]
    _edit_column(path, col, (5,), f"{old}.5")
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    msg = str(e.value)
    assert msg.startswith(f"{path}: column '{col}' holds values that are not whole numbers"), msg
    assert old not in msg.replace(str(path), "") and "\n" not in msg
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("fmt", ["csv.gz", "parquet"])
def test_header_only_chartevents_is_refused(mimic_demo_dir, tmp_path, fmt):
    import gzip

    import duckdb

    from etl.errors import InputError
    from etl.mimic import EtlOptions, run_etl

    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / "icu/chartevents.csv.gz"
    header = gzip.decompress(path.read_bytes()).decode().splitlines()[0]
    path.write_bytes(gzip.compress((header + "\n").encode()))
    if fmt == "parquet":
        pq = src / "icu/chartevents.parquet"
        duckdb.connect().execute(f"COPY (SELECT * FROM read_csv('{mimic_demo_dir}/icu/chartevents.csv.gz') "
                                 f"LIMIT 0) TO '{pq}' (FORMAT parquet)")
        path.unlink()
        path = pq
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value) == f"{path}: no data rows (a header only); every first-day vital comes from it"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("rel, why", [("icu/icustays", "every stay of the cohort is one of its rows"),
                                       ("hosp/admissions", "every stay's outcome comes from its admission"),
                                       ("hosp/patients", "every stay's age comes from its patient")])
def test_a_keyed_table_with_a_header_only_is_named(mimic_demo_dir, tmp_path, rel, why):
    """A header-only icustays, admissions or patients names its file (not an empty join)."""
    import gzip

    from etl.errors import InputError
    from etl.mimic import EtlOptions, run_etl

    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / f"{rel}.csv.gz"
    header = gzip.decompress(path.read_bytes()).decode().splitlines()[0]
    path.write_bytes(gzip.compress((header + "\n").encode()))
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value) == f"{path}: no data rows (a header only); {why}"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("rel", ["icu/chartevents", "hosp/admissions"])
@pytest.mark.parametrize("pad", [1, 7, 1024])
def test_zero_padding_after_the_gzip_stream_is_ignored(mimic_demo_dir, tmp_path, rel, pad):
    import polars as pl

    from etl.mimic import EtlOptions, run_etl

    ref = tmp_path / "ref"
    run_etl(mimic_demo_dir, ref, EtlOptions(**WIDE))
    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / f"{rel}.csv.gz"
    path.write_bytes(path.read_bytes() + b"\0" * pad)  # gzip -t and zcat accept this file
    assert subprocess.run(["gzip", "-t", str(path)]).returncode == 0
    rep = run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert rep["stays"] == 135
    assert pl.read_parquet(tmp_path / "o/cohort.parquet").equals(pl.read_parquet(ref / "cohort.parquet"))
    assert path.stat().st_size == (mimic_demo_dir / f"{rel}.csv.gz").stat().st_size + pad  # input untouched


def test_garbage_after_the_gzip_stream_names_the_file_and_reason(mimic_demo_dir, tmp_path, capsys):
    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / "icu/chartevents.csv.gz"
    path.write_bytes(path.read_bytes() + b"\0" * 16 + b"not gzip at all" * 10)
    code, err = _cli(capsys, "etl", "--mimic-dir", str(src), "--out", str(tmp_path / "o"),
                     "--window-years", "20", "--min-center-stays", "1")
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {path}: unreadable gzip (") and "input tables" not in lines[0], lines[0]
    assert not (tmp_path / "o").exists()


def _damage(path: Path, how: str) -> None:
    import gzip

    raw = path.read_bytes()
    if how == "cut":
        path.write_bytes(raw[: len(raw) // 2])
        return
    lines = gzip.decompress(raw).decode().split("\n")
    if how == "extra-field":
        lines[40] += ",x"
    elif how == "bad-time":  # admittime in month 13
        cells = lines[40].split(",")
        cells[lines[0].split(",").index("admittime")] = "2180-13-01 10:00:00"
        lines[40] = ",".join(cells)
    path.write_bytes(gzip.compress("\n".join(lines).encode()))


@pytest.mark.parametrize("rel,how", [("hosp/admissions", "extra-field"), ("hosp/admissions", "bad-time"),
                                     ("icu/icustays", "cut"), ("hosp/diagnoses_icd", "cut")])
def test_small_tables_read_from_an_isal_copy_give_the_errors_of_the_gzip(mimic_demo_dir, tmp_path, capsys,
                                                                        monkeypatch, rel, how):
    """The keyed tables are read from a copy ISA-L inflates (etl.sources.inflated): a damaged file
    gives the one line DuckDB's read of the gzip itself gives, naming the source file."""
    import etl.mimic

    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    _damage(src / f"{rel}.csv.gz", how)
    outcomes = []
    for label, copy in (("isal", etl.mimic.inflated), ("gzip", lambda table, folder: table)):
        monkeypatch.setattr(etl.mimic, "inflated", copy)
        code, err = _cli(capsys, "etl", "--mimic-dir", str(src), "--out", str(tmp_path / label),
                         "--window-years", "20", "--min-center-stays", "1")
        outcomes.append((code, [ln for ln in err.splitlines() if ln.startswith("error:")]))
        assert not (tmp_path / label).exists()
    assert outcomes[0] == outcomes[1]
    code, lines = outcomes[0]
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {src / rel}.csv.gz: "), lines
    # chartevents' reading, started before the checks, stopped with the run
    import threading

    assert not [t.name for t in threading.enumerate() if t.name.startswith(("chartevents-read", "chartevents-parse"))]


def _overwrite_until(raw: bytes, error: str) -> bytes:
    """``raw`` (a gzip file) with 64 bytes of 0xff written at the first tenth (of nine) at which
    ISA-L's inflation raises the exception class named ``error``."""
    import io

    from isal import igzip_threaded

    for tenth in range(1, 10):
        damaged = bytearray(raw)
        at = len(raw) * tenth // 10
        damaged[at: at + 64] = b"\xff" * 64
        try:
            with igzip_threaded.open(io.BytesIO(bytes(damaged)), "rb", threads=1) as f:
                while f.read(1 << 20):
                    pass
        except Exception as exc:
            if exc.__class__.__name__ == error:
                return bytes(damaged)
    raise AssertionError(f"no overwrite gives {error}")


@pytest.mark.parametrize("error", ["IsalError", "BadGzipFile"])
def test_damaged_deflate_stream_in_chartevents_names_the_file(mimic_demo_dir, tmp_path, capsys, error):
    """Bytes overwritten inside chartevents' deflate stream (an invalid block: ISA-L's IsalError;
    or a wrong CRC: BadGzipFile) in the reading thread hand the file to DuckDB, whose one line
    names it: no traceback, exit 2, no output."""
    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / "icu/chartevents.csv.gz"
    path.write_bytes(_overwrite_until(path.read_bytes(), error))
    code, err = _cli(capsys, "etl", "--mimic-dir", str(src), "--out", str(tmp_path / "o"),
                     "--window-years", "20", "--min-center-stays", "1", "--chart-cache", "off")
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: {path}: "), lines[0]
    assert not (tmp_path / "o").exists()


def test_signal_watcher_survives_a_signal_while_etl_sources_is_imported(monkeypatch):
    """A signal that arrives while etl.sources is half imported (no ``interrupt_all`` yet) is
    skipped by the watcher thread, which goes on to interrupt the queries of a later signal, again
    and again until the main thread has run the Python handler."""
    import types

    import cli.app

    calls = []
    half = types.ModuleType("etl.sources")
    monkeypatch.setitem(sys.modules, "etl.sources", half)
    r, w = os.pipe()
    import threading

    t = threading.Thread(target=cli.app._watch_signals, args=(r,), daemon=True)
    t.start()
    os.write(w, bytes([signal.SIGINT]))
    time.sleep(0.2)
    monkeypatch.setitem(cli.app._received, "signal", None)

    def interrupt_all():  # the query stops at the third interrupt, and the Python handler runs
        calls.append(1)
        if len(calls) == 3:
            cli.app._received["signal"] = signal.SIGTERM

    half.interrupt_all = interrupt_all
    os.write(w, bytes([signal.SIGTERM]))
    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.close(w)
    t.join(timeout=5)
    os.close(r)
    # interrupted again until the handler had run: a query prepared when the signal came is stopped
    assert calls == [1, 1, 1] and not t.is_alive()


@pytest.mark.parametrize("rel", ["hosp/patients", "hosp/admissions", "icu/icustays", "icu/chartevents",
                                 "hosp/diagnoses_icd"])
def test_a_utf8_byte_order_mark_before_the_header_is_read_as_no_mark(mimic_demo_dir, tmp_path, rel):
    """Spreadsheet programs write a UTF-8 BOM (EF BB BF) before the header; DuckDB and Arrow skip
    it, so the header check must too: the same cohort as without the mark."""
    import gzip

    import polars as pl

    from etl.mimic import EtlOptions, run_etl

    ref = tmp_path / "ref"
    run_etl(mimic_demo_dir, ref, EtlOptions(**WIDE))
    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / f"{rel}.csv.gz"
    path.write_bytes(gzip.compress(b"\xef\xbb\xbf" + gzip.decompress(path.read_bytes()), compresslevel=1))
    run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert pl.read_parquet(tmp_path / "o/cohort.parquet").equals(pl.read_parquet(ref / "cohort.parquet"))


def test_a_byte_order_mark_inside_the_header_is_named(mimic_demo_dir, tmp_path):
    import gzip

    from etl.errors import InputError
    from etl.mimic import EtlOptions, run_etl

    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / "hosp/patients.csv.gz"
    text = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(text.replace(b",gender", b",\xef\xbb\xbfgender", 1), compresslevel=1))
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value) == f"{path}: column 'gender' is written with an invisible character in the header (U+FEFF)"


# the console script's entry with a command that succeeds, then receives a signal: right after
# cli.app.main has put Python's handlers back (argv[1] == "returning"), or at the exit (atexit)
_SIGNAL_AFTER = """
import atexit, os, signal, sys
import cli.app
when = sys.argv[1]
def command():
    if when == "returning":
        os.kill(os.getpid(), signal.SIGINT)
if when == "exit":
    atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), os.kill(os.getpid(), signal.SIGTERM)))
cli.app.main = command
from cli.entry import main
main()
"""


@pytest.mark.parametrize(("when", "code", "line"), [("returning", 130, "error: interrupted"), ("exit", 0, "")])
def test_a_signal_after_the_command_has_returned(tmp_path, when, code, line):
    """A Ctrl-C as the command returns exits 130 with the one line; a signal once the entry has
    returned is ignored: the command's exit code stands (not a silent death by the signal)."""
    script = tmp_path / "after.py"
    script.write_text(_SIGNAL_AFTER)
    p = subprocess.run([sys.executable, str(script), when], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert p.returncode == code and p.stderr.strip() == line, (p.returncode, p.stderr[-800:])


def test_a_mimic_dir_from_the_environment_is_named_as_such(tmp_path, monkeypatch, capsys):
    from cli.app import main

    monkeypatch.setenv("MIMIC_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit) as exc:
        main(["etl", "--out", str(tmp_path / "cohort")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err == f"error: MIMIC_DIR {tmp_path / 'nowhere'}: not a directory (the " \
        "environment variable; --mimic-dir names another folder)"


def test_a_folder_that_cannot_be_searched_is_one_line(mimic_demo_dir, tmp_path, monkeypatch, capsys):
    """A hosp/ or icu/ folder without search permission makes Path.is_file raise (root ignores
    chmod, so the refusal is stood in for): one line naming the folder, exit 2."""
    from cli.app import main

    hosp = mimic_demo_dir / "hosp"
    real = Path.is_file

    def is_file(self):
        if self.parent == hosp:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "is_file", is_file)
    with pytest.raises(SystemExit) as exc:
        main(["etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(tmp_path / "o"), "--chart-cache", "off"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: {hosp}: unreadable folder (permission denied)"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("rel", ["hosp/patients", "icu/icustays"])
def test_an_unclosed_quote_is_named_with_the_line_it_opens_on(mimic_demo_dir, tmp_path, rel):
    """A quote that nothing closes makes DuckDB read the rest of the file as one field; its sniffer
    then gives up without a line. The error names the file and the line the quote opens on."""
    from etl.errors import InputError
    from etl.mimic import EtlOptions, run_etl

    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / f"{rel}.csv.gz"
    old = _edit_column(path, "subject_id", (5,), "x")[0]
    _edit_column(path, "subject_id", (5,), f'"{old}')      # data row 5 = line 6 of the file
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value).startswith(f'{path}: a quote (") opens on line 6 and is not closed before the end of the file')
    assert old not in str(e.value) and not (tmp_path / "o").exists()


def test_unclosed_quote_line_follows_rfc4180_quoting(tmp_path):
    from etl.sources import unclosed_quote_line

    p = tmp_path / "t.csv"
    p.write_bytes(b'a,b\n1,"two\nlines"\n3,"say ""hi"""\n4,"x\n')
    assert unclosed_quote_line(p) == 5          # the multi-line field and the escapes are closed
    p.write_bytes(b'a,b\n1,"two\nlines"\n3,"say ""hi"""\n')
    assert unclosed_quote_line(p) is None


def test_a_repeated_signal_does_not_cut_the_unwinding_short(monkeypatch):
    """Ctrl-C pressed twice: the second, within the grace time, is ignored so that the temporary
    outputs of the first are removed; a later one interrupts again."""
    import cli.app as app

    monkeypatch.setattr(app, "_received", {"signal": None, "at": None})
    with pytest.raises(KeyboardInterrupt):
        app._on_sigint(signal.SIGINT, None)
    app._on_sigint(signal.SIGINT, None)                       # ignored
    app._on_sigterm(signal.SIGTERM, None)                     # ignored too: one unwinding at a time
    app._received["at"] -= app.REPEAT_GRACE_S + 1
    with pytest.raises(SystemExit) as e:
        app._on_sigterm(signal.SIGHUP, None)
    assert e.value.code == 129 and app._received["signal"] == signal.SIGHUP


@pytest.mark.parametrize("change,fields", [("extra", 7), ("short", 5)])
def test_a_row_of_another_width_is_named_with_its_line(mimic_demo_dir, tmp_path, change, fields):
    """DuckDB's sniffer gives up on such a file without a line; the error names the row's line and
    its width against the header's (patients has 6 columns), never its values."""
    import gzip

    from etl.errors import InputError
    from etl.mimic import EtlOptions, run_etl

    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / "hosp/patients.csv.gz"
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    lines[9] = lines[9] + ",x" if change == "extra" else lines[9].rsplit(",", 1)[0]   # line 10 of the file
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value).startswith(f"{path}: line 10 has {fields} fields where the header has 6")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("source,rel,col", [("mimic", "icu/icustays", "first_careunit"),
                                            ("mimic", "hosp/admissions", "race"),
                                            ("eicu", "patient", "unittype"), ("eicu", "hospital", "region")])
def test_a_nul_byte_in_a_text_column_is_refused_with_its_line(mimic_demo_dir, eicu_demo_dir, tmp_path, source,
                                                               rel, col):
    """A NUL byte marks a damaged file; read as is it would reach the outputs (a care unit, a center
    name). The error names the file, the column, the count and the line, never the value."""
    import csv
    import gzip
    import io
    import shutil

    from etl.eicu import REQUIRED, run_eicu_etl
    from etl.errors import InputError
    from etl.mimic import EtlOptions, run_etl

    if source == "mimic":
        src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    else:
        src = tmp_path / "e"
        src.mkdir()
        for name in REQUIRED:
            shutil.copy(eicu_demo_dir / f"{name}.csv.gz", src / f"{name}.csv.gz")
    path = src / f"{rel}.csv.gz"
    rows = list(csv.reader(io.StringIO(gzip.decompress(path.read_bytes()).decode(), newline="")))
    i = rows[0].index(col)
    for r in (4, 7):                                          # data row 4 = line 5 of the file
        rows[r][i] += "\0"
    text = io.StringIO(newline="")
    csv.writer(text, lineterminator="\n").writerows(rows)    # eICU quotes fields holding commas
    path.write_bytes(gzip.compress(text.getvalue().encode()))
    with pytest.raises(InputError) as e:
        if source == "mimic":
            run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
        else:
            run_eicu_etl(src, tmp_path / "o", EtlOptions(min_center_stays=10))
    assert str(e.value) == f"{path}: column '{col}' holds a NUL byte in 2 rows (a damaged file?); the first on line 5"
    assert not (tmp_path / "o").exists()


def test_carriage_return_line_ends_and_a_header_without_a_line_break_are_named(mimic_demo_dir, tmp_path):
    """Lines ending in CR alone read as one line, which DuckDB calls an empty or headerless file;
    the error says what the lines end in. A first line over 1 MiB is not read into memory whole."""
    import gzip

    from etl import sources
    from etl.errors import InputError
    from etl.mimic import EtlOptions, run_etl

    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / "hosp/patients.csv.gz"
    text = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(text.replace(b"\n", b"\r")))
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value) == (f"{path}: its lines end in a carriage return alone (classic Mac OS); convert them to "
                            "line feeds, e.g. tr '\\r' '\\n'")
    path.write_bytes(gzip.compress(text.replace(b"\n", b"\r\n")))   # Windows line ends read as the file
    run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    path.write_bytes(gzip.compress(b"x" * (sources.HEADER_MAX_BYTES + 10)))
    with pytest.raises(InputError, match=r"patients.csv.gz: no line break in the first 1 MiB \(not a CSV header\)$"):
        run_etl(src, tmp_path / "o2", EtlOptions(**WIDE))


def test_a_line_past_duckdbs_line_size_is_named_with_its_line(mimic_demo_dir, tmp_path):
    """DuckDB counts the lines of its read buffer when a line passes its 2 MB limit ("line 1");
    the error names the file's own line and its size, never its text."""
    from etl.errors import InputError
    from etl.mimic import EtlOptions, run_etl
    from etl.sources import long_line

    src = _copy_mimic(mimic_demo_dir, tmp_path / "m")
    path = src / "hosp/admissions.csv.gz"
    _edit_column(path, "race", (20,), "A" * 2_500_000)     # data row 20 = line 21 of the file
    with pytest.raises(InputError) as e:
        run_etl(src, tmp_path / "o", EtlOptions(**WIDE))
    assert str(e.value).startswith(f"{path}: line 21 holds 2.5 MB, past the 2 MB a CSV line may hold")
    assert "AAA" not in str(e.value) and not (tmp_path / "o").exists()
    p = tmp_path / "t.csv"
    p.write_bytes(b"a,b\n" + b"x" * 10 + b"\n" + b"y" * (3 << 20))   # the last line has no line break
    assert long_line(p, 10) == (3, 3 << 20) and long_line(p, 3 << 20) is None

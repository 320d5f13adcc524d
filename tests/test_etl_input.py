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


# A child `abps etl` whose first-day vitals step first runs a DuckDB query that never ends on its
# own, on the ETL's connection, after writing "ready" to stderr: a signal sent then always
# arrives while DuckDB is executing (with --threads 1 the main thread runs the query's tasks and
# DuckDB checks for a pending signal between them).
_BUSY_CHILD = """
import sys
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


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_during_a_duckdb_query_exits_interrupted(mimic_demo_dir, tmp_path, sig, code):
    out = tmp_path / "o"
    p = subprocess.Popen([sys.executable, "-c", _BUSY_CHILD, "etl", "--mimic-dir", str(mimic_demo_dir),
                          "--out", str(out), "--window-years", "20", "--min-center-stays", "1", "--threads", "1"],
                         stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=_env())
    try:
        deadline = time.monotonic() + 120
        for line in p.stderr:
            if line.strip() == "ready" or time.monotonic() > deadline:
                break
        time.sleep(0.3)
        p.send_signal(sig)
        err = p.stderr.read()
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == code, err[-800:]
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "error: interrupted"
    assert not out.exists() and not [q for q in tmp_path.iterdir() if ".tmp-" in q.name]


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
])
def test_non_finite_or_bad_float_options_are_refused(mimic_demo_dir, tmp_path, capsys, option, value, needle):
    extra = ("--partition", "dirichlet") if option == "--alpha" else ()
    code, err = _cli(capsys, "etl", "--mimic-dir", str(mimic_demo_dir), "--out", str(tmp_path / "o"),
                     "--window-years", "20", "--min-center-stays", "1", *extra, f"{option}={value}")
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1 and needle in lines[0], err
    assert not (tmp_path / "o").exists()

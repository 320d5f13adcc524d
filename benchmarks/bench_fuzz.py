"""Fuzz pass over the ETL's inputs: mutate one table of the real MIMIC-IV demo (bytes or columns) and
check that `abps etl` gives either the clean cohort or one ``error:`` line naming the mutated file,
never a traceback and never a partial output.

``python -m benchmarks.run fuzz [-- --examples N --seed S]`` runs N hypothesis examples (default 200);
``tests/test_fuzz_inputs.py`` runs a seeded, derandomized handful in CI. Mutations: truncate the gzip
stream, zero padding after it (harmless: gzip reads it), flip a compressed byte, drop / rename /
retype a column, a duplicated header name, a value in Latin-1 (not UTF-8), a huge or negative
number, an empty file. The demo folder is ``$ABPS_SHARED/data/mimic-iv-demo`` (default ``../shared``).
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

TABLES = ("hosp/patients", "hosp/admissions", "hosp/diagnoses_icd", "icu/icustays", "icu/chartevents")
KINDS = ("truncate", "pad_zeros", "flip_byte", "drop_column", "rename_column", "retype_column", "duplicate_header",
         "latin1_value", "huge_value", "negative_value", "empty_file")
ETL_ARGS = ["--window-years", "20", "--min-center-stays", "1", "--threads", "1", "--chart-cache", "off"]


def demo_dir() -> Path:
    shared = Path(os.environ.get("ABPS_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
    return shared / "data" / "mimic-iv-demo"


@dataclass(frozen=True)
class Mutation:
    """One change to one table: ``kind`` (see :data:`KINDS`) at position ``at`` (a fraction of the
    file, or a column / row choice)."""

    table: str
    kind: str
    at: float

    def apply(self, path: Path) -> None:
        raw = path.read_bytes()
        if self.kind == "truncate":
            path.write_bytes(raw[: max(1, int(len(raw) * self.at))])
            return
        if self.kind == "pad_zeros":
            path.write_bytes(raw + b"\0" * (1 + int(4096 * self.at)))
            return
        if self.kind == "flip_byte":
            i = 10 + int((len(raw) - 18) * self.at)  # inside the deflate stream (header 10 B, trailer 8 B)
            path.write_bytes(raw[:i] + bytes([raw[i] ^ 0xFF]) + raw[i + 1:])
            return
        if self.kind == "empty_file":
            path.write_bytes(b"")
            return
        lines = gzip.decompress(raw).decode("utf-8").split("\n")
        header = lines[0].split(",")
        col = int(self.at * len(header)) % len(header)
        row = 1 + int(self.at * (len(lines) - 2)) % max(1, len(lines) - 2)
        if self.kind in ("drop_column", "rename_column", "retype_column", "duplicate_header"):
            cells = [ln.split(",") for ln in lines]  # the demo's quoted fields hold no comma in these tables
            if self.kind == "drop_column":
                cells = [c[:col] + c[col + 1:] if len(c) == len(header) else c for c in cells]
            elif self.kind == "rename_column":
                cells[0][col] = cells[0][col] + "_x"
            elif self.kind == "duplicate_header":
                cells[0][col] = cells[0][(col + 1) % len(header)]
            else:
                for c in cells[1:]:
                    if len(c) == len(header):
                        c[col] = "abc"
            text = "\n".join(",".join(c) for c in cells)
            path.write_bytes(gzip.compress(text.encode("utf-8")))
            return
        cells = lines[row].split(",")
        num = [i for i, v in enumerate(cells) if v.strip().lstrip("-").replace(".", "", 1).isdigit()]
        if self.kind == "latin1_value":
            i = col % len(cells)
            cells[i] = "caf\xe9"
            lines[row] = ",".join(cells)
            path.write_bytes(gzip.compress("\n".join(lines).encode("latin-1")))
            return
        if num:
            i = num[col % len(num)]
            cells[i] = "99999999999999999999" if self.kind == "huge_value" else "-" + cells[i].lstrip("-") + "1"
        lines[row] = ",".join(cells)
        path.write_bytes(gzip.compress("\n".join(lines).encode("utf-8")))


def copy_demo(src: Path, dst: Path) -> Path:
    for rel in TABLES:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / f"{rel}.csv.gz", dst / f"{rel}.csv.gz")
        (dst / f"{rel}.csv.gz").chmod(0o644)
    return dst


def run_etl(src: Path, out: Path) -> tuple[int, str]:
    """``abps etl`` in this process; (exit code, stderr). An uncaught exception propagates."""
    import contextlib
    import io

    from cli.app import main

    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(["etl", "--mimic-dir", str(src), "--out", str(out), *ETL_ARGS])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, err.getvalue()


def cohort_of(out: Path):
    import polars as pl

    return pl.read_parquet(out / "cohort.parquet"), pl.read_parquet(out / "centers.parquet")


def check(m: Mutation, clean: Path, work: Path) -> str:
    """Apply ``m`` to a copy of the demo, run the ETL, and check the outcome; returns ``"clean"`` or
    ``"refused"``. Raises AssertionError for a wrong outcome (a different cohort, an error line
    that does not name the file, more than one line, a partial output)."""
    src = copy_demo(demo_dir(), work / "src")
    m.apply(src / f"{m.table}.csv.gz")
    out = work / "out"
    code, err = run_etl(src, out)
    assert "Traceback" not in err, err[-1000:]
    name = Path(m.table).name + ".csv.gz"
    if code == 0:
        got, want = cohort_of(out), cohort_of(clean)
        assert got[0].equals(want[0]) and got[1].equals(want[1]), f"{m}: exit 0 with another cohort"
        return "clean"
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("warning:", "note:", "found "))]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), f"{m}: {code} {err[-600:]}"
    assert name in lines[0], f"{m}: the error does not name {name}: {lines[0]}"
    assert not out.exists() and not [p for p in work.iterdir() if ".tmp-" in p.name], f"{m}: partial output"
    return "refused"


def clean_cohort(work: Path) -> Path:
    out = work / "clean"
    code, err = run_etl(copy_demo(demo_dir(), work / "clean-src"), out)
    assert code == 0, err
    return out


def main(argv: list[str] | None = None) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    os.environ.setdefault("ABPS_STATE", str(Path(tempfile.mkdtemp()) / "state.json"))
    root = Path(tempfile.mkdtemp(prefix="abps-fuzz-"))
    clean = clean_cohort(root)
    outcomes: dict[str, int] = {}
    t0 = time.perf_counter()

    @settings(max_examples=a.examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(TABLES), st.sampled_from(KINDS), st.floats(0.0, 0.999))
    def one(table: str, kind: str, at: float) -> None:
        work = Path(tempfile.mkdtemp(dir=root))
        try:
            r = check(Mutation(table, kind, at), clean, work)
            outcomes[f"{kind}:{r}"] = outcomes.get(f"{kind}:{r}", 0) + 1
        finally:
            shutil.rmtree(work, ignore_errors=True)

    import random

    random.seed(a.seed)
    one()
    shutil.rmtree(root, ignore_errors=True)
    print(f"fuzz: {a.examples} examples in {time.perf_counter() - t0:.0f} s, every one the clean cohort or one "
          f"error line naming the file: {dict(sorted(outcomes.items()))}")


if __name__ == "__main__":
    main()

"""Fuzz pass over the ETL's inputs: mutate one table of the real MIMIC-IV demo (bytes or columns) and
check that `abps etl` gives either the clean cohort or one ``error:`` line naming the mutated file,
never a traceback and never a partial output.

``python -m benchmarks.run fuzz [-- --examples N --seed S --source mimic|eicu|meds|config|all]`` runs N
hypothesis examples per source (default 200, every source); the eICU, MEDS and config parts are
described above :data:`EICU_TABLES`;
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


# ------------------------------------------------------------------ eICU, MEDS and config files
#
# The same contract for the other inputs: a mutated eICU table, MEDS file or run config gives a
# whole output (a cohort folder whose files match the SHA-256 its report records; a results
# file) or one ``error:`` line naming the mutated file; never a traceback or a partial output.

EICU_TABLES = ("patient", "hospital", "apacheApsVar", "vitalAperiodic", "diagnosis", "pastHistory", "apachePredVar")
#: eICU mutations: the byte and column kinds of the MIMIC pass plus non-finite and negative values
EICU_KINDS = ("truncate", "flip_byte", "empty_file", "drop_column", "retype_column", "nan_value", "inf_value",
              "negative_value", "pad_zeros")
MEDS_FILES = ("data/tuning/0.parquet", "data/held_out/0.parquet", "metadata/codes.parquet",
              "metadata/subject_splits.parquet", "metadata/dataset.json")
MEDS_KINDS = ("truncate", "flip_byte", "empty_file", "garbage", "drop_column", "retype_column", "nan_value",
              "negative_value")
CONFIG_KINDS = ("truncate", "flip_byte", "latin1", "drop_line", "retype_value", "nan_value", "inf_value",
                "negative_value", "duplicate_key")


def eicu_dir() -> Path:
    return demo_dir().parent / "eicu-demo"


def meds_dir() -> Path:
    return demo_dir().parent / "mimic-iv-demo-extra" / "meds-official"


def _bytes_mutation(raw: bytes, kind: str, at: float) -> bytes | None:
    """The byte-level kinds shared by every file; None for a kind that is not one of them."""
    if kind == "truncate":
        return raw[: int(len(raw) * at)]
    if kind == "empty_file":
        return b""
    if kind == "flip_byte":
        i = min(len(raw) - 1, int(len(raw) * at))
        return raw[:i] + bytes([raw[i] ^ 0xFF]) + raw[i + 1:]
    if kind == "garbage":
        return bytes((i * 131 + int(at * 997)) % 256 for i in range(4096))
    if kind == "pad_zeros":
        return raw + b"\0" * (1 + int(4096 * at))
    return None


_BAD_VALUE = {"nan_value": "nan", "inf_value": "inf", "retype_column": "abc", "retype_value": "abc",
              "negative_value": None}


def mutate_csv_gz(path: Path, kind: str, at: float) -> None:
    """One mutation of a ``.csv.gz`` table: bytes, a dropped column, or one column's values (every
    row) replaced by ``abc`` / ``nan`` / ``inf`` / their negative."""
    raw = path.read_bytes()
    path.unlink()  # a link into the demo is replaced, never written through
    done = _bytes_mutation(raw, kind, at)
    if done is not None:
        path.write_bytes(done)
        return
    import csv
    import io

    rows = list(csv.reader(io.StringIO(gzip.decompress(raw).decode("utf-8"))))
    col = int(at * len(rows[0])) % len(rows[0])
    for r in rows:
        if len(r) != len(rows[0]):
            continue
        if kind == "drop_column":
            del r[col]
        elif r is not rows[0] and r[col] != "":
            r[col] = _BAD_VALUE[kind] if _BAD_VALUE.get(kind) else "-" + r[col].lstrip("-") + "1"
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    path.write_bytes(gzip.compress(buf.getvalue().encode("utf-8"), compresslevel=1))


def mutate_parquet(path: Path, kind: str, at: float) -> None:
    """One mutation of a Parquet (or JSON) file: bytes, a dropped column, or one column's values
    replaced: text ``abc`` (the column becomes text), NaN, or negated."""
    import polars as pl

    raw = path.read_bytes()
    path.unlink()
    done = _bytes_mutation(raw, kind, at)
    if done is not None or path.suffix != ".parquet":
        path.write_bytes(raw if done is None else done)
        return
    df = pl.read_parquet(io_bytes(raw))
    name = df.columns[int(at * df.width) % df.width]
    c = pl.col(name)
    if kind == "drop_column":
        df = df.drop(name)
    elif kind == "retype_column":
        df = df.with_columns(pl.lit("abc").alias(name))
    elif kind == "nan_value":
        df = df.with_columns(pl.when(c.is_not_null()).then(float("nan")).otherwise(None).alias(name)
                             if df.schema[name].is_numeric() else c)
    elif kind == "negative_value" and df.schema[name].is_numeric():
        df = df.with_columns(-c)
    df.write_parquet(path)


def io_bytes(raw: bytes):
    import io

    return io.BytesIO(raw)


def mutate_yaml(path: Path, kind: str, at: float) -> None:
    """One mutation of a YAML config: bytes, Latin-1 text, a line dropped, a key repeated, or one
    value replaced by ``abc`` / ``.nan`` / ``.inf`` / its negative."""
    raw = path.read_bytes()
    done = _bytes_mutation(raw, kind, at)
    if done is not None:
        path.write_bytes(done)
        return
    if kind == "latin1":
        path.write_bytes(raw + "# caf\xe9\n".encode("latin-1"))
        return
    lines = raw.decode("utf-8").splitlines()
    valued = [i for i, ln in enumerate(lines) if ":" in ln and ln.split(":", 1)[1].strip()
              and not ln.lstrip().startswith("#")]
    i = valued[int(at * len(valued)) % len(valued)]
    key, value = lines[i].split(":", 1)
    if kind == "drop_line":
        del lines[i]
    elif kind == "duplicate_key":
        lines.insert(i + 1, lines[i])
    else:
        new = {"retype_value": "abc", "nan_value": ".nan", "inf_value": ".inf"}.get(kind)
        if new is None:  # negative: the first number of the value
            import re

            new = re.sub(r"(?<![\w.])(\d)", r"-\1", value.strip(), count=1)
        lines[i] = f"{key}: {new}"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``abps ARGV`` in this process; (exit code, stderr). An uncaught exception propagates."""
    import contextlib
    import io

    from cli.app import main as cli_main

    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            cli_main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, err.getvalue()


def check_outcome(what: str, code: int, err: str, named: Path, out: Path) -> str:
    """The contract for one run: ``"whole"`` (exit 0 and ``out`` complete) or ``"refused"`` (exit 2,
    one error line naming ``named``, nothing at ``out``). Raises AssertionError otherwise."""
    from etl.io import check_cohort_files

    assert "Traceback" not in err, f"{what}: {err[-1000:]}"
    if code == 0:
        if out.suffix == ".json":
            import json

            json.loads(out.read_text())
        else:
            check_cohort_files(out)  # the pair matches the SHA-256 its report records
        return "whole"
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("warning:", "note:", "found "))
             and " INFO " not in ln]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), f"{what}: {code} {err[-600:]}"
    assert str(named) in lines[0] or named.name in lines[0], f"{what}: the error does not name {named}: {lines[0]}"
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*")), f"{what}: partial output"
    return "refused"


def _linked(src: Path, dst: Path) -> Path:
    for p in src.rglob("*"):
        if p.is_file() and not p.name.endswith((".txt", ".md")):
            (dst / p.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (dst / p.relative_to(src)).symlink_to(p)
    return dst


def check_eicu(table: str, kind: str, at: float, work: Path) -> str:
    """Mutate one eICU demo table and run ``abps etl --source eicu`` (see :func:`check_outcome`)."""
    src = work / "eicu"
    src.mkdir(parents=True)
    for t in EICU_TABLES:
        (src / f"{t}.csv.gz").symlink_to(eicu_dir() / f"{t}.csv.gz")
    mutate_csv_gz(src / f"{table}.csv.gz", kind, at)
    out = work / "out"
    code, err = run_cli(["etl", "--source", "eicu", "--data-dir", str(src), "--out", str(out), "--threads", "1"])
    return check_outcome(f"eicu {table} {kind} {at}", code, err, src / f"{table}.csv.gz", out)


def check_meds(rel: str, kind: str, at: float, work: Path) -> str:
    """Mutate one MEDS demo file and run ``abps etl --source meds`` (see :func:`check_outcome`)."""
    src = _linked(meds_dir(), work / "meds")
    mutate_parquet(src / rel, kind, at)
    out = work / "out"
    code, err = run_cli(["etl", "--source", "meds", "--data-dir", str(src), "--meds-splits", "tuning,held_out",
                         "--min-center-stays", "1", "--out", str(out), "--threads", "1"])
    return check_outcome(f"meds {rel} {kind} {at}", code, err, src / rel, out)


def config_text(repo: Path) -> str:
    """The fuzzed run config: configs/fedavg.yaml with configs/realworld-daily30.yaml's block."""
    return (repo / "configs" / "fedavg.yaml").read_text() + (repo / "configs" / "realworld-daily30.yaml").read_text()


def check_config(kind: str, at: float, cohort: Path, work: Path) -> str:
    """Mutate the run config and run ``abps train --config`` for one round on ``cohort``."""
    repo = Path(__file__).resolve().parents[1]
    cfg = work / "run.yaml"
    cfg.write_text(config_text(repo))
    mutate_yaml(cfg, kind, at)
    out = work / "results.json"
    code, err = run_cli(["train", "--method", "fedavg", "--config", str(cfg), "--cohort", str(cohort), "--seeds", "1",
                         "--rounds", "1", "--no-progress", "--tracking-uri", f"sqlite:///{work / 'm.db'}",
                         "--output", str(out)])
    return check_outcome(f"config {kind} {at}", code, err, cfg, out)


def main(argv: list[str] | None = None) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hyp_seed
    from hypothesis import strategies as st

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=200, help="examples per source")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", choices=("mimic", "eicu", "meds", "config", "all"), default="all")
    a = ap.parse_args(argv)
    os.environ.setdefault("ABPS_STATE", str(Path(tempfile.mkdtemp()) / "state.json"))
    root = Path(tempfile.mkdtemp(prefix="abps-fuzz-"))
    outcomes: dict[str, int] = {}
    floats = st.floats(0.0, 0.999)
    sources = ("mimic", "eicu", "meds", "config") if a.source == "all" else (a.source,)
    clean = clean_cohort(root) if "mimic" in sources else None
    cohort = None
    if "config" in sources:
        from federation.data.synthetic import write_fedprox_cohort

        cohort = write_fedprox_cohort(root / "cohort", n_centers=3, seed=2, mean_size=50.0)
    draws = {
        "mimic": (st.tuples(st.sampled_from(TABLES), st.sampled_from(KINDS), floats),
                  lambda d, w: check(Mutation(*d), clean, w)),
        "eicu": (st.tuples(st.sampled_from(EICU_TABLES), st.sampled_from(EICU_KINDS), floats),
                 lambda d, w: check_eicu(*d, w)),
        "meds": (st.tuples(st.sampled_from(MEDS_FILES), st.sampled_from(MEDS_KINDS), floats),
                 lambda d, w: check_meds(*d, w)),
        "config": (st.tuples(st.sampled_from(CONFIG_KINDS), floats), lambda d, w: check_config(*d, cohort, w)),
    }
    t0 = time.perf_counter()
    def fuzz(source: str) -> None:
        strategy, run = draws[source]

        @hyp_seed(a.seed)
        @settings(max_examples=a.examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(strategy)
        def one(drawn) -> None:
            work = Path(tempfile.mkdtemp(dir=root))
            try:
                r = run(drawn, work)
                key = f"{source}:{drawn[-2]}:{r}"
                outcomes[key] = outcomes.get(key, 0) + 1
            finally:
                shutil.rmtree(work, ignore_errors=True)

        one()

    for source in sources:
        fuzz(source)
    shutil.rmtree(root, ignore_errors=True)
    print(f"fuzz: {a.examples} examples per source ({', '.join(sources)}) in {time.perf_counter() - t0:.0f} s, "
          f"every one a whole output or one error line naming the file: {dict(sorted(outcomes.items()))}")


if __name__ == "__main__":
    main()

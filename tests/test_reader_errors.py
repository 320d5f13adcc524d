"""Every reader names its file (and column or key): the eICU and MEDS readers, the run, sweep and
benchmark configs, availability traces and cohort folders, each given damaged files in a table of
cases; Parquet tables whose integer columns are stored as DECIMAL are refused, not rounded, when a
value is fractional, as in a CSV."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from conftest import EICU_DEMO, MIMIC_DEMO

from cli.app import main

REPO = Path(__file__).resolve().parents[1]
MEDS_DEMO = MIMIC_DEMO.parent / "mimic-iv-demo-extra" / "meds-official"

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


def test_a_meds_version_this_reader_does_not_know_is_read_with_a_warning(tmp_path, capsys):
    argv, named = _meds(tmp_path, "metadata/dataset.json", b'{"meds_version": "9.9"}')
    code, err = _run(capsys, [*argv, "--out", str(tmp_path / "o")])
    assert code == 0, err
    (line,) = [ln for ln in err.splitlines() if "meds_version" in ln]
    assert line == f"warning: {named}: meds_version 9.9 is not a MEDS release this reader knows (0.3, 0.4); " \
                   "its events are read as MEDS 0.3's"
    assert json.loads((tmp_path / "o" / "cohort_report.json").read_text())["inputs"]["meds_version"] == "9.9"


# ------------------------------------------------------------------ every reader, table-driven
#
# Each case builds a source (a copy of a real demo, or a config file) with one damaged file, runs
# the command that reads it, and expects exit 2 with one ``error:`` line naming that file (and the
# column or key where one is at fault), no traceback, and no output written.

EICU_TABLES = ("patient", "hospital", "apacheApsVar", "vitalAperiodic", "diagnosis", "pastHistory", "apachePredVar")


def _csv_gz_edit(path: Path, edit) -> None:
    import gzip

    text = gzip.decompress(path.read_bytes()).decode("utf-8")
    path.unlink()
    path.write_bytes(gzip.compress(edit(text).encode("utf-8"), compresslevel=1))


def _drop_col(col: str):
    def edit(text: str) -> str:
        rows = [ln.split(",") for ln in text.split("\n")]
        k = [c.strip('"') for c in rows[0]].index(col)
        return "\n".join(",".join(r[:k] + r[k + 1:]) if len(r) > k else ",".join(r) for r in rows)
    return edit


def _set_col(col: str, value: str, row: int = 1):
    def edit(text: str) -> str:
        rows = text.split("\n")
        k = [c.strip('"') for c in rows[0].split(",")].index(col)
        cells = rows[row].split(",")
        cells[k] = value
        rows[row] = ",".join(cells)
        return "\n".join(rows)
    return edit


def _cut(frac: float):
    return lambda raw: raw[: max(1, int(len(raw) * frac))]


def _eicu(tmp: Path, table: str, damage) -> tuple[list[str], Path]:
    """The eICU demo's tables (links) with ``table`` replaced by a damaged copy."""
    src = tmp / "eicu"
    src.mkdir()
    for t in EICU_TABLES:
        (src / f"{t}.csv.gz").symlink_to(EICU_DEMO / f"{t}.csv.gz")
    bad = src / f"{table}.csv.gz"
    raw = bad.read_bytes()
    bad.unlink()
    if isinstance(damage, bytes):
        bad.write_bytes(damage)
    elif getattr(damage, "on_text", False):
        bad.write_bytes(raw)
        _csv_gz_edit(bad, damage)
    else:
        bad.write_bytes(damage(raw))
    return ["etl", "--source", "eicu", "--data-dir", str(src), "--threads", "1"], bad


def _text(f):
    f.on_text = True
    return f


def _meds(tmp: Path, rel: str, damage) -> tuple[list[str], Path]:
    """The MEDS demo (links) with the file ``rel`` replaced: bytes, or a Polars edit of its rows."""
    import polars as pl

    src = tmp / "meds"
    for p in MEDS_DEMO.rglob("*"):
        if p.is_file():
            (src / p.relative_to(MEDS_DEMO)).parent.mkdir(parents=True, exist_ok=True)
            (src / p.relative_to(MEDS_DEMO)).symlink_to(p)
    bad = src / rel
    bad.unlink()
    if isinstance(damage, bytes):
        bad.write_bytes(damage)
    elif callable(getattr(damage, "frame", None)):
        damage.frame(pl.read_parquet(MEDS_DEMO / rel)).write_parquet(bad)
    else:
        bad.write_bytes(damage((MEDS_DEMO / rel).read_bytes()))
    return ["etl", "--source", "meds", "--data-dir", str(src), "--meds-splits", "tuning,held_out", "--threads", "1",
            "--min-center-stays", "1"], bad


def _eicu_table_replaced(tmp: Path, table: str, how: str) -> tuple[list[str], Path]:
    """The eICU demo with ``table`` a link to nothing (``how="dangling"``) or a folder."""
    argv, bad = _eicu(tmp, table, b"")
    bad.unlink()
    if how == "dangling":
        bad.symlink_to(tmp / "nowhere.csv.gz")
    else:
        bad.mkdir()
    return argv, bad


def _meds_split_named(tmp: Path, name: str) -> tuple[list[str], Path]:
    """The MEDS demo whose split 'tuning' is called ``name`` in subject_splits.parquet, read by it."""
    argv, bad = _meds(tmp, "metadata/subject_splits.parquet", _Frame(
        lambda d: d.with_columns(d["split"].replace("tuning", name))))
    return [name + ",held_out" if a == "tuning,held_out" else a for a in argv], bad


class _Frame:
    def __init__(self, f):
        self.frame = f


def _cohort(tmp: Path) -> Path:
    from federation.data.synthetic import write_fedprox_cohort

    return write_fedprox_cohort(tmp / "cohort", n_centers=4, seed=1, mean_size=60.0)


def _train(tmp: Path, *extra: str, cohort: Path | None = None) -> list[str]:
    return ["train", "--method", "fedavg", "--cohort", str(cohort or _cohort(tmp)), "--seeds", "1", "--rounds", "1",
            "--tracking-uri", f"sqlite:///{tmp / 'm.db'}", "--no-progress", "--output", str(tmp / "out"), *extra]


def _config(tmp: Path, text: bytes | str, name: str = "run.yaml") -> Path:
    p = tmp / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def _train_config(text):
    def build(tmp: Path):
        p = _config(tmp, text)
        return _train(tmp, "--config", str(p)), p
    return build


def _sweep_config(text, method_config: str | None = None):
    def build(tmp: Path):
        p = _config(tmp, text, "sweep.yaml")
        named = p
        if method_config is not None:
            named = _config(tmp, method_config, "method.yaml")
        return ["sweep", "--config", str(p), "--cohort", str(_cohort(tmp)), "--tracking-uri",
                f"sqlite:///{tmp / 'm.db'}"], named
    return build


def _sage_config(line: str):
    def build(tmp: Path):
        text = (REPO / "configs" / "sage-fmnist-er-0.1.yaml").read_text().replace("n_clients: 50", line)
        p = _config(tmp, text, "sage.yaml")
        return ["train", "--config", str(p), "--rounds", "1", "--tracking-uri", f"sqlite:///{tmp / 'm.db'}",
                "--output", str(tmp / "out")], p
    return build


def _trace(text: bytes | str):
    """An availability trace; ``{c}`` stands for the cohort's first center_id."""
    def build(tmp: Path):
        import polars as pl

        cohort = _cohort(tmp)
        c = pl.read_parquet(cohort / "centers.parquet")["center_id"][0]
        trace = _config(tmp, text.replace("{c}", c) if isinstance(text, str) else text, "trace.csv")
        cfg = _config(tmp, f"realworld:\n  round_period_s: 3600\n  availability:\n    kind: trace\n"
                           f"    trace: {trace}\n")
        return _train(tmp, "--config", str(cfg), cohort=cohort), trace
    return build


def _cohort_file(name: str, damage, manifest: bool = False):
    """A cohort folder with ``name`` damaged; without its manifest the Parquet reader meets the
    damage, with it the comparison against the SHA-256 the manifest records does."""
    def build(tmp: Path):
        c = _cohort(tmp)
        if not manifest:
            (c / "fedprox_manifest.json").unlink()
        p = c / name
        raw = p.read_bytes()
        p.unlink()
        p.write_bytes(damage(raw))
        return ["train", "--method", "fedavg", "--cohort", str(c), "--seeds", "1", "--rounds", "1", "--tracking-uri",
                f"sqlite:///{tmp / 'm.db'}", "--no-progress", "--output", str(tmp / "out")], p
    return build


SWEEP = "name: s\nseeds: [1]\nrounds: 1\nmethods: [fedavg]\n"
_HR = "heartrate"
# (id, build(tmp) -> (argv, the file the error must name), words the error line must also hold)
READERS = [
    ("eicu-truncated-gzip", lambda t: _eicu(t, "patient", _cut(0.5)), ("unreadable gzip",)),
    ("eicu-garbage", lambda t: _eicu(t, "hospital", b"\x1f\x8b\x08\x00garbage" * 50), ()),
    ("eicu-empty-file", lambda t: _eicu(t, "apacheApsVar", b""), ()),
    ("eicu-header-only", lambda t: _eicu(t, "apacheApsVar", _text(lambda s: s.split("\n", 1)[0] + "\n")),
     ("no data rows",)),
    ("eicu-missing-column", lambda t: _eicu(t, "hospital", _text(_drop_col("region"))), ("'region'",)),
    ("eicu-wrong-type", lambda t: _eicu(t, "apacheApsVar", _text(_set_col(_HR, "abc"))), (f"'{_HR}'",)),
    ("eicu-fraction-in-key", lambda t: _eicu(t, "patient", _text(_set_col("hospitalid", "73.5"))),
     ("'hospitalid'", "whole numbers")),
    ("eicu-age-nan", lambda t: _eicu(t, "patient", _text(_set_col("age", "nan"))), ("'age'",)),
    ("eicu-age-text", lambda t: _eicu(t, "patient", _text(_set_col("age", "old"))), ("'age'",)),
    ("eicu-negative-year", lambda t: _eicu(t, "patient", _text(_set_col("hospitaldischargeyear", "-2014"))),
     ("'hospitaldischargeyear'",)),
    ("eicu-empty-patient-id", lambda t: _eicu(t, "patient", _text(_set_col("uniquepid", ""))),
     ("'uniquepid'", "empty in 1 row")),
    ("eicu-status-lower-case", lambda t: _eicu(t, "patient", _text(_set_col("hospitaldischargestatus", "alive"))),
     ("'hospitaldischargestatus'", "Alive, Expired or empty", "1 row holds other")),
    ("eicu-gender-upper-case", lambda t: _eicu(t, "patient", _text(_set_col("gender", "MALE"))), ("'gender'",)),
    ("eicu-dangling-link", lambda t: _eicu_table_replaced(t, "patient", "dangling"), ("a link to nothing",)),
    ("eicu-folder-for-a-table", lambda t: _eicu_table_replaced(t, "hospital", "folder"), ("not a file",)),
    ("eicu-flag-not-0-1", lambda t: _eicu(t, "apachePredVar", _text(_set_col("aids", "-1"))), ("'aids'",)),
    ("meds-truncated-shard", lambda t: _meds(t, "data/tuning/0.parquet", _cut(0.6)), ("Parquet",)),
    ("meds-garbage-shard", lambda t: _meds(t, "data/held_out/0.parquet", b"PAR1" + b"\0" * 100), ("Parquet",)),
    ("meds-empty-shard", lambda t: _meds(t, "data/tuning/0.parquet", b""), ()),
    ("meds-missing-column", lambda t: _meds(t, "data/tuning/0.parquet", _Frame(lambda d: d.drop("hadm_id"))),
     ("'hadm_id'",)),
    ("meds-wrong-type", lambda t: _meds(t, "data/tuning/0.parquet", _Frame(
        lambda d: d.with_columns(d["time"].dt.strftime("%d/%m/%Y").alias("time")))), ("'time'",)),
    ("meds-negative-id", lambda t: _meds(t, "data/held_out/0.parquet", _Frame(
        lambda d: d.with_columns(-d["hadm_id"]))), ("'hadm_id'", "positive")),
    ("meds-time-as-date", lambda t: _meds(t, "data/tuning/0.parquet", _Frame(
        lambda d: d.with_columns(d["time"].dt.date()))), ("'time'", "DATE", "time of day")),
    ("meds-empty-split", lambda t: _meds(t, "data/tuning/0.parquet", _Frame(lambda d: d.head(0))),
     ("no events in split 'tuning'",)),
    ("meds-split-is-a-path", lambda t: _meds_split_named(t, "../../tuning"), ("'split'", "'../../tuning'")),
    ("meds-truncated-codes", lambda t: _meds(t, "metadata/codes.parquet", _cut(0.5)), ()),
    ("meds-truncated-splits", lambda t: _meds(t, "metadata/subject_splits.parquet", _cut(0.5)), ()),
    ("meds-garbage-dataset-json", lambda t: _meds(t, "metadata/dataset.json", b"{\"meds_version\": "), ("JSON",)),
    ("meds-version-before-0.3", lambda t: _meds(t, "metadata/dataset.json", b'{"meds_version": "0.2.1"}'),
     ("meds_version 0.2.1", "patient_id")),
    ("meds-version-not-text", lambda t: _meds(t, "metadata/dataset.json", b'{"meds_version": 9.9}'),
     ("meds_version 9.9 is not a version number",)),
    ("train-config-not-yaml", _train_config("rounds: [1, 2\n"), ("YAML",)),
    ("train-config-empty", _train_config(""), ("empty",)),
    ("train-config-not-utf8", _train_config(b"\xff\xfe\x00rounds"), ("UTF-8",)),
    ("train-config-wrong-type", _train_config("lr: abc\nmethod: fedavg\nparams: {}\nrounds: abc\n"), ("'rounds'",)),
    ("train-config-unknown-key", _train_config("roundz: 3\n"), ("'roundz'",)),
    ("train-config-duplicate-key", _train_config("engine:\n  lr: 0.01\n  lr: 0.1\n"), ("'lr'", "twice")),
    ("train-config-negative-width", _train_config("engine: {hidden: [-128, 64]}\n"), ("'engine.hidden.0'",)),
    ("train-config-nan", _train_config("engine: {lr: .nan}\n"), ("'engine.lr'",)),
    ("train-config-negative", _train_config("engine: {local_epochs: -2}\n"), ("'engine.local_epochs'",)),
    ("sweep-config-not-yaml", _sweep_config("name: s\nmethods: [fedavg\n"), ("YAML",)),
    ("sweep-config-empty", _sweep_config(""), ("empty",)),
    ("sweep-config-wrong-type", _sweep_config(SWEEP.replace("rounds: 1", "rounds: abc")), ("rounds",)),
    ("sweep-seeds-wrong-type", _sweep_config(SWEEP.replace("[1]", "[a]")), ("seeds",)),
    ("sweep-method-config-wrong-type", _sweep_config(
        "name: s\nseeds: [1]\nrounds: 1\nmethods:\n  - method: fedavg\n    config: method.yaml\n", "rounds: abc\n"),
     ("'rounds'",)),
    ("sweep-method-config-not-yaml", _sweep_config(
        "name: s\nseeds: [1]\nrounds: 1\nmethods:\n  - method: fedavg\n    config: method.yaml\n", "a: [\n"),
     ("YAML",)),
    ("benchmark-config-wrong-type", _sage_config("n_clients: abc"), ("'n_clients'",)),
    ("benchmark-config-unknown-key", _sage_config("n_clientz: 5"), ("'n_clientz'",)),
    ("trace-empty", _trace(""), ()),
    ("trace-missing-column", _trace("center,start\nx,1\n"), ("'end'",)),
    ("trace-garbage", _trace(b"\x1f\x8b\x08garbage\xff\xfe\x00"), ()),
    ("trace-wrong-type", _trace("center,start,end\n{c},abc,2\n"), ("'start'",)),
    ("trace-negative", _trace("center,start,end\n{c},-1,2\n"), ("'start'",)),
    ("trace-nan", _trace("center,start,end\n{c},0,nan\n"), ("'end'",)),
    ("cohort-truncated-parquet", _cohort_file("cohort.parquet", _cut(0.5)), ("Parquet",)),
    ("centers-garbage-parquet", _cohort_file("centers.parquet", lambda raw: b"\0" * len(raw)), ("Parquet",)),
    ("cohort-truncated-beside-manifest", _cohort_file("cohort.parquet", _cut(0.5), manifest=True),
     ("fedprox_manifest.json", "SHA-256")),
]


@pytest.mark.parametrize("build,words", [(b, w) for _, b, w in READERS], ids=[c[0] for c in READERS])
def test_every_reader_names_its_file(build, words, tmp_path, capsys):
    argv, named = build(tmp_path)
    if argv[0] == "etl":
        argv += ["--out", str(tmp_path / "out")]
    code, err = _run(capsys, argv)
    assert "Traceback" not in err, err[-1500:]
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("warning:", "found ", "cohort: "))
             and " INFO " not in ln]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err[-1500:])
    assert str(named) in lines[0], lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.tmp-*"))


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    return code, capsys.readouterr().err


def test_an_unnamed_gzip_error_probes_the_smallest_table_first(tmp_path, monkeypatch):
    """DuckDB's error names no file: the gzip streams are probed smallest first, so a damaged small
    table is named without inflating chartevents (the largest)."""
    import gzip

    import etl.sources as sources
    from etl.mimic import REQUIRED, TYPES

    for rel in TABLES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(MIMIC_DEMO / f"{rel}.csv.gz", tmp_path / f"{rel}.csv.gz")
    bad = tmp_path / "icu/icustays.csv.gz"
    raw = gzip.compress(gzip.decompress(bad.read_bytes()))
    bad.write_bytes(raw[: len(raw) // 2])
    tables = [sources.locate(tmp_path, *rel.split("/"), REQUIRED[tuple(rel.split("/"))], TYPES)
              for rel in reversed(TABLES)]  # chartevents first
    probed = []
    real = sources._gzip_ok
    monkeypatch.setattr(sources, "_gzip_ok", lambda path: probed.append(path.name) or real(path))
    err = sources.wrap_duckdb_error(duckdb.IOException("Input is not readable"), tables)
    assert str(err).startswith(f"{bad}: unreadable gzip (")
    assert "chartevents.csv.gz" not in probed and probed[-1] == "icustays.csv.gz"
    assert probed == sorted(probed, key=lambda n: next(t.path for t in tables if t.path.name == n).stat().st_size)

"""The option matrix (tests/option_matrix.py) for the data writers: `abps etl` on every source and
the `abps synth` commands."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import polars as pl
import pytest

from tests.option_matrix import Kind, Probe, check_base_repeats, check_cell, commands, options


@pytest.fixture(scope="module")
def inputs(mimic_demo_dir: Path, eicu_demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The real demos, and a copy of each with one patient fewer (another source folder)."""
    root = tmp_path_factory.mktemp("matrix-inputs")
    meds = mimic_demo_dir.parent / "mimic-iv-demo-extra" / "meds-official"
    mimic2 = root / "mimic2"
    for rel in ("hosp/patients", "hosp/admissions", "hosp/diagnoses_icd", "icu/icustays", "icu/chartevents"):
        (mimic2 / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(mimic_demo_dir / f"{rel}.csv.gz", mimic2 / f"{rel}.csv.gz")
    _drop_first_row(mimic2 / "hosp" / "patients.csv.gz")
    eicu2 = root / "eicu2"
    shutil.copytree(eicu_demo_dir, eicu2)
    (eicu2 / "patient.csv.gz").chmod(0o644)
    _drop_first_row(eicu2 / "patient.csv.gz")
    meds2 = root / "meds2"
    shutil.copytree(meds, meds2)
    shard = meds2 / "data" / "tuning" / "0.parquet"
    shard.chmod(0o644)
    df = pl.read_parquet(shard)
    df.filter(pl.col("subject_id") != df["subject_id"].min()).write_parquet(shard)
    return {"mimic": mimic_demo_dir, "mimic2": mimic2, "eicu": eicu_demo_dir, "eicu2": eicu2, "meds": meds,
            "meds2": meds2}


def _drop_first_row(path: Path) -> None:
    path.chmod(0o644)
    lines = gzip.decompress(path.read_bytes()).decode().splitlines(keepends=True)
    path.write_bytes(gzip.compress("".join([lines[0], *lines[2:]]).encode()))


_FAST = ["--min-center-stays", "1", "--threads", "1"]


def _other_cohort(scratch: Path) -> None:
    """--out o already holds a cohort of another task (without --force the base run is refused)."""
    (scratch / "o").mkdir()
    (scratch / "o" / "cohort.parquet").write_bytes(b"earlier")
    (scratch / "o" / "cohort_report.json").write_text('{"source": "mimic", "options": {"task": "los-3"}}\n')


def _etl_probes(src: str) -> dict:
    other = {"mimic": "eicu", "eicu": "meds", "meds": "mimic"}[src]
    return {
        "out": lambda i: Probe(["--out", "o2"]),
        "mimic_dir": lambda i: Probe(["--mimic-dir", str(i[f"{src}2"])]),
        "data_dir": lambda i: Probe(["--data-dir", str(i[f"{src}2"])]),
        "source": lambda i: Probe(["--source", other]),
        "meds_splits": lambda i: Probe(["--meds-splits", "tuning"]),
        "partition": lambda i: Probe(["--partition", "iid"]),
        "care_units": lambda i: Probe(["--care-units", "MICU"]),
        "comorbidity_source": lambda i: Probe(["--comorbidity-source", "earlier-admissions"]),
        "split": lambda i: Probe(["--split", "0.5,0.25,0.25"]),
        "min_age": lambda i: Probe(["--min-age", "60"]),
        "max_age": lambda i: Probe(["--max-age", "60"]),
        "min_center_stays": lambda i: Probe(["--min-center-stays", "15"]),
        "vitals_from_hours": lambda i: Probe(["--vitals-from-hours", "-6"]),
        "memory_limit": lambda i: Probe(["--memory-limit", "1GB"]),
        "task": lambda i: Probe(["--task", "los-3"]),
        "chart_cache": lambda i: Probe(["--chart-cache", "cachedir"]),
        "window_origin": lambda i: Probe(["--window-origin", "2101"]),
        "force": lambda i: Probe(["--force"], setup=_other_cohort),
    }


KINDS = [
    Kind(("etl",), "etl-mimic", lambda i: ["--mimic-dir", str(i["mimic"]), "--out", "o", *_FAST, "--chart-cache", "off"],
         _etl_probes("mimic")),
    Kind(("etl",), "etl-eicu", lambda i: ["--source", "eicu", "--data-dir", str(i["eicu"]), "--out", "o", *_FAST],
         _etl_probes("eicu")),
    Kind(("etl",), "etl-meds", lambda i: ["--source", "meds", "--data-dir", str(i["meds"]), "--out", "o",
                                          "--meds-splits", "tuning,held_out", *_FAST],
         {**_etl_probes("meds"), "mimic_dir": lambda i: Probe(["--mimic-dir", str(i["meds2"])])}),
    Kind(("synth", "mimic"), "synth-mimic", lambda i: ["--out", "s", "--stays", "40"],
         {"out": lambda i: Probe(["--out", "s2"])}),
    Kind(("synth", "fedprox"), "synth-fedprox", lambda i: ["--out", "f", "--centers", "4", "--mean-size", "40"],
         {"out": lambda i: Probe(["--out", "f2"])}),
]

CELLS = [pytest.param(k, p.name, id=f"{k.name}-{p.name}") for k in KINDS for p in options(k.command)]


def test_every_data_command_and_source_has_a_kind():
    from cli.etl_cmd import SOURCES

    covered = {k.command for k in KINDS}
    assert {c for c in commands() if c[0] in ("etl", "synth")} <= covered
    assert {k.name for k in KINDS if k.command == ("etl",)} == {f"etl-{s}" for s in SOURCES}


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_base_runs_repeat(kind, inputs, tmp_path, capsys, monkeypatch):
    check_base_repeats(kind, inputs, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("kind,opt", CELLS)
def test_option_is_applied_or_refused(kind, opt, inputs, tmp_path_factory, capsys, monkeypatch):
    check_cell(kind, opt, inputs, tmp_path_factory.mktemp(kind.name, numbered=False)
               if not (tmp_path_factory.getbasetemp() / kind.name).exists()
               else tmp_path_factory.getbasetemp() / kind.name, capsys, monkeypatch)

"""The fuzz pass over the inputs (benchmarks/bench_fuzz.py), seeded and derandomized for CI:
every mutation of a real MIMIC-IV demo table gives the clean cohort or one error line naming the
mutated file, never a traceback or a partial output; every mutation of an eICU demo table, a MEDS
demo file or a run config gives a whole output (a cohort folder matching its report's SHA-256, a
results file) or one error line naming the mutated file. The long pass: ``python -m benchmarks.run fuzz``."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.bench_fuzz import (
    CONFIG_KINDS,
    EICU_KINDS,
    EICU_TABLES,
    KINDS,
    MEDS_FILES,
    MEDS_KINDS,
    TABLES,
    Mutation,
    check,
    check_config,
    check_eicu,
    check_meds,
    clean_cohort,
)


@pytest.fixture(scope="module")
def clean(mimic_demo_dir, tmp_path_factory) -> Path:
    return clean_cohort(tmp_path_factory.mktemp("fuzz-clean"))


# one of each kind, on the tables where the kind matters most
CASES = [Mutation("icu/chartevents", "pad_zeros", 0.3), Mutation("hosp/admissions", "truncate", 0.5),
         Mutation("hosp/patients", "flip_byte", 0.5), Mutation("icu/icustays", "drop_column", 0.0),
         Mutation("hosp/admissions", "rename_column", 0.0), Mutation("hosp/patients", "retype_column", 0.4),
         Mutation("icu/icustays", "duplicate_header", 0.0), Mutation("hosp/diagnoses_icd", "latin1_value", 0.9),
         Mutation("hosp/patients", "huge_value", 0.4), Mutation("hosp/patients", "negative_value", 0.4),
         Mutation("hosp/diagnoses_icd", "empty_file", 0.0)]


def test_the_cases_cover_every_kind():
    assert {m.kind for m in CASES} == set(KINDS)


@pytest.mark.parametrize("m", CASES, ids=[f"{m.kind}-{Path(m.table).name}" for m in CASES])
def test_each_kind_of_mutation(m, clean, tmp_path):
    outcome = check(m, clean, tmp_path)
    if m.kind == "pad_zeros":
        assert outcome == "clean"  # gzip and zcat read it: so does the ETL


@settings(max_examples=8, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(TABLES), st.sampled_from(KINDS), st.floats(0.0, 0.999))
def test_seeded_fuzz(clean, tmp_path, table, kind, at):
    work = tmp_path / f"{Path(table).name}-{kind}-{at:.4f}"
    work.mkdir()
    try:
        check(Mutation(table, kind, at), clean, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------ eICU, MEDS and config files

EICU_CASES = [("patient", "truncate", 0.5), ("hospital", "flip_byte", 0.5), ("apacheApsVar", "empty_file", 0.0),
              ("diagnosis", "drop_column", 0.3), ("patient", "retype_column", 0.05), ("apacheApsVar", "nan_value", 0.3),
              ("vitalAperiodic", "inf_value", 0.6), ("patient", "negative_value", 0.4),
              ("pastHistory", "pad_zeros", 0.2)]
MEDS_CASES = [("data/tuning/0.parquet", "truncate", 0.7), ("metadata/codes.parquet", "flip_byte", 0.5),
              ("data/held_out/0.parquet", "empty_file", 0.0), ("metadata/subject_splits.parquet", "garbage", 0.1),
              ("data/tuning/0.parquet", "drop_column", 0.33), ("data/tuning/0.parquet", "retype_column", 0.05),
              ("data/held_out/0.parquet", "nan_value", 0.13), ("data/tuning/0.parquet", "negative_value", 0.0),
              ("metadata/dataset.json", "truncate", 0.5)]
CONFIG_CASES = [(k, at) for k, at in zip(CONFIG_KINDS, (0.5, 0.4, 0.0, 0.2, 0.3, 0.35, 0.45, 0.25, 0.6))]
FUZZ = dict(max_examples=4, deadline=None, database=None, derandomize=True,
            suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_the_source_cases_cover_every_kind():
    assert {k for _, k, _ in EICU_CASES} == set(EICU_KINDS)
    assert {k for _, k, _ in MEDS_CASES} == set(MEDS_KINDS) | {"truncate"}
    assert {k for k, _ in CONFIG_CASES} == set(CONFIG_KINDS)


@pytest.fixture(scope="module")
def small_cohort(tmp_path_factory) -> Path:
    from federation.data.synthetic import write_fedprox_cohort

    return write_fedprox_cohort(tmp_path_factory.mktemp("fuzz-cohort") / "c", n_centers=3, seed=2, mean_size=50.0)


@pytest.mark.parametrize("table,kind,at", EICU_CASES, ids=[f"{k}-{t}" for t, k, _ in EICU_CASES])
def test_each_kind_of_eicu_mutation(table, kind, at, eicu_demo_dir, tmp_path):
    outcome = check_eicu(table, kind, at, tmp_path)
    if kind in ("truncate", "empty_file", "drop_column", "flip_byte"):
        assert outcome == "refused"
    if kind == "pad_zeros":
        assert outcome == "whole"  # gzip and zcat read it: so does the ETL


@pytest.mark.parametrize("rel,kind,at", MEDS_CASES, ids=[f"{k}-{Path(r).name}" for r, k, _ in MEDS_CASES])
def test_each_kind_of_meds_mutation(rel, kind, at, mimic_demo_dir, tmp_path):
    outcome = check_meds(rel, kind, at, tmp_path)
    if kind in ("truncate", "empty_file", "garbage"):  # a flipped byte inside a Parquet page may read
        assert outcome == "refused"


@pytest.mark.parametrize("kind,at", CONFIG_CASES, ids=[k for k, _ in CONFIG_CASES])
def test_each_kind_of_config_mutation(kind, at, small_cohort, tmp_path):
    outcome = check_config(kind, at, small_cohort, tmp_path)
    if kind in ("retype_value", "nan_value", "inf_value", "duplicate_key", "latin1"):
        assert outcome == "refused"


@settings(**FUZZ)
@given(st.sampled_from(EICU_TABLES), st.sampled_from(EICU_KINDS), st.floats(0.0, 0.999))
def test_seeded_fuzz_eicu(eicu_demo_dir, tmp_path, table, kind, at):
    _fresh(tmp_path, lambda work: check_eicu(table, kind, at, work))


@settings(**FUZZ)
@given(st.sampled_from(MEDS_FILES), st.sampled_from(MEDS_KINDS), st.floats(0.0, 0.999))
def test_seeded_fuzz_meds(mimic_demo_dir, tmp_path, rel, kind, at):
    _fresh(tmp_path, lambda work: check_meds(rel, kind, at, work))


@settings(**FUZZ)
@given(st.sampled_from(CONFIG_KINDS), st.floats(0.0, 0.999))
def test_seeded_fuzz_config(small_cohort, tmp_path, kind, at):
    _fresh(tmp_path, lambda work: check_config(kind, at, small_cohort, work))


def _fresh(tmp_path: Path, check) -> None:
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    try:
        check(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)

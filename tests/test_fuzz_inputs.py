"""The fuzz pass over the ETL's inputs (benchmarks/bench_fuzz.py), seeded and derandomized for CI:
every mutation of a real MIMIC-IV demo table gives the clean cohort or one error line naming the
mutated file, never a traceback or a partial output. The long pass: ``python -m benchmarks.run fuzz``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.bench_fuzz import KINDS, TABLES, Mutation, check, clean_cohort


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

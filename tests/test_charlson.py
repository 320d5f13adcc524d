"""Tests for etl.charlson: Quan (2005) code lists, the pure-Python flags and the DuckDB query."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import duckdb
import pytest

from etl.charlson import (
    CCI_COLUMNS,
    CCI_LABELS,
    CCI_PREFIXES,
    QUAN_2005_CODES,
    charlson_flags_sql,
    expand_code_range,
    flags_for_codes,
    normalize_icd_code,
)
from etl.errors import InputError

REPO = Path(__file__).resolve().parents[1]
from conftest import MIMIC_DEMO  # noqa: E402  (../shared beside the clone, as in CI)

DEMO_HOSP = MIMIC_DEMO / "hosp"
DIAGNOSES = DEMO_HOSP / "diagnoses_icd.csv.gz"
DICTIONARY = DEMO_HOSP / "d_icd_diagnoses.csv.gz"
def needs_demo(fn):
    """Tests on the real demo: the files must be there (CI has ../shared beside the clone)."""
    def wrapper(*args, **kwargs):
        assert DIAGNOSES.exists() and DICTIONARY.exists(), f"MIMIC-IV demo not found under {DEMO_HOSP}"
        return fn(*args, **kwargs)

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


def _only(*columns: str) -> dict[str, int]:
    return {c: int(c in columns) for c in CCI_COLUMNS}


def test_columns_are_the_12_quan_2011_conditions_in_contract_order():
    assert CCI_COLUMNS == (
        "cci_chf", "cci_dementia", "cci_chronic_pulmonary", "cci_rheumatic", "cci_mild_liver",
        "cci_diabetes_complicated", "cci_paraplegia", "cci_renal", "cci_malignancy",
        "cci_severe_liver", "cci_metastatic", "cci_aids",
    )
    assert tuple(QUAN_2005_CODES) == CCI_COLUMNS
    assert tuple(CCI_PREFIXES) == CCI_COLUMNS
    assert tuple(CCI_LABELS) == CCI_COLUMNS
    assert all(set(CCI_PREFIXES[c]) == {9, 10} for c in CCI_COLUMNS)
    # The output contract (docs/data_dictionary.md) lists the same columns in the same order.
    text = (REPO / "docs" / "data_dictionary.md").read_text()
    paragraph = text[text.index("Charlson columns, in this order"):]
    paragraph = paragraph[: paragraph.index("\n\n")]
    assert tuple(re.findall(r"`(cci_[a-z_]+)`", paragraph)) == CCI_COLUMNS


def test_expand_code_range_by_hand():
    assert expand_code_range("428") == ("428",)
    assert expand_code_range("4254-4259") == ("4254", "4255", "4256", "4257", "4258", "4259")
    assert expand_code_range("042-044") == ("042", "043", "044")
    assert expand_code_range("C00-C26") == tuple(f"C{n:02d}" for n in range(27))
    assert expand_code_range("Z490-Z492") == ("Z490", "Z491", "Z492")
    for bad in ("C26-C00", "C00-D26", "428-4289", "42-8", "4.28", "", "1-2-3"):
        with pytest.raises(ValueError):
            expand_code_range(bad)


def test_prefix_counts_by_hand():
    # Quan 2005 Table 1 counted by hand, each range expanded.
    assert len(CCI_PREFIXES["cci_chf"][9]) == 10 + 6 + 1
    assert len(CCI_PREFIXES["cci_chf"][10]) == 7 + 5 + 2
    assert len(CCI_PREFIXES["cci_malignancy"][9]) == 33 + 21 + 9 + 9 + 1
    assert len(CCI_PREFIXES["cci_malignancy"][10]) == 27 + 5 + 5 + 1 + 14 + 17 + 5 + 1 + 8
    assert len(CCI_PREFIXES["cci_diabetes_complicated"][10]) == 5 * 5
    assert CCI_PREFIXES["cci_aids"] == {9: ("042", "043", "044"), 10: ("B20", "B21", "B22", "B24")}


ICD9_CASES = [
    ("4280", ["cci_chf"]),
    ("39891", ["cci_chf"]),
    ("4254", ["cci_chf"]),
    ("4253", []),  # 425.3 endocardial fibroelastosis: outside 425.4-425.9
    ("40403", ["cci_chf", "cci_renal"]),  # listed under both conditions
    ("40401", ["cci_chf"]),
    ("40402", ["cci_renal"]),
    ("29410", ["cci_dementia"]),
    ("3312", ["cci_dementia"]),
    ("4910", ["cci_chronic_pulmonary"]),
    ("5064", ["cci_chronic_pulmonary"]),
    ("5063", []),
    ("7140", ["cci_rheumatic"]),
    ("71481", ["cci_rheumatic"]),
    ("7143", []),  # juvenile chronic polyarthritis: not listed
    ("5712", ["cci_mild_liver"]),
    ("07054", ["cci_mild_liver"]),
    ("07070", []),
    ("V427", ["cci_mild_liver"]),
    ("25040", ["cci_diabetes_complicated"]),
    ("25073", ["cci_diabetes_complicated"]),
    ("25080", []),  # 250.8 counts as diabetes without chronic complication in Quan 2005
    ("25000", []),
    ("3441", ["cci_paraplegia"]),
    ("3449", ["cci_paraplegia"]),
    ("34489", []),  # 344.8 other paralytic syndromes: not listed
    ("5853", ["cci_renal"]),
    ("5880", ["cci_renal"]),
    ("5881", []),
    ("V4511", ["cci_renal"]),
    ("20000", ["cci_malignancy"]),
    ("20300", ["cci_malignancy"]),
    ("1550", ["cci_malignancy"]),
    ("1729", ["cci_malignancy"]),  # melanoma counts
    ("1958", ["cci_malignancy"]),
    ("2386", ["cci_malignancy"]),
    ("1733", []),  # 173.x other malignant neoplasm of skin: excluded
    ("5722", ["cci_severe_liver"]),
    ("4560", ["cci_severe_liver"]),
    ("5721", []),
    ("1960", ["cci_metastatic"]),  # metastatic only: 196-199 are not in the malignancy list
    ("1991", ["cci_metastatic"]),
    ("042", ["cci_aids"]),
    ("V08", []),  # asymptomatic HIV infection status: not in Quan's AIDS/HIV list
    ("4019", []),
    ("41401", []),
]

ICD10_CASES = [
    ("I509", ["cci_chf"]),
    ("I5023", ["cci_chf"]),
    ("I110", ["cci_chf"]),
    ("I132", ["cci_chf"]),
    ("I1310", ["cci_renal"]),
    ("P290", ["cci_chf"]),
    ("F0390", ["cci_dementia"]),
    ("G309", ["cci_dementia"]),
    ("J449", ["cci_chronic_pulmonary"]),
    ("J684", ["cci_chronic_pulmonary"]),
    ("J690", []),
    ("M0579", ["cci_rheumatic"]),
    ("M351", ["cci_rheumatic"]),
    ("M352", []),
    ("K7030", ["cci_mild_liver"]),
    ("K760", ["cci_mild_liver"]),
    ("K761", []),
    ("Z944", ["cci_mild_liver"]),
    ("E1122", ["cci_diabetes_complicated"]),
    ("E1052", ["cci_diabetes_complicated"]),
    ("E119", []),
    ("E1165", []),  # E11.6: diabetes without chronic complication in Quan 2005
    ("G8194", ["cci_paraplegia"]),
    ("G8220", ["cci_paraplegia"]),
    ("G835", []),
    ("N185", ["cci_renal"]),
    ("Z992", ["cci_renal"]),
    ("N179", []),  # acute kidney failure
    ("C3490", ["cci_malignancy"]),
    ("C9100", ["cci_malignancy"]),
    ("C8330", ["cci_malignancy"]),
    ("C439", ["cci_malignancy"]),
    ("C4491", []),  # other malignant neoplasm of skin: excluded
    ("C4A9", []),  # Merkel cell carcinoma (skin, ICD-10-CM only): not in Quan's list
    ("I8500", ["cci_severe_liver"]),
    ("K7040", ["cci_severe_liver"]),
    ("I8510", []),  # secondary oesophageal varices: Quan lists only I85.0 and I85.9
    ("C787", ["cci_metastatic"]),
    ("C7951", ["cci_metastatic"]),
    ("B20", ["cci_aids"]),
    ("Z21", []),
    ("I10", []),
    ("Z87891", []),
]


@pytest.mark.parametrize(("code", "expected"), ICD9_CASES)
def test_icd9_codes(code, expected):
    assert flags_for_codes([(code, 9)]) == _only(*expected)


@pytest.mark.parametrize(("code", "expected"), ICD10_CASES)
def test_icd10_codes(code, expected):
    assert flags_for_codes([(code, 10)]) == _only(*expected)


def test_version_decides_the_list():
    # V42.0 is kidney transplant status in ICD-9-CM but a transport accident in ICD-10.
    assert flags_for_codes([("V420", 9)]) == _only("cci_renal")
    assert flags_for_codes([("V420", 10)]) == _only()
    assert flags_for_codes([("C787", 9)]) == _only()


def test_no_hierarchy_and_union_over_codes():
    liver = flags_for_codes([("K7030", 10), ("I8500", 10)])
    assert liver == _only("cci_mild_liver", "cci_severe_liver")
    cancer = flags_for_codes([("1550", 9), ("1970", 9), ("4019", 9)])
    assert cancer == _only("cci_malignancy", "cci_metastatic")
    mixed = flags_for_codes([("4280", 9), ("B20", 10), ("E1122", 10)])
    assert mixed == _only("cci_chf", "cci_aids", "cci_diabetes_complicated")
    assert list(mixed) == list(CCI_COLUMNS)


def test_normalization_and_odd_rows():
    assert normalize_icd_code(" i50.9\t") == "I509"
    assert flags_for_codes([(" i50.9 ", "10")]) == _only("cci_chf")
    assert flags_for_codes([("428.0", 9)]) == _only("cci_chf")
    assert flags_for_codes([]) == _only()
    assert flags_for_codes([(None, 9), ("4280", None), ("", 9), ("4280", 8)]) == _only()
    with pytest.raises(InputError, match="icd_version"):
        flags_for_codes([("4280", "nine")])


def test_sql_rejects_bad_relation():
    for bad in ("", "   ", "diagnoses; DROP TABLE x"):
        with pytest.raises(InputError, match="relation"):
            charlson_flags_sql(bad)


def test_sql_on_small_relation_with_messy_rows():
    con = duckdb.connect()
    con.execute("CREATE TABLE dx (hadm_id BIGINT, icd_code VARCHAR, icd_version INTEGER)")
    con.executemany(
        "INSERT INTO dx VALUES (?, ?, ?)",
        [
            (3, " i50.9\t", 10), (3, "1970", 9), (3, "1550", 9),
            (1, "K7030", 10), (1, "I8500", 10), (1, "I10", 10),
            (2, None, 9),  # only a null code: a row of zeros
            (None, "4280", 9),  # no admission: dropped
            (4, "4280", 8),  # unknown version: zeros
        ],
    )
    res = con.sql(charlson_flags_sql("(SELECT * FROM dx)"))
    assert res.columns == ["hadm_id", *CCI_COLUMNS]
    assert [str(t) for t in res.types[1:]] == ["TINYINT"] * 12
    rows = {r[0]: dict(zip(CCI_COLUMNS, r[1:])) for r in res.fetchall()}
    assert sorted(rows) == [1, 2, 3, 4]
    assert rows[1] == _only("cci_mild_liver", "cci_severe_liver")
    assert rows[2] == _only()
    assert rows[3] == _only("cci_chf", "cci_malignancy", "cci_metastatic")
    assert rows[4] == _only()


def _python_flags_by_hadm(con, relation):
    by_hadm = defaultdict(list)
    for hadm_id, code, version in con.sql(
        f"SELECT hadm_id, icd_code, icd_version FROM {relation}"
    ).fetchall():
        by_hadm[hadm_id].append((code, version))
    return {h: flags_for_codes(codes) for h, codes in by_hadm.items()}


@needs_demo
def test_sql_equals_python_on_every_demo_admission():
    con = duckdb.connect()
    relation = f"read_csv('{DIAGNOSES}')"
    res = con.sql(charlson_flags_sql(relation))
    sql_flags = {r[0]: dict(zip(CCI_COLUMNS, r[1:])) for r in res.fetchall()}
    py_flags = _python_flags_by_hadm(con, relation)
    assert len(sql_flags) == 275  # every admission of the MIMIC-IV demo
    assert sql_flags == py_flags
    # Each flag is a 0/1 integer, and the demo is not degenerate: most conditions occur.
    values = {v for flags in sql_flags.values() for v in flags.values()}
    assert values == {0, 1}
    present = {c for flags in sql_flags.values() for c, v in flags.items() if v}
    assert len(present) >= 10


@needs_demo
def test_sql_equals_python_on_every_dictionary_code():
    # Each of the ~110 k ICD-9-CM / ICD-10-CM codes of d_icd_diagnoses as its own admission.
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE dx AS SELECT row_number() OVER () AS hadm_id, icd_code, icd_version "
        f"FROM read_csv('{DICTIONARY}')"
    )
    rows = con.sql(charlson_flags_sql("dx")).fetchall()
    sql_flags = {r[0]: dict(zip(CCI_COLUMNS, r[1:])) for r in rows}
    py_flags = _python_flags_by_hadm(con, "dx")
    assert len(sql_flags) == len(py_flags) > 100_000
    assert sql_flags == py_flags


@needs_demo
def test_every_prefix_names_real_codes_except_known_gaps():
    """Typo guard: a prefix that matches no code of MIMIC-IV's ICD dictionary must be a known
    gap: an ICD-9-CM subdivision that does not exist, or a WHO ICD-10 code absent from
    ICD-10-CM (E12/E14 and E1x.7 diabetes, F00, F05.1, J46, B21/B22/B24, C97, I85.9, I98.2,
    Z49.1/Z49.2)."""
    con = duckdb.connect()
    codes = defaultdict(list)
    query = f"SELECT icd_code, icd_version FROM read_csv('{DICTIONARY}')"
    for code, version in con.sql(query).fetchall():
        codes[version].append(code)
    unmatched = {
        v: {
            p
            for c in CCI_COLUMNS
            for p in CCI_PREFIXES[c][v]
            if not any(x.startswith(p) for x in codes[v])
        }
        for v in (9, 10)
    }
    assert unmatched[9] == {
        "4256", "497", "498", "499", "5833", "5835", "166", "167", "168", "169", "177", "178",
        "1956", "1957", "5725", "5726", "5727", "043", "044",
    }
    assert unmatched[10] == {
        "F00", "F051", "J46", "E107", "E117", "E122", "E123", "E124", "E125", "E127", "E137",
        "E142", "E143", "E144", "E145", "E147", "Z491", "Z492", "C97", "I859", "I982",
        "B21", "B22", "B24",
    }


def test_docs_table_matches_prefix_counts():
    text = (REPO / "docs" / "charlson.md").read_text()
    found = {}
    for line in text.splitlines():
        m = re.match(r"^\|\s*`(cci_[a-z_]+)`\s*\|[^|]*\|\s*(\d+)\s*\|\s*(\d+)\s*\|", line)
        if m:
            found[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    assert found == {c: (len(CCI_PREFIXES[c][9]), len(CCI_PREFIXES[c][10])) for c in CCI_COLUMNS}

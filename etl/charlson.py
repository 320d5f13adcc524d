"""Updated-Charlson comorbidity binaries (Quan et al. 2011; code lists of Quan et al. 2005) from
ICD-9-CM and ICD-10 diagnosis codes: patient features and the metadata's comorbidity prevalences
(ABPS paper Sec. 4.1, 6.1). Matching rules: docs/charlson.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from etl.errors import InputError
from etl.sql import concept_sql

CCI_COLUMNS: tuple[str, ...] = (
    "cci_chf",
    "cci_dementia",
    "cci_chronic_pulmonary",
    "cci_rheumatic",
    "cci_mild_liver",
    "cci_diabetes_complicated",
    "cci_paraplegia",
    "cci_renal",
    "cci_malignancy",
    "cci_severe_liver",
    "cci_metastatic",
    "cci_aids",
)
"""The 12 conditions of the updated Charlson index (Quan et al. 2011), in output column order."""

CCI_LABELS: Mapping[str, str] = MappingProxyType(
    {
        "cci_chf": "Congestive heart failure",
        "cci_dementia": "Dementia",
        "cci_chronic_pulmonary": "Chronic pulmonary disease",
        "cci_rheumatic": "Rheumatic disease",
        "cci_mild_liver": "Mild liver disease",
        "cci_diabetes_complicated": "Diabetes with chronic complication",
        "cci_paraplegia": "Hemiplegia or paraplegia",
        "cci_renal": "Renal disease",
        "cci_malignancy": (
            "Any malignancy, including lymphoma and leukemia, except malignant neoplasm of skin"
        ),
        "cci_severe_liver": "Moderate or severe liver disease",
        "cci_metastatic": "Metastatic solid tumor",
        "cci_aids": "AIDS/HIV",
    }
)
"""Condition names as printed in Quan et al. (2005), Table 1."""

# Quan et al. (2005), Table 1, written without dots. A single entry is a code prefix ("428" is
# Quan's "428.x"); "lo-hi" is an inclusive range of prefixes of equal length that differ only in
# their numeric tail ("4254-4259" is Quan's "425.4-425.9").
QUAN_2005_CODES: Mapping[str, Mapping[int, tuple[str, ...]]] = MappingProxyType(
    {
        "cci_chf": {
            9: ("39891", "40201", "40211", "40291", "40401", "40403", "40411", "40413",
                "40491", "40493", "4254-4259", "428"),
            10: ("I099", "I110", "I130", "I132", "I255", "I420", "I425-I429", "I43", "I50",
                 "P290"),
        },
        "cci_dementia": {
            9: ("290", "2941", "3312"),
            10: ("F00-F03", "F051", "G30", "G311"),
        },
        "cci_chronic_pulmonary": {
            9: ("4168", "4169", "490-505", "5064", "5081", "5088"),
            10: ("I278", "I279", "J40-J47", "J60-J67", "J684", "J701", "J703"),
        },
        "cci_rheumatic": {
            9: ("4465", "7100-7104", "7140-7142", "7148", "725"),
            10: ("M05", "M06", "M315", "M32-M34", "M351", "M353", "M360"),
        },
        "cci_mild_liver": {
            9: ("07022", "07023", "07032", "07033", "07044", "07054", "0706", "0709", "570",
                "571", "5733", "5734", "5738", "5739", "V427"),
            10: ("B18", "K700-K703", "K709", "K713-K715", "K717", "K73", "K74", "K760",
                 "K762-K764", "K768", "K769", "Z944"),
        },
        "cci_diabetes_complicated": {
            9: ("2504-2507",),
            10: ("E102-E105", "E107", "E112-E115", "E117", "E122-E125", "E127", "E132-E135",
                 "E137", "E142-E145", "E147"),
        },
        "cci_paraplegia": {
            9: ("3341", "342", "343", "3440-3446", "3449"),
            10: ("G041", "G114", "G801", "G802", "G81", "G82", "G830-G834", "G839"),
        },
        "cci_renal": {
            9: ("40301", "40311", "40391", "40402", "40403", "40412", "40413", "40492",
                "40493", "582", "5830-5837", "585", "586", "5880", "V420", "V451", "V56"),
            10: ("I120", "I131", "N032-N037", "N052-N057", "N18", "N19", "N250",
                 "Z490-Z492", "Z940", "Z992"),
        },
        "cci_malignancy": {
            9: ("140-172", "174-194", "1950-1958", "200-208", "2386"),
            10: ("C00-C26", "C30-C34", "C37-C41", "C43", "C45-C58", "C60-C76", "C81-C85",
                 "C88", "C90-C97"),
        },
        "cci_severe_liver": {
            9: ("4560-4562", "5722-5728"),
            10: ("I850", "I859", "I864", "I982", "K704", "K711", "K721", "K729", "K765",
                 "K766", "K767"),
        },
        "cci_metastatic": {
            9: ("196-199",),
            10: ("C77-C80",),
        },
        "cci_aids": {
            9: ("042-044",),
            10: ("B20-B22", "B24"),
        },
    }
)
"""Published code lists per condition and ICD version (Quan 2005 Table 1), ranges unexpanded."""

_ENTRY = re.compile(r"^([A-Z]?)(\d+)$")
_TRIM_CHARS = " \t\r\n"


def expand_code_range(entry: str) -> tuple[str, ...]:
    """Expand one Quan (2005) list entry into explicit dot-less code prefixes.

    ``"428"`` -> ``("428",)``; ``"4254-4259"`` -> ``("4254", ..., "4259")`` (6 prefixes);
    ``"C00-C26"`` -> ``("C00", ..., "C26")`` (27 prefixes). Both ends of a range must have the
    same optional leading letter and the same number of digits; the digits are counted through
    with their zero padding kept (``"042-044"`` -> ``("042", "043", "044")``).

    Raises:
        ValueError: the entry is not a prefix or a well-formed ascending range.
    """
    parts = entry.split("-")
    if len(parts) == 1:
        if not _ENTRY.match(entry):
            raise ValueError(f"bad ICD prefix {entry!r}")
        return (entry,)
    if len(parts) != 2:
        raise ValueError(f"bad ICD range {entry!r}")
    lo, hi = (_ENTRY.match(p) for p in parts)
    if lo is None or hi is None:
        raise ValueError(f"bad ICD range {entry!r}")
    if lo.group(1) != hi.group(1) or len(lo.group(2)) != len(hi.group(2)):
        raise ValueError(f"ICD range ends differ in letter or length: {entry!r}")
    width = len(lo.group(2))
    start, stop = int(lo.group(2)), int(hi.group(2))
    if start > stop:
        raise ValueError(f"descending ICD range {entry!r}")
    return tuple(f"{lo.group(1)}{n:0{width}d}" for n in range(start, stop + 1))


def _expand_all() -> Mapping[str, Mapping[int, tuple[str, ...]]]:
    out: dict[str, Mapping[int, tuple[str, ...]]] = {}
    for column in CCI_COLUMNS:
        per_version: dict[int, tuple[str, ...]] = {}
        for version, entries in QUAN_2005_CODES[column].items():
            prefixes: list[str] = []
            for entry in entries:
                prefixes.extend(expand_code_range(entry))
            if len(set(prefixes)) != len(prefixes):
                raise ValueError(f"duplicate prefix in {column} ICD-{version}")
            per_version[version] = tuple(prefixes)
        out[column] = MappingProxyType(per_version)
    return MappingProxyType(out)


CCI_PREFIXES: Mapping[str, Mapping[int, tuple[str, ...]]] = _expand_all()
"""Explicit dot-less prefixes per condition and ICD version (QUAN_2005_CODES, ranges expanded)."""

# (icd_version, prefix) -> conditions it flags; a prefix can flag two conditions (ICD-9 40403,
# hypertensive heart and chronic kidney disease with heart failure, is both CHF and renal).
def _build_lookup() -> dict[tuple[int, str], tuple[str, ...]]:
    lookup: dict[tuple[int, str], tuple[str, ...]] = {}
    for column in CCI_COLUMNS:
        for version, prefixes in CCI_PREFIXES[column].items():
            for prefix in prefixes:
                lookup[(version, prefix)] = lookup.get((version, prefix), ()) + (column,)
    return lookup


_LOOKUP = _build_lookup()
_PREFIX_LENGTHS: dict[int, tuple[int, ...]] = {
    v: tuple(sorted({len(p) for (ver, p) in _LOOKUP if ver == v})) for v in (9, 10)
}


def normalize_icd_code(code: object) -> str:
    """Return ``code`` as MIMIC stores it: trimmed, upper-cased, no dots (" i50.9" -> "I509")."""
    return str(code).strip(_TRIM_CHARS).upper().replace(".", "")


def flags_for_codes(codes: Iterable[tuple[str, int]]) -> dict[str, int]:
    """The 12 updated-Charlson flags of one admission from its diagnosis codes.

    Args:
        codes: the admission's ``(icd_code, icd_version)`` pairs, e.g. ``[("4280", 9)]``;
            any number (0 gives all zeros). Codes are normalized with
            :func:`normalize_icd_code`; null/empty codes and versions other than 9 and 10 match
            nothing.

    Returns:
        ``{column: 0 or 1}`` for every column of :data:`CCI_COLUMNS`, in that order. A flag is 1
        when some code starts with one of the condition's prefixes for that code's version
        (:data:`CCI_PREFIXES`, Quan et al. 2005 Table 1). Flags are independent (no Charlson
        hierarchy).

    Raises:
        InputError: an ``icd_version`` is not an integer.
    """
    flags = dict.fromkeys(CCI_COLUMNS, 0)
    for code, version in codes:
        if code is None or version is None:
            continue
        try:
            v = int(version)
        except (TypeError, ValueError):
            raise InputError("diagnoses: column icd_version must hold integers (9 or 10)") from None
        lengths = _PREFIX_LENGTHS.get(v)
        if lengths is None:
            continue
        norm = normalize_icd_code(code)
        for n in lengths:
            if len(norm) < n:
                break
            for column in _LOOKUP.get((v, norm[:n]), ()):
                flags[column] = 1
    return flags


def _prefix_values_sql() -> str:
    rows = [
        f"('{column}', {version}, '{prefix}')"
        for column in CCI_COLUMNS
        for version, prefixes in CCI_PREFIXES[column].items()
        for prefix in prefixes
    ]
    return ",\n        ".join(rows)


def charlson_flags_sql(diagnoses_relation: str) -> str:
    """DuckDB query: one row per hadm_id with the 12 updated-Charlson flags.

    Args:
        diagnoses_relation: a FROM item with columns ``hadm_id``, ``icd_code`` and
            ``icd_version`` (MIMIC-IV ``hosp.diagnoses_icd``): a table or view name, a table
            function such as ``read_csv('.../diagnoses_icd.csv.gz')``, or a parenthesized
            subquery. It is inserted verbatim (trusted, program-supplied text).

    Returns:
        SQL text. Its result has one row per distinct non-null ``hadm_id`` of the relation,
        ordered by ``hadm_id``, with columns ``hadm_id`` (type as in the input) followed by the
        :data:`CCI_COLUMNS` as TINYINT (Int8) 0/1. Admissions absent from the relation get no
        row (callers left-join and fill 0). The result equals :func:`flags_for_codes` applied to
        each admission's codes.

    The query text is ``etl/sql/charlson.sql`` (the concept file, citing its sources) with the
    prefix table of :data:`CCI_PREFIXES` filled in.

    Method: the distinct normalized ``(icd_version, icd_code)`` pairs (about 30 k in full
    MIMIC-IV against 6.4 M diagnosis rows) are matched once against a VALUES table of
    ``(condition, icd_version, prefix)`` with ``starts_with``; the per-code conditions are then
    hash-joined back to the diagnosis rows and pivoted with ``count(*) FILTER``.

    Raises:
        InputError: ``diagnoses_relation`` is empty or contains ``;``.
    """
    relation = diagnoses_relation.strip()
    if not relation or ";" in relation:
        raise InputError("charlson: the diagnoses relation must be one table, view or subquery")
    trim_chars = " || ".join(f"chr({ord(c)})" for c in _TRIM_CHARS)
    flag_columns = ",\n    ".join(
        f"CAST(count(cc.condition) FILTER (WHERE cc.condition = '{c}') > 0 AS TINYINT) AS {c}"
        for c in CCI_COLUMNS
    )
    return concept_sql("", "charlson", prefixes=_prefix_values_sql(), trim_chars=trim_chars,
                       flag_columns=flag_columns, diagnoses=relation)

"""`abps etl`: MIMIC-IV (or eICU, or MEDS) raw tables -> cohort.parquet, centers.parquet, cohort report."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import typer

from cli import project
from cli.app import app
from etl.errors import InputError, InputWarning

#: the sources ``abps etl --source`` reads
SOURCES = ("mimic", "eicu", "meds")


def _fractions(text: str) -> tuple[float, float, float]:
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise InputError(f"--split '{text}': expected three comma-separated numbers like 0.7,0.15,0.15") from None
    if len(parts) != 3:
        raise InputError(f"--split '{text}': expected three comma-separated numbers like 0.7,0.15,0.15")
    return parts  # type: ignore[return-value]


def _names(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    if not names:
        raise InputError("--meds-splits: expected comma-separated split names like tuning,held_out")
    return names


def _run(source: str, src_dir: Path, out: Path, opts, meds_splits: str | None) -> dict:
    """The ETL of ``source`` (its cohort report)."""
    if source == "mimic":
        from etl.mimic import run_etl

        return run_etl(src_dir, out, opts)
    if source == "eicu":
        from etl.eicu import run_eicu_etl

        return run_eicu_etl(src_dir, out, opts)
    if source == "meds":
        from etl.meds import run_meds_etl

        return run_meds_etl(src_dir, out, opts, splits=_names(meds_splits))
    raise InputError(f"unknown --source '{source}' (choose from {', '.join(SOURCES)})")


@app.command("etl")
def etl_command(
    out: Path = typer.Option(..., "--out", parser=project.folder_path, metavar="DIR", help="Output folder (cohort.parquet, centers.parquet, cohort_report.*)."),
    mimic_dir: Path | None = typer.Option(None, "--mimic-dir", help="MIMIC-IV folder with hosp/ and icu/ (default: the MIMIC_DIR environment variable)."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="Source folder (alias of --mimic-dir; eICU folder with --source eicu)."),
    source: str = typer.Option("mimic", "--source", help="mimic (default), eicu or meds (a MEDS dataset: data/<split>/*.parquet + metadata/)."),
    meds_splits: str | None = typer.Option(None, "--meds-splits", help="Comma-separated MEDS splits to read (meds; default: every split of metadata/subject_splits.parquet)."),
    partition: str = typer.Option("careunit-year", help="careunit-year | careunit-era | dirichlet | iid (mimic; eICU centers are hospitals)."),
    window_years: int = typer.Option(2, help="Width of the shifted-year windows (careunit-year)."),
    window_origin: int = typer.Option(2100, help="A shifted year on a window boundary."),
    care_units: str = typer.Option("MICU,MICU/SICU,CVICU,SICU,CCU,TSICU", help="Comma-separated short care-unit names (mimic)."),
    min_age: float = typer.Option(18, help="Minimum age in years (inclusive)."),
    max_age: float = typer.Option(95, help="Maximum age in years (inclusive)."),
    min_center_stays: int | None = typer.Option(None, help="Centers with fewer stays are dropped (default 50 for mimic, 10 for eicu)."),
    vitals_from_hours: float = typer.Option(0.0, help="Vital window start relative to intime, hours (0: intime to intime + 24 h; -6: mimic-code's window)."),
    comorbidity_source: str = typer.Option("same-admission", help="same-admission | earlier-admissions (leakage-free)."),
    split: str = typer.Option("0.7,0.15,0.15", help="train,val,test fractions."),
    n_centers: int = typer.Option(20, help="Number of centers (dirichlet / iid)."),
    alpha: float = typer.Option(0.5, help="Dirichlet concentration (dirichlet)."),
    seed: int = typer.Option(0, help="Seed of the split and random partitions."),
    threads: int = typer.Option(2, help="DuckDB threads (both sources; the output does not depend on it)."),
    memory_limit: str = typer.Option("2GB", help="DuckDB memory limit (both sources; spills to disk above it)."),
    task: str = typer.Option("in-hospital-mortality", "--task",
                             help="Outcome written to label: in-hospital-mortality | icu-mortality | los-3 | los-7 | "
                                  "decompensation "
                                  "(docs/tasks.md)."),
    chart_cache: str = typer.Option("auto", "--chart-cache",
                                    help="MIMIC chartevents Parquet cache (the vitals per charttime), written on "
                                         "first read and reused while the source and the ETL's vital concepts are "
                                         "unchanged: auto (sources >= 64 MiB, in $ABPS_CACHE_DIR or "
                                         "~/.cache/abps), off, or a folder (docs/etl.md)."),
    force: bool = typer.Option(False, "--force", help="Replace a cohort in --out that was built with other settings."),
) -> None:
    """Build the federated ICU cohort: in-hospital mortality, or another --task (ABPS paper Sec. 6.1)."""
    from etl.mimic import EtlOptions

    if mimic_dir is not None and data_dir is not None and mimic_dir != data_dir:
        raise InputError("give the source folder once: --mimic-dir or --data-dir, not both")
    src_dir = mimic_dir or data_dir or (Path(os.environ["MIMIC_DIR"]) if source == "mimic" and os.environ.get("MIMIC_DIR") else None)
    if src_dir is None:
        if source != "mimic":
            raise InputError(f"give the {source} folder with --data-dir (MIMIC_DIR names a MIMIC-IV folder only)")
        raise InputError("give the source folder with --mimic-dir (or --data-dir, or the MIMIC_DIR environment variable)")
    if mimic_dir is None and data_dir is None and not src_dir.is_dir():  # named by the environment, not an option
        raise InputError(f"MIMIC_DIR {src_dir}: not a directory (the environment variable; --mimic-dir names another folder)")
    if out.resolve() == src_dir.resolve() or out.resolve() in src_dir.resolve().parents:
        raise InputError(f"--out {out}: it holds the source folder {src_dir}; give the output a folder of its own")
    project.check_out_ignored(out)  # patient identifiers never land in a git work tree unignored
    opts = EtlOptions(
        partition=partition, window_years=window_years, window_origin=window_origin,
        care_units=tuple(dict.fromkeys(u.strip() for u in care_units.split(",") if u.strip())),
        min_age=min_age, max_age=max_age,
        min_center_stays=min_center_stays if min_center_stays is not None else (10 if source == "eicu" else 50),
        vitals_from_hours=vitals_from_hours, comorbidity_source=comorbidity_source,
        split_fractions=_fractions(split), n_centers=n_centers, alpha=alpha, seed=seed,
        threads=threads, memory_limit=memory_limit, task=task, chart_cache=chart_cache.strip(),
    )
    if meds_splits is not None and source != "meds":
        raise InputError("--meds-splits does not apply to --source " + source + "; leave it out")
    if source not in SOURCES:
        raise InputError(f"unknown --source '{source}' (choose from {', '.join(SOURCES)})")
    opts.validate(source)
    if not force:
        _check_replaces(out, source, opts)
    if source == "mimic" and opts.chart_cache not in ("auto", "off"):  # the cache holds stay_id rows too
        project.check_out_ignored(Path(opts.chart_cache).expanduser(), "--chart-cache", "chartevents.parquet",
                                  "the chartevents cache holds stay_id rows")
    from etl import progress
    from etl.chart_stream import hold_freed_memory

    if source == "mimic":
        hold_freed_memory()

    with progress.bar(f"etl {source}", total=4 if source == "mimic" else 1), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InputWarning)
        rep = _run(source, src_dir, out, opts, meds_splits)
    if rep.get("source_release"):
        typer.echo(f"found {rep['source_release']} in {src_dir}")
    for w in caught:
        if issubclass(w.category, InputWarning):
            typer.echo(f"warning: {w.message}", err=True)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    cache = rep.get("chartevents_cache") or {}
    if cache.get("status") == "unwritable":  # the run read the source instead; said, not only reported
        typer.echo(f"warning: --chart-cache {opts.chart_cache}: not written ({cache.get('reason') or 'unwritable'}); "
                   "chartevents was read from the source", err=True)
    dup = [r for r in rep["attrition"] if r.get("unit") == "rows"]
    if dup:
        typer.echo(f"note: collapsed {sum(r['rows_removed'] for r in dup)} identical duplicate source rows in "
                   f"{len(dup)} table(s) (counted in cohort_report attrition)", err=True)
    for r in rep["attrition"]:
        # a small database loses most stays to the center-size filter: said here, not only in the report
        if "centers_removed" in r and r["stays_removed"] > 0.1 * r["stays_in"]:
            typer.echo(f"note: {r['centers_removed']} of {r['centers_in']} centers ({r['stays_removed']} of "
                       f"{r['stays_in']} stays) hold fewer than {rep['options']['min_center_stays']} stays and were "
                       "left out (--min-center-stays)", err=True)
    small = rep["stays_per_center"]["min"]
    if small < 10:
        typer.echo(f"warning: the smallest center holds {small} stay{'' if small == 1 else 's'}; per-center metadata of centers under 10 "
                   "stays can single out patients (raise --min-center-stays before sharing centers.parquet)",
                   err=True)
    typer.echo(
        f"cohort: {rep['stays']} stays, {rep['centers']} centers, {rep['task']} rate {rep['label_rate']:.3f} -> {out}"
    )
    project.record_etl(out, source)


#: ETL options that say how a cohort is built, not what it holds
_HOW_BUILT = ("threads", "memory_limit", "chart_cache")


def _check_replaces(out: Path, source: str, opts: object) -> None:
    """Refuse (InputError naming --out and the first differing setting) to replace a cohort in
    ``out`` whose cohort_report.json records another source or other options (an unreadable one
    counts as other); the same settings rebuild it (the same inputs give the same files)."""
    import json
    from dataclasses import asdict

    if not (out / "cohort.parquet").exists():
        return
    try:
        before = json.loads((out / "cohort_report.json").read_text())
        had = {"source": before["source"], **before["options"]}
    except (OSError, ValueError, KeyError, TypeError):
        had = None
    now = {"source": source, **json.loads(json.dumps(asdict(opts)))}
    if source == "eicu":  # its centers are hospitals, as its report says
        now["partition"] = "hospital"
    diff = ["a cohort without a readable cohort_report.json"] if had is None else [
        f"{k} {had.get(k)!r}, now {v!r}" for k, v in now.items() if k not in _HOW_BUILT and had.get(k) != v]
    if diff:
        raise InputError(f"--out {out}: holds a cohort built with other settings ({diff[0]}); give --force to "
                         "replace it, or another --out")

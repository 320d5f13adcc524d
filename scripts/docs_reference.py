"""Reference pages of the documentation site, generated from the code at build time.

An MkDocs hook (mkdocs.yml ``hooks:``): :func:`on_files` adds the generated pages
``reference/cli.md`` (the typer app), ``reference/config.md`` (the pydantic models),
``reference/methods.md`` (the method registry), ``reference/outputs.md`` (etl.schema and the keys
of a real results.json) and ``reference/mlflow.md`` (the metrics and tags a real run logs);
:func:`on_page_markdown` fails the build when a page names a repository file or module that does
not exist. tests/test_docs.py imports the same functions, so the pages cannot drift.

This is the ONE module of the docs that imports project code: a module that moves changes the
imports in :func:`_project` only.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PAGES = ("reference/cli.md", "reference/config.md", "reference/methods.md", "reference/outputs.md",
         "reference/mlflow.md")


@functools.lru_cache(maxsize=1)
def _project() -> types.SimpleNamespace:
    """Every import of project code the generator makes (one place)."""
    import sys

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import typer

    from cli import app as cli_app
    from etl import schema
    from federation.core import config
    from federation.data.synthetic import write_fedprox_cohort
    from federation.methods import registry
    from federation.run import tracking
    from federation.run.runner import run_training
    from federation.sweep import spec

    cli_app._register()
    return types.SimpleNamespace(
        click_app=typer.main.get_command(cli_app.app), RunConfig=config.RunConfig, SweepSpec=spec.SweepSpec,
        build_config=config.build_config, all_methods=registry.all_methods, method_names=registry.method_names,
        tracking=tracking, schema=schema, run_training=run_training, write_cohort=write_fedprox_cohort)


# ---- CLI ------------------------------------------------------------------------------------

def cli_commands() -> list[tuple[str, Any]]:
    """``[(full command, click command)]`` of every leaf command, in the app's order."""
    out: list[tuple[str, Any]] = []

    def walk(prefix: str, cmd: Any) -> None:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name in sorted(subs):
                walk(f"{prefix} {name}", subs[name])
        else:
            out.append((prefix, cmd))

    walk("abps", _project().click_app)
    return out


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _param_type(p: Any) -> str:
    """The option's value type as the user writes it: ``flag``, ``integer``, ``integer >= 1``, ``path`` ..."""
    if getattr(p, "is_flag", False):
        return "flag"
    ann = p.type_descriptor.annotation
    inner = typing.get_args(ann)[0] if typing.get_origin(ann) is list else ann
    name = {int: "integer", float: "number", str: "text", bool: "flag"}.get(inner, getattr(inner, "__name__", str(inner)))
    name = "path" if name in ("Path", "PosixPath") else name
    if p.min is not None and p.max is not None:
        name += f" in [{p.min}, {p.max}]"
    elif p.min is not None:
        name += f" >= {p.min}"
    elif p.max is not None:
        name += f" <= {p.max}"
    return name + (" (repeatable)" if typing.get_origin(ann) is list else "")


def _default(value: Any) -> str:
    if value is None or value == () or value == []:
        return ""
    if callable(value):
        return "(computed)"
    return f"`{value}`"


def cli_page() -> str:
    lines = ["# Command line", "",
             "Generated from the typer application (`cli/app.py` and the `cli/*_cmd.py` modules) when the "
             "site is built. `abps COMMAND --help` prints the same text. Every command exits 0 on success, "
             "2 with one `error: ...` line on bad input, 130 on Ctrl-C and 143 on SIGTERM.", ""]
    for full, cmd in cli_commands():
        lines += [f"## `{full}`", "", _cell(cmd.help or "").replace("\\|", "|"), "",
                  "| option | type | default | help |", "|---|---|---|---|"]
        for p in cmd.params:
            if p.name == "help":
                continue
            opts = ", ".join(f"`{o}`" for o in [*p.opts, *getattr(p, "secondary_opts", [])])
            lines.append(f"| {opts} | {_param_type(p)} | {_default(p.default)} | {_cell(p.help or '')} |")
        lines.append("")
    return "\n".join(lines)


# ---- config keys ----------------------------------------------------------------------------

def _models(tp: Any) -> list[type]:
    """The pydantic model classes inside an annotation (``X | None``, ``tuple[X, ...]``)."""
    from pydantic import BaseModel

    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for a in typing.get_args(tp) for m in _models(a)]


def _type_name(tp: Any) -> str:
    s = str(tp) if not isinstance(tp, type) else tp.__name__
    s = re.sub(r"\b(typing|pydantic\.types|federation\.[\w.]+|abps\.[\w.]+)\.", "", s)
    s = s.replace("NoneType", "None").replace("<class '", "").replace("'>", "")
    return s


def _meaning(model: type, key: str, field: Any) -> str:
    """The field's description, else what the docstring of the class defining it (or a subclass)
    says about ``key``: its ``Attributes:`` entry, else the sentence that names it."""
    if field.description:
        return field.description
    for cls in model.__mro__:
        if cls.__dict__.get("__doc__"):
            text = _doc_meaning(inspect.getdoc(cls) or "", key)
            if text:
                return text
    return ""


def _doc_meaning(raw: str, key: str) -> str:
    # Google style: "Attributes:" / "Args:" entries "key: text" (continuation lines indented)
    m = re.search(r"^\s+" + re.escape(key) + r"(?:,[^:]*)?(?: \([^)]*\))?: (.+(?:\n\s{8,}\S.*)*)", raw, flags=re.M)
    if m:
        return " ".join(m.group(1).split()).replace("``", "`")
    m = re.search(r"^\s+[\w, ]*\b" + re.escape(key) + r"\b[\w, ]*: (.+(?:\n\s{8,}\S.*)*)", raw, flags=re.M)
    if m:
        return " ".join(m.group(1).split()).replace("``", "`")
    doc = " ".join(raw.split())
    m = re.search(r"``" + re.escape(key) + r"``.*?(?:\.(?=\s+[A-Z`*]|$)|$)", doc)
    return m.group(0).replace("``", "`")[:400] if m else ""


def config_keys(model: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """``[(dotted key, type, default, meaning)]`` of a pydantic model, nested models expanded."""
    from pydantic_core import PydanticUndefined

    rows = []
    for key, f in model.model_fields.items():
        sub = _models(f.annotation)
        default = "required" if f.default is PydanticUndefined and f.default_factory is None else (
            f"`{f.default_factory()}`" if f.default_factory else f"`{f.default}`")
        if sub and sub[0] is not model:
            rows.append((prefix + key, "section", "" if f.default is None else "", _meaning(model, key, f) or
                         " ".join((inspect.getdoc(sub[0]) or "").split("\n\n")[0].split())))
            for m in sub:
                rows += config_keys(m, prefix + key + ".")
        else:
            rows.append((prefix + key, _type_name(f.annotation), default, _meaning(model, key, f)))
    return rows


def method_params() -> dict[str, list[tuple[str, str, str, str]]]:
    """Method name -> rows of its ``params:`` model (the run config's ``params:`` mapping)."""
    out = {}
    for name in _project().method_names():
        cls = _project().all_methods()[name]
        out[name] = config_keys(cls.Params, "params.")
    return out


def config_page() -> str:
    p = _project()
    lines = ["# Configuration keys", "",
             "Generated from the pydantic models when the site is built. A run config is the defaults "
             "below, then the method's own defaults, then the YAML file (`--config`, e.g. "
             "`configs/abps.yaml`), then `--rounds` and `--param`. Unknown keys, NaN and infinity are "
             "refused with one line naming the key.", "",
             "## Run config (`abps train --config`)", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {_cell(t)} | {_cell(d)} | {_cell(m)} |" for k, t, d, m in config_keys(p.RunConfig)]
    lines += ["", "## Method parameters (`params:`, `--param NAME=VALUE`)", "",
              "Each method validates its own `params:` mapping; a key another method owns is refused."]
    for name, rows in method_params().items():
        lines += ["", f"### `{name}`", ""]
        if not rows:
            lines.append("No parameters of its own.")
            continue
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        lines += [f"| `{k}` | {_cell(t)} | {_cell(d)} | {_cell(m)} |" for k, t, d, m in rows]
    lines += ["", "## Sweep file (`abps sweep --config`)", "", "| key | type | default | meaning |",
              "|---|---|---|---|"]
    lines += [f"| `{k}` | {_cell(t)} | {_cell(d)} | {_cell(m)} |" for k, t, d, m in config_keys(p.SweepSpec)]
    return "\n".join(lines) + "\n"


# ---- methods --------------------------------------------------------------------------------

def _doc_source(cls: type) -> str:
    """The first paragraph of the class docstring: what the method is and where in which paper."""
    doc = inspect.getdoc(cls) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _equations(cls: type) -> str:
    """Every 'eq. N' / 'Algorithm N' / 'Sec. N' the class docstring cites, in order, once each."""
    doc = inspect.getdoc(cls) or ""
    seen: list[str] = []
    for m in re.finditer(r"\b(?:eqs?\.|Eq\.|Alg\.|Algorithm|Sec\.|Lemma|Table)\s*(?:\(\d+(?:\.\d+)*\)|\d+(?:\.\d+)*)", doc):
        s = m.group(0)
        if s not in seen:
            seen.append(s)
    return ", ".join(seen)


def methods_page() -> str:
    p = _project()
    lines = ["# Methods", "",
             "Generated from the method registry (`federation/methods/registry.py`) when the site is "
             "built: every name `abps train --method` accepts, in the ABPS paper's Table 1 order, then "
             "the methods beyond the paper. *Family* is the Figure 3 colour group; *paper and equations* "
             "is the class docstring's own statement of its source. The code-to-paper maps: "
             "[ABPS](../abps.md), [baselines](../baselines.md), [runtime](../runtime.md).", "",
             "| name | Table 1 row | family | row | module | paper and equations | cited |",
             "|---|---|---|---|---|---|---|"]
    for name in p.method_names():
        cls = p.all_methods()[name]
        mod = cls.__module__.replace(".", "/") + ".py"
        lines.append(f"| `{name}` | {_cell(cls.display_name)} | {cls.family} | "
                     f"{cls.paper_order if cls.paper_order is not None else '-'} | `{mod}` | "
                     f"{_cell(_doc_source(cls))} | {_cell(_equations(cls))} |")
    return "\n".join(lines) + "\n"


# ---- a real run: results.json keys, MLflow metrics and tags -----------------------------------

@functools.lru_cache(maxsize=1)
def sample_run() -> dict[str, Any]:
    """Train FedAvg and ABPS (goal diversity) for 2 rounds on a 5-center synthetic cohort into a
    temporary MLflow store; return the results.json documents and every metric / tag / artifact
    name each run logged. Takes a few seconds; the pages are written from what the code really logs."""
    import logging
    import warnings

    import mlflow

    p = _project()
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    warnings.simplefilter("ignore")  # the tiny cohort's small-center warning is expected here
    with tempfile.TemporaryDirectory(prefix="abps-docs-") as tmp_name:
        tmp = Path(tmp_name)
        cohort = p.write_cohort(tmp / "cohort", n_centers=5, seed=4, mean_size=200.0, shared=0.8)
        uri = f"sqlite:///{tmp / 'mlflow.db'}"
        docs: dict[str, Any] = {}
        for method, params in (("fedavg", None), ("abps", {"goal": "diversity"})):
            cfg = p.build_config(method, p.all_methods()[method].default_config,
                                 {"method": method, "params": params} if params else None, 2)
            docs[method] = p.run_training(cfg, cohort, [11], output=tmp / f"{method}.json", tracking_uri=uri,
                                          experiment="reference", progress=False)
            docs[method] = json.loads((tmp / f"{method}.json").read_text())
        client = mlflow.MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name("reference")
        metrics: dict[str, set[str]] = {}
        tags: dict[str, set[str]] = {}
        artifacts: dict[str, set[str]] = {}
        for r in client.search_runs([exp.experiment_id]):
            kind = r.data.tags.get(p.tracking.KIND_TAG, "?")
            method = r.data.tags.get(p.tracking.METHOD_TAG, "?")
            for k in r.data.metrics:
                metrics.setdefault(k, set()).add(method)
            for k in r.data.tags:
                if k.startswith("mlflow."):
                    continue
                tags.setdefault(k, set()).add(kind)
            for a in client.list_artifacts(r.info.run_id):
                artifacts.setdefault(a.path, set()).add(kind)
        return {"results": docs, "metrics": metrics, "tags": tags, "artifacts": artifacts}


#: What each results.json / MLflow name means. tests/test_docs.py asserts every name a run writes is here.
MEANINGS: dict[str, str] = {
    # per-round metrics (step = round)
    "val_auroc_mean": "mean over centers of the validation AUROC after the round's exchange",
    "val_auroc_std": "standard deviation over centers of the validation AUROC",
    "test_auroc_mean": "mean over evaluable centers of the test AUROC",
    "test_auroc_std": "standard deviation over centers of the test AUROC",
    "round_bytes": "model bytes that crossed between centers (or center and server) in the round",
    "cum_bytes": "model bytes since round 1",
    "cum_probe_bytes": "probe bytes since round 1 (anchor predictions, evaluations)",
    "cum_metadata_bytes": "metadata bytes since round 1 (ABPS v_i vectors, federated encoding aggregates)",
    "rel_bandwidth": "total bytes / FedAvg's reference traffic (every center sends the full fp32 model each of reference_rounds rounds)",
    "isolation_rate": "share of centers with no partner (resting) this round (ABPS)",
    "mean_partners": "mean partners per center this round (ABPS; at most kappa)",
    "acceptance_rate": "accepted proposals / proposals this round (ABPS propose-reject)",
    "proposals": "proposals sent this round (ABPS)",
    "partnerships": "partnerships formed this round (ABPS)",
    "shapley_credit_mean": "mean Shapley credit of the round's partners (ABPS, eq. 6)",
    "belief_mean": "mean posterior Beta mean over candidate pairs (ABPS)",
    # final metrics (step = rounds run)
    "final_auroc_mean": "headline: mean test AUROC over the centers whose test split holds both classes, at the best (or last) round",
    "final_auroc_std": "standard deviation over centers of the final test AUROC",
    "final_val_auroc_mean": "mean validation AUROC at the final (restored) round",
    "rounds_run": "rounds run (early stopping may stop before `rounds`)",
    "best_round": "round whose parameters were kept (early stopping restores it)",
    "total_bytes": "model + probe + metadata bytes of the run",
    "model_bytes": "model parameter bytes of the run",
    "probe_bytes": "probe bytes of the run",
    "metadata_bytes": "metadata bytes of the run",
    "n_excluded_test": "centers whose test split lacks a class (no AUROC)",
    "n_scored_test": "centers with a test AUROC",
    "min_scored_test": "evaluable centers a defined headline mean needs (evaluation.min_centers / min_center_share)",
    "test_excluded": "centers without a test AUROC this round (one class in their test split)",
    "val_excluded": "centers without a validation AUROC this round (one class in their validation split)",
    "edges": "links that carried a model this round (peer edges + center-server links)",
    # ABPS per round (abps/method.py after_exchange, abps/drift.py)
    "coalitions_evaluated": "coalition models scored for the Shapley credit this round (eq. 6)",
    "mean_phi": "mean Shapley value phi of the observed partners (eq. 6)",
    "mean_phi_bar": "mean clipped reward phi-bar of the observed partners (eq. 5)",
    "mean_shapley_gain": "mean AUROC gain of a center's coalition over itself alone",
    "mean_belief": "mean posterior Beta mean over all center pairs",
    "candidate_kept_share": "exact candidate pairs still candidates under the DP metadata / drift reset (1 = none lost)",
    "candidate_jaccard": "Jaccard overlap of the candidate pairs with the exact (noise-free) ones",
    # ABPS per seed (final_metrics -> results.json method_summary and final MLflow metrics)
    "partners_mean": "E|P_i| over centers and rounds",
    "run_acceptance_rate": "accepted / sent proposals over the whole run",
    "centers_ever_rested": "centers that rested (no partner) in at least one round",
    "rounds_rested": "per center_id: rounds it rested",
    "dp_epsilon_spent": "epsilon of the composed metadata releases at dp_delta (privacy.md); null without DP",
    "dp_delta": "delta the DP epsilon is stated at",
    "dp_epsilon_per_release": "epsilon of one metadata release; null without DP",
    "dp_sigma_multiplier": "Gaussian noise multiplier z of a release",
    "dp_releases": "metadata releases over all centers",
    "dp_max_releases_per_center": "most releases any one center made",
    # results.json structure
    "method": "registered method name",
    "AUROC": "headline: final test AUROC, mean over the evaluable centers (final_auroc_mean)",
    "Bandwidth": "headline: cumulative model bytes / FedAvg's reference traffic (rel_bandwidth)",
    "Isolation": "headline: share of centers with no partner, mean over rounds (rest_share_mean)",
    "rest_share_mean": "share of centers with no partner, mean over rounds",
    "torch_threads": "PyTorch threads the run used (abps train --threads)",
    "subgroup_unassigned": "per subgroup axis, the evaluated rows in no group of it (e.g. an unknown race), so the subgroup table accounts for every row",
    "label": "the run's row name everywhere: the method plus every parameter set away from its preset, e.g. abps [goal=diversity]",
    "seed": "run seed",
    "cohort": "the cohort folder the run read",
    "seeds": "one entry per seed",
    "<seed>": "the seed's results",
    "summary": "mean, std and undefined-seed count across seeds of the headline figures",
    "n_centers": "centers in the run (after min_train)",
    "metric": "headline metric (auroc for the binary tasks)",
    "dropped_centers": "centers the runtime dropped, by reason (count)",
    "<reason>": "count of centers dropped for this reason",
    "method_summary": "the method's final_metrics (ABPS: isolation, partners, DP, drift figures)",
    "clinical": "end-of-run clinical figures (metrics.md)",
    "distribution": "per figure (auroc, auprc, brier, ece, cal_slope ...): mean, median, std, worst10, gini over centers",
    "auroc_ci": "bootstrap 95 % interval of the mean AUROC (200 replicates)",
    "ece_bins": "bins of the expected calibration error",
    "n_boot": "bootstrap replicates",
    "subgroups": "per subgroup axis and level: AUROC and its gap to the overall figure (suppressed below the minimum size)",
    "subgroup_note": "what was suppressed and why",
    "per_center": "per center_id: val / test AUROC, train rows and the like",
    "<center_id>": "one center's figures",
    "config": "the run config as run (Configuration keys page)",
    "history": "per round: the round's metrics (as MLflow's per-round metrics)",
    "curve": "per round: mean validation AUROC and cumulative bytes, the bytes-to-target curve (federation/core/targets.py)",
    "round": "rounds completed (1-based), one entry per evaluated round",
    "cum_total_bytes": "model + probe + metadata bytes since round 1",
    "bytes_to_target": "per targets.auroc target: the first round and the cumulative bytes at which the mean validation AUROC reaches it (null, null: never reached)",
    "provenance": "where the run was computed: CPU, SIMD level, engine step, versions",
}

_CLINICAL_PREFIXES = {
    "clin_": "clinical figure at the end of the run (metrics.md): AUROC worst-10 %, Gini, AUPRC, Brier, ECE, calibration slope, subgroup gaps",
    "isolation_": "ABPS per-seed isolation summary (final_metrics)",
    "rest_": "ABPS per-seed resting summary (final_metrics)",
    "rounds_to_auroc_": "first round whose mean validation AUROC reaches the target in the name (targets.auroc; absent: never reached)",
    "bytes_to_auroc_": "cumulative model + probe + metadata bytes at that round (targets.auroc; absent: never reached)",
}


_STATS = {"mean": "mean", "median": "median", "std": "standard deviation", "worst10": "mean of the worst 10 % of centers",
          "gini": "Gini coefficient", "ci_low": "bootstrap 95 % interval, low end", "ci_high": "bootstrap 95 % interval, high end"}
_FIGURES = {"auroc": "AUROC", "auprc": "AUPRC", "brier": "Brier score", "ece": "expected calibration error",
            "cal_slope": "calibration slope", "cal_intercept": "calibration intercept"}


def meaning(name: str) -> str:
    """The meaning of a results.json / MLflow name ('' when unknown)."""
    m = re.fullmatch(r"clin_(\w+?)_(mean|median|std|worst10|gini|ci_low|ci_high)", name)
    if m and m.group(1) in _FIGURES:
        return f"end of run, over centers: {_STATS[m.group(2)]} of the {_FIGURES[m.group(1)]} (metrics.md)"
    if name in MEANINGS:
        return MEANINGS[name]
    for pre, text in _CLINICAL_PREFIXES.items():
        if name.startswith(pre):
            return text
    return ""


def _json_keys(obj: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, str]]:
    """``[(dotted key, JSON type)]`` of a results.json document; per-seed and per-center maps shown once."""
    rows: list[tuple[str, str]] = []
    if isinstance(obj, dict):
        items = list(obj.items())
        generic = prefix.endswith(("seeds.", "per_center.", "dropped_centers.")) and items
        if generic:
            label = {"seeds.": "<seed>", "per_center.": "<center_id>", "dropped_centers.": "<reason>"}
            key = next(v for k, v in label.items() if prefix.endswith(k))
            items = [(key, items[0][1])]
        for k, v in items:
            name = f"{prefix}{k}"
            rows.append((name, type(v).__name__ if not isinstance(v, dict) else "object"))
            if isinstance(v, dict) and depth < 3:
                rows += _json_keys(v, name + ".", depth + 1)
    return rows


def results_keys() -> list[tuple[str, str]]:
    """Keys of a real results.json (FedAvg and ABPS merged, first occurrence order)."""
    seen: dict[str, str] = {}
    for doc in sample_run()["results"].values():
        for k, t in _json_keys(doc):
            seen.setdefault(k, t)
    return list(seen.items())


def results_meaning(key: str) -> str:
    """The meaning of a dotted results.json key ('' when unknown)."""
    if key.startswith("config."):
        return f"run config key `{key[len('config.'):]}` as run (Configuration keys page)"
    parts = key.split(".")
    if parts[0] == "summary" and len(parts) == 3:
        return {"mean": "mean across seeds", "std": "standard deviation across seeds",
                "n_seeds_undefined": "seeds whose figure is undefined (too few evaluable centers)"}.get(parts[2], "")
    return meaning(parts[-1])


def outputs_page() -> str:
    s = _project().schema
    lines = ["# Output files", "",
             "Generated when the site is built: the cohort columns from `etl/schema.py` (their meaning: "
             "[data dictionary](../data_dictionary.md)) and the keys of a real `results.json`, written by "
             "a 2-round FedAvg and ABPS run on a 5-center synthetic cohort.", "",
             "| file | written by | rows | level |", "|---|---|---|---|",
             "| `cohort.parquet` | `abps etl` | one per ICU stay kept | row-level: stays on your disk |",
             "| `centers.parquet` | `abps etl` | one per center | aggregates |",
             "| `cohort_report.json`, `cohort_report.md` | `abps etl` | attrition, mortality per unit and window, partition statistics | aggregates |",
             "| `results.json` | `abps train` (`runs/<experiment>/<method>-<UTC time>/`), `abps sweep` (per cell) | one document per run | aggregates keyed by center_id |",
             "| `table1.md`, `table1.csv`, `fig3.png`, `report.md` | `abps report --out DIR` | Table 1 rows, Figure 3 | aggregates |",
             "", "## cohort.parquet columns", "", ", ".join(f"`{c}`" for c in s.COHORT_COLUMNS), "",
             "## centers.parquet columns", "", ", ".join(f"`{c}`" for c in s.CENTER_COLUMNS), "",
             "## results.json keys", "",
             "`seeds.<seed>` holds one entry per seed; `per_center.<center_id>` one entry per center.", "",
             "| key | JSON type | meaning |", "|---|---|---|"]
    lines += [f"| `{k}` | {t} | {_cell(results_meaning(k))} |" for k, t in results_keys()]
    return "\n".join(lines) + "\n"


def mlflow_page() -> str:
    run = sample_run()
    t = _project().tracking
    lines = ["# MLflow metrics and tags", "",
             "Generated when the site is built from what a 2-round FedAvg run and an ABPS run (goal "
             "diversity) really log to a fresh store. Per-round metrics are logged at step = round; "
             "final metrics at step = rounds run. Default store `sqlite:///mlflow/mlflow.db`; open it "
             "with `abps ui`. No stay_id, subject_id, hadm_id or patient row is ever logged.", "",
             "## Metrics", "", "| metric | logged by | meaning |", "|---|---|---|"]
    for k in sorted(run["metrics"]):
        lines.append(f"| `{k}` | {', '.join(sorted(run['metrics'][k]))} | {_cell(meaning(k))} |")
    lines += ["", "## Tags", "", f"`{t.KIND_TAG}` says what a run is: `{t.KIND_TRAIN}` (an `abps train` "
              f"parent), `{t.KIND_RUN}` (one seed), `{t.KIND_SWEEP}` (a sweep's parent), `{t.KIND_CELL}` "
              f"(one sweep cell), `{t.KIND_REPORT}`. Training runs carry `{t.LABEL_TAG}` (the row name), "
              f"`{t.COHORT_NAME_TAG}` (the cohort's folder) and `{t.HASH_TAG}` (the config's hash); "
              f"sweep cells add "
              f"`{t.SWEEP_TAG}`, `{t.CELL_SECONDS_TAG}`, `{t.EXECUTOR_TAG}`; image-benchmark runs carry "
              f"`{t.BENCHMARK_TAG}`, `{t.SELECTOR_TAG}`, `{t.ARM_TAG}`, `{t.GRID_CELL_TAG}`. Tags under "
              f"`{t.PLATFORM_TAG_PREFIX}` record where the run was computed (docs: reproducibility).", "",
              "| tag | on runs of kind |", "|---|---|"]
    for k in sorted(run["tags"]):
        lines.append(f"| `{k}` | {', '.join(sorted(run['tags'][k]))} |")
    lines += ["", "## Artifacts", "", "| artifact | on runs of kind |", "|---|---|"]
    for k in sorted(run["artifacts"]):
        lines.append(f"| `{k}` | {', '.join(sorted(run['artifacts'][k]))} |")
    return "\n".join(lines) + "\n"


GENERATORS = {"reference/cli.md": cli_page, "reference/config.md": config_page,
              "reference/methods.md": methods_page, "reference/outputs.md": outputs_page,
              "reference/mlflow.md": mlflow_page}


# ---- paths named in the docs ----------------------------------------------------------------

_PATH = re.compile(r"(?<![\w/.<-])((?:etl|federation|abps|cli|configs|benchmarks|tests|scripts|docs)"
                   r"/[\w./-]*\w\.(?:py|yaml|sql|md|cpp|sh|png|csv))\b")
_MODULE = re.compile(r"(?<![\w/.`-])`?((?:etl|federation|abps|cli)\.[a-z_][\w.]*)")


@functools.lru_cache(maxsize=1)
def _tag_names() -> frozenset[str]:
    """The MLflow tag names of the tag schema (``abps.kind`` ...): dotted, but no modules."""
    t = _project().tracking
    return frozenset(v for k, v in vars(t).items() if k.isupper() and isinstance(v, str) and v.startswith("abps."))


def missing_paths(text: str) -> list[str]:
    """Repository files (``federation/engine.py``) and modules (``federation.mixing.mix``) that
    ``text`` names but the checkout lacks. A dotted name passes when its first two parts name a
    module or package (``federation/mixing.py`` or ``federation/mixing/``)."""
    bad = []
    for m in _PATH.finditer(text):
        p = m.group(1)
        if not (REPO / p).exists() and not (REPO / "docs" / p).exists():
            bad.append(p)
    tags = _tag_names()
    for m in _MODULE.finditer(text):
        name = m.group(1).rstrip(".")
        parts = name.split(".")
        if len(parts) < 2 or parts[1] in ("py", "md", "yaml", "json", "parquet", "csv") or \
                name in tags or name + "." in tags or any(name.startswith(t) for t in tags if t.endswith(".")):
            continue
        base = REPO / parts[0] / parts[1]
        if not (base.with_suffix(".py").exists() or base.is_dir()):
            bad.append(m.group(1))
    return sorted(set(bad))


# ---- MkDocs hooks ---------------------------------------------------------------------------

def on_files(files: Any, config: Any) -> Any:
    """Add the generated reference pages to the site."""
    from mkdocs.structure.files import File

    for uri, gen in GENERATORS.items():
        files.append(File.generated(config, uri, content=gen()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fail the build when a page names a repository path or module that does not exist."""
    from mkdocs.exceptions import PluginError

    bad = missing_paths(markdown)
    if bad:
        raise PluginError(f"{page.file.src_uri}: names paths that do not exist: {', '.join(bad)}")
    return markdown


if __name__ == "__main__":  # print one page: python scripts/docs_reference.py reference/cli.md
    import sys

    os.environ.setdefault("ABPS_STATE", str(Path(tempfile.mkdtemp()) / "state.json"))
    print(GENERATORS[sys.argv[1]]())

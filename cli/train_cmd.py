"""``abps train``: run a federated method (or an image benchmark) for several seeds.

Clinical runs read a cohort directory (``abps etl`` / ``abps synth fedprox`` output), log
to MLflow (one parent run, one child per seed) and write results.json. A ``--config`` YAML
whose top level has ``benchmark: sage`` or ``benchmark: vv`` is handed to the image
benchmark runners instead (``federation.images.cli_run`` / ``federation.gossip.cli_run``).
"""

from __future__ import annotations

from pathlib import Path

import typer

from cli import project
from cli.app import app
from etl.errors import InputError
from etl.io import check_writable
from federation.core.limits import MAX_THREADS
from federation.method_catalog import METHOD_NAMES


def _parse_params(items: list[str]) -> dict[str, object]:
    import yaml

    out: dict[str, object] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise InputError(f"--param expects NAME=VALUE, got {item!r}")
        if name.strip() in out:  # one value per name: a second one is not silently the one applied
            raise InputError(f"--param {name.strip()}: given twice")
        try:
            out[name.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise InputError(f"--param {name.strip()}: value is not valid YAML") from None
    return out


#: the ``abps train`` options a benchmark config (``benchmark: sage | vv``) applies. Any other
#: option given is refused, not dropped.
_BENCHMARK_OPTIONS = frozenset({"config", "rounds", "seeds", "output", "force", "resume", "tracking_uri",
                                "experiment", "threads", "no_progress"})


def _refuse_unused(ctx: typer.Context, applies: frozenset[str], what: str) -> None:
    """Raise InputError naming the first option the user gave (command line or environment) that
    ``what`` does not apply, so no option is accepted and ignored."""
    for p in ctx.command.params:
        if p.name in applies or p.name is None:
            continue
        src = ctx.get_parameter_source(p.name)
        if getattr(src, "name", None) in ("COMMANDLINE", "ENVIRONMENT"):  # typer may ship its own click
            flag = max(p.opts, key=len) if getattr(p, "opts", None) else p.name
            raise InputError(f"{flag}: not used by {what}; drop it, or train a clinical method without the config")


@app.command(
    "train",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": False},
)
def train(
    ctx: typer.Context,
    method: str | None = typer.Option(
        None, "--method", help=f"registered method, in the ABPS paper's Table 1 order: {', '.join(METHOD_NAMES)}"),
    cohort: Path | None = typer.Option(
        None, "--cohort", help="directory with cohort.parquet + centers.parquet (default: the cohort of this "
        "project's most recent `abps etl`, recorded in .abps/state.json, else ./cohort)"),
    seeds: list[int] | None = typer.Option(None, "--seeds", help="seeds, e.g. --seeds 11 22 33 44 55 (default: 11; a benchmark config: its own seeds)"),
    config: Path | None = typer.Option(None, "--config", help="YAML run config (configs/<method>.yaml)"),
    rounds: int | None = typer.Option(None, "--rounds", min=1, help="override rounds (max rounds with early stopping)"),
    output: Path | None = typer.Option(
        None, "--output", parser=project.file_path, metavar="FILE", help="results.json path (default: results.json in a new folder named <method>-<UTC time> under runs/<experiment>/)"),
    force: bool = project.force_option(),
    resume: bool = typer.Option(
        False, "--resume", help="go on from the last checkpointed round of a stopped run (same options; its "
        "<output>.ckpt; without --output the newest checkpoint of this method under runs/<experiment>/)"),
    tracking_uri: str | None = project.tracking_uri_option(),
    experiment: str | None = typer.Option(
        None, "--experiment", help="MLflow experiment (default: MLFLOW_EXPERIMENT_NAME, else the cohort's folder name)"),
    no_progress: bool = typer.Option(False, "--no-progress", help="hide the progress bar"),
    threads: int = typer.Option(0, "--threads", min=0, max=MAX_THREADS,
                                 help=f"torch CPU threads (0 = torch default; at most {MAX_THREADS})"),
    param: list[str] | None = typer.Option(
        None, "--param", help="method parameter NAME=VALUE (YAML value), repeatable; e.g. --param goal=diversity"
    ),
    goal: str | None = typer.Option(
        None, "--goal", help="ABPS goal-aware filter: homogeneity | diversity | alignment. Without --method it "
        "runs the goal-aware preset abps-hom | abps-div | abps-align (ABPS+P+Q+kappa=1 with the goal's filter, "
        "as the ABPS paper runs the goals, Sec. 6.5); with an ABPS --method it sets that method's goal"
    ),
) -> None:
    """Train a method on a cohort for each seed; log to MLflow; write results.json.

    `abps train --goal diversity` alone trains the goal-aware ABPS preset on this project's cohort.
    """
    from federation.core.config import build_config, check_config_file, load_run_config

    seed_list = project.parse_seeds(seeds, list(ctx.args))
    file_cfg = load_run_config(config) if config is not None else None
    if file_cfg is not None and ("methods" in file_cfg or "datasets" in file_cfg):
        raise InputError(f"--config {config}: a sweep file (it lists `methods:`); run it with abps sweep --config {config}")
    if file_cfg is not None and "benchmark" in file_cfg:
        from federation.benchmark import get_benchmark

        name = str(file_cfg["benchmark"]).lower()
        bench = get_benchmark(name, config)
        _refuse_unused(ctx, _BENCHMARK_OPTIONS, f"a {name} benchmark config ({config})")
        # only what the user set overrides the benchmark config's own seeds / experiment; the
        # results file defaults to the config's `output`, else results.json as for clinical runs
        cfg_seeds = file_cfg.get("seeds")
        if cfg_seeds is not None and (not isinstance(cfg_seeds, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= project.MAX_SEED for x in cfg_seeds)):
            raise InputError(f"{config}: seeds must be a list of integers from 0 to {project.MAX_SEED}")
        if cfg_seeds is not None and len(set(cfg_seeds)) < len(cfg_seeds):  # as --seeds 0 0 is
            raise InputError(f"{config}: seeds: {next(x for x in cfg_seeds if cfg_seeds.count(x) > 1)} is listed twice")
        from federation.run.tracking import experiment_name

        experiment = experiment_name(experiment, "") or None
        tracking = file_cfg.get("tracking") if isinstance(file_cfg.get("tracking"), dict) else {}
        # runs/<experiment>/: the MLflow experiment the run logs to (a gossip config's tracking.experiment)
        where = experiment or str(file_cfg.get("experiment") or tracking.get("experiment") or name)
        label = str(file_cfg.get("name", config.stem))
        if resume and not (output or file_cfg.get("output")):  # the newest checkpoint of this config's runs
            output = project.latest_checkpointed_output(where, label)
        from federation.run.results import results_file

        # a folder (the config's `output: runs/NAME`) holds results.json: the file is what exists or not
        out_path = results_file(output or file_cfg.get("output") or project.run_output(where, label))
        check_writable(out_path, "--output")  # a folder is named as one before "exists; give --force"
        project.check_apart({"--output": out_path}, {"the run config": config}, tracking_uri)
        project.check_output(out_path, force)
        if threads:  # --threads works for the benchmarks too: it overrides the config's own thread key
            file_cfg = {**file_cfg, bench.threads_key: threads}
        try:  # a bad option of the file is refused before anything runs, naming the file
            bench.check(file_cfg, rounds, seed_list or None)
        except InputError as exc:
            raise InputError(f"{config}: {exc}") from None
        typer.echo(f"{name} benchmark {file_cfg.get('name', config.stem)}: running "
                   f"(per-round metrics go to MLflow as they come; results -> {out_path})")
        bench.run(file_cfg, rounds, seed_list or None, str(out_path), tracking_uri, experiment, resume=resume,
                  progress=not no_progress)
        typer.echo(f"{name} benchmark done -> {out_path}")
        return
    seed_list = seed_list or [project.DEFAULT_SEED]
    if method is None:
        method = str(file_cfg.get("method")) if file_cfg and file_cfg.get("method") else None
    if method is None and goal is not None:
        from federation.methods.registry import goal_preset

        method = goal_preset(goal)
        given = _parse_params(param or []).get("goal")
        if given is not None and str(given).strip().lower() != goal.strip().lower():
            raise InputError(f"--goal {goal}: --param goal={given} names another goal; give one of them")
        goal = None  # the preset is the goal's method
    if method is None:
        raise InputError("--method is required (or --goal, or a --config naming `method:`)")
    from federation.methods import get_method
    from federation.methods.registry import given_params, run_label
    from federation.run.runner import run_training
    from federation.run.tracking import experiment_name

    cls = get_method(method)
    if cohort is None:
        cohort = project.default_cohort()
        shown = project.shown_path(cohort)
        typer.echo(f"cohort: {shown} (this project's default; --cohort DIR for another)", err=True)
    experiment = experiment_name(experiment, Path(cohort).resolve().name)
    if goal is not None:
        if "goal" not in getattr(cls.Params, "model_fields", {}):
            raise InputError(f"--goal applies to the ABPS methods only, not {method!r}")
        given = _parse_params(param or []).get("goal")
        if given is not None and str(given).strip().lower() != goal.strip().lower():
            raise InputError(f"--goal {goal}: --param goal={given} names another goal; give one of them")
        param = [*(p for p in (param or []) if p.partition("=")[0].strip() != "goal"), f"goal={goal.strip().lower()}"]
    if file_cfg is not None:  # the file alone first: a bad key is reported with the file's name
        check_config_file(config, lambda: build_config(method, cls.default_config, file_cfg))
    if param:
        file_cfg = dict(file_cfg or {"method": method})
        file_cfg["params"] = {**(file_cfg.get("params") or {}), **_parse_params(param)}
    cfg = build_config(method, cls.default_config, file_cfg, rounds)
    cfg = cfg.model_copy(update={"params": given_params(cfg.method, cfg.params)})  # kappa 2 and 2.0: one run
    label = run_label(cfg.method, cfg.params)
    if resume and output is None:
        output = project.latest_checkpointed_output(experiment, label)
    output = output or project.run_output(experiment, label)
    project.check_apart({"--output": output}, {"the run config": config, "a file of the cohort folder": cohort},
                        tracking_uri)
    if threads:
        import torch

        torch.set_num_threads(threads)
    doc = run_training(cfg, cohort, seed_list, output=output, tracking_uri=tracking_uri, experiment=experiment,
                       progress=not no_progress, overwrite=force, resume=resume)
    from federation.run.runner import dropped_message

    note = dropped_message(doc.get("dropped_centers", {}), doc["n_centers"])
    if note:
        typer.echo(note, err=True)
    s = doc["summary"]

    n = doc["n_centers"]
    scored = min(r.get("n_scored_test", n - r["n_excluded_test"]) for r in doc["seeds"].values())
    need = max(r.get("min_scored_test", 1) for r in doc["seeds"].values())
    auroc = doc.get("metric", "auroc") == "auroc"
    what = "centers whose test split holds both classes" if auroc else "centers with test rows"

    def fmt(stat: dict) -> str:
        if stat["mean"] is None:
            return (f"undefined ({scored} of {n} {what}; a mean needs at least {need}: "
                    "evaluation: {min_centers, min_center_share} in a --config YAML)")
        if len(seed_list) == 1:   # one seed: no spread across seeds to show
            return f"{stat['mean']:.4f}"
        return f"{stat['mean']:.4f} +/- {stat['std']:.4f}"

    seeds_text = f"{len(seed_list)} seed" + ("s" if len(seed_list) != 1 else "")
    from federation.report.abps_table1 import isolation_cell

    rest = [r.get("method_summary", {}).get("rest_share_mean") for r in doc["seeds"].values()]
    rest = [x for x in rest if isinstance(x, (int, float))]
    iso = f", isolation {isolation_cell(sum(rest) / len(rest))}" if rest else ""  # centers resting, mean over rounds
    head = fmt(s["final_auroc_mean"])
    over = "" if s["final_auroc_mean"]["mean"] is None else f"; mean over the {scored} of {n} {what}"
    typer.echo(
        f"{label}: {'AUROC' if auroc else doc['metric']} {head} (across {seeds_text}{over}), "
        f"bandwidth {s['rel_bandwidth']['mean']:.2f}x FedAvg's {cfg.reference_rounds} rounds{iso} -> {output} "
        f"(MLflow experiment {experiment})"
    )
    from federation.core.evaluation import clinical_line

    defined = s["final_auroc_mean"]["mean"] is not None
    if (line := clinical_line(doc["seeds"], auroc_spread=defined)) is not None:
        typer.echo(line)
    from federation.core.limits import few_centers

    if defined and few_centers(scored, n):  # an undefined mean has said why in its own words
        typer.echo(f"warning: only {scored} of {n} centers have both classes in their test split; "
                   "the mean AUROC rests on few centers", err=True)
    _note_other_cohorts(tracking_uri, experiment, cohort)


def _note_other_cohorts(tracking_uri: str | None, experiment: str, cohort: Path) -> None:
    """One ``note:`` line when the experiment also holds finished runs on another cohort (two
    cohort folders of the same name share the default experiment): `abps runs` and the report
    show one cohort at a time."""
    from federation.data.load import federation_id
    from federation.run.store_read import open_store
    from federation.run.tracking import COHORT_TAG

    cid = federation_id(cohort)
    with open_store(tracking_uri) as store:
        eid = store.experiment_id(experiment)
        runs = store.finished_runs(eid) if eid is not None else []
    if any(r.data.tags.get(COHORT_TAG) not in (None, cid) for r in runs):
        typer.echo(f"note: experiment {experiment} also holds runs on another cohort; abps runs and abps report "
                   "show the latest run's cohort only: give each cohort its own --experiment", err=True)

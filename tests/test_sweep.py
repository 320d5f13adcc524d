"""`abps sweep`: cross-product expansion, config hashing, resume after a failure / kill, and identical
metrics on the local pool (1 and 2 workers) and on Ray."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from etl.errors import InputError
from federation import sweep as sw
from federation.core.config import RunConfig
from federation.data.synthetic import write_fedprox_cohort

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    return write_fedprox_cohort(tmp_path_factory.mktemp("sweep") / "cohort", n_centers=6, seed=3, mean_size=90.0,
                                shared=0.8)


def _spec(doc: dict) -> sw.SweepSpec:
    return sw.SweepSpec.model_validate(doc)


def test_canonical_json_and_config_hash_by_hand():
    assert sw.canonical_json({"b": 1, "a": [1, 2.5], "c": (1,), "d": {"y": None, "x": True}}) == \
        '{"a":[1,2.5],"b":1,"c":[1],"d":{"x":true,"y":null}}'
    with pytest.raises(ValueError):
        sw.canonical_json({"a": float("nan")})
    cfg = RunConfig(method="fedavg", rounds=3)
    # the measurement settings `targets` and `checkpoint` stay out of the hash (federation.core.config.config_hash)
    text = json.dumps({"cohort": "c0", "config": cfg.model_dump(mode="json", exclude={"targets", "checkpoint"})},
                      sort_keys=True, separators=(",", ":"))
    assert sw.config_hash(cfg, "c0") == hashlib.sha256(text.encode()).hexdigest()[:16]
    assert sw.config_hash(cfg, "c1") != sw.config_hash(cfg, "c0")
    assert sw.config_hash(RunConfig(method="fedavg", rounds=4), "c0") != sw.config_hash(cfg, "c0")
    # how often a run checkpoints itself is not what it computes
    assert sw.config_hash(RunConfig(method="fedavg", rounds=3, checkpoint={"every_rounds": 1}), "c0") == \
        sw.config_hash(cfg, "c0")


def test_cohort_id_is_content_based(cohort, tmp_path):
    h = hashlib.sha256()
    for name in ("cohort.parquet", "centers.parquet"):
        h.update(name.encode())
        h.update((cohort / name).read_bytes())
    assert sw.federation_id(cohort) == h.hexdigest()[:16]
    copy = tmp_path / "copy"
    shutil.copytree(cohort, copy)
    assert sw.federation_id(copy) == sw.federation_id(cohort)  # a moved cohort resumes the same cells
    with open(copy / "centers.parquet", "ab") as fh:
        fh.write(b"\0")
    assert sw.federation_id(copy) != sw.federation_id(cohort)
    with pytest.raises(InputError, match="cohort.parquet"):
        sw.federation_id(tmp_path)


def test_expand_cells_cross_product():
    spec = _spec({"name": "x", "seeds": [1, 2, 3], "rounds": 2,
                  "methods": ["fedavg", {"method": "abps", "label": "abps-div-goal", "params": {"goal": "diversity"}}],
                  "options": {"engine.local_epochs": [1, 2], "exchange.bf16_wire": [False, True]}})
    cells = sw.expand_cells(spec, CONFIGS, "c0")
    assert len(cells) == 2 * 2 * 2 * 3
    assert [c.index for c in cells] == list(range(24))
    first = cells[0]
    assert (first.label, first.seed) == ("fedavg[engine.local_epochs=1,exchange.bf16_wire=false]", 1)
    assert first.config.engine.local_epochs == 1 and first.config.exchange.bf16_wire is False
    assert first.config.rounds == 2
    last = cells[-1]
    assert last.label == "abps-div-goal[engine.local_epochs=2,exchange.bf16_wire=true]" and last.seed == 3
    assert last.config.params["goal"] == "diversity" and last.config.engine.local_epochs == 2
    assert last.config.exchange.bf16_wire is True
    # one hash per (entry, option values); seeds share it; all keys distinct
    assert len({c.config_hash for c in cells}) == 8
    # an option with one value applies to every cell and names no row
    one = _spec({"name": "y", "seeds": [1], "rounds": 2, "methods": ["fedavg", "abps"],
                 "options": {"evaluation.min_centers": [1], "engine.local_epochs": [1, 2]}})
    cells1 = sw.expand_cells(one, CONFIGS, "c0")
    assert [c.label for c in cells1] == ["fedavg[engine.local_epochs=1]", "fedavg[engine.local_epochs=2]",
                                         "abps[engine.local_epochs=1]", "abps[engine.local_epochs=2]"]
    assert all(c.config.evaluation.min_centers == 1 for c in cells1)
    assert all(c.options["evaluation.min_centers"] == 1 for c in cells1)
    assert len({c.key for c in cells}) == 24
    assert {c.seed for c in cells if c.config_hash == first.config_hash} == {1, 2, 3}
    # seeds / rounds overrides
    assert len(sw.expand_cells(spec, CONFIGS, "c0", rounds=5, seeds=[7])) == 8


def test_entry_config_file_and_key_order_do_not_change_the_hash(tmp_path):
    (tmp_path / "a.yaml").write_text("method: abps\nparams: {kappa: 2, epsilon: 0.2}\nexchange: {head_layers: 1}\n")
    (tmp_path / "b.yaml").write_text("exchange: {head_layers: 1}\nparams: {epsilon: 0.2, kappa: 2}\nmethod: abps\n")
    ca = sw.expand_cells(_spec({"methods": [{"method": "abps", "config": "a.yaml"}], "seeds": [1]}), tmp_path, "c")
    cb = sw.expand_cells(_spec({"methods": [{"method": "abps", "config": "b.yaml"}], "seeds": [1]}), tmp_path, "c")
    assert ca[0].config.params["kappa"] == 2 and ca[0].config.exchange.head_layers == 1
    assert ca[0].config_hash == cb[0].config_hash
    # the presets in configs/ equal the built-in defaults, so naming the file or not is the same cell
    cp = sw.expand_cells(_spec({"methods": [{"method": "abps-x", "config": "abps-x.yaml"}], "seeds": [1]}), CONFIGS, "c")
    cd = sw.expand_cells(_spec({"methods": ["abps-x"], "seeds": [1]}), CONFIGS, "c")
    assert cp[0].config_hash == cd[0].config_hash


def test_sweep_files_load():
    spec, base = sw.load_sweep(CONFIGS / "table1.yaml")
    cells = sw.expand_cells(spec, base, "c")
    # the paper's rows (20 with the centralized reference) + the random-partners ablation:
    # Table 1 sweep; abps-drift and the SAGE selector are in table1-extras.yaml
    from federation.methods.registry import paper_order

    labels = list(dict.fromkeys(c.label for c in cells))
    assert len(paper_order()) == 20 and len(cells) == 21 * 5
    assert [x for x in labels if x != "random-partners"] == list(paper_order()) and "random-partners" in labels
    assert all(c.config.max_rounds == (100 if c.config.early_stopping.enabled else 50) for c in cells)
    extras, base_x = sw.load_sweep(CONFIGS / "table1-extras.yaml")
    cells_x = sw.expand_cells(extras, base_x, "c")
    assert [e.method for e in extras.methods] == ["abps-drift", "sage"] and len(cells_x) == 2 * 5
    assert (extras.experiment, extras.seeds, extras.resources) == (spec.experiment, spec.seeds, spec.resources)
    spec, base = sw.load_sweep(CONFIGS / "demo.yaml")
    cells = sw.expand_cells(spec, base, "c")
    assert [c.label for c in cells[::2]] == ["fedavg", "abps", "abps-x", "abps-div"]
    assert all(c.config.max_rounds == spec.rounds for c in cells)


def test_bad_sweep_files(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("methods: [fedavg, fedavg]\n")
    with pytest.raises(InputError, match="label 'fedavg' appears twice"):
        sw.load_sweep(p)
    p.write_text("methods: [fedavg]\nseeds: [1, 1]\n")
    with pytest.raises(InputError, match="seeds"):
        sw.load_sweep(p)
    p.write_text("methods: [{method: fedavg, label: '  '}]\n")
    with pytest.raises(InputError, match=r"invalid sweep field methods.0.label: an empty label"):
        sw.load_sweep(p)
    p.write_text("methods: [fedavg]\nengine: ray\n")  # renamed
    with pytest.raises(InputError, match="`engine:` .* is now called `executor:`"):
        sw.load_sweep(p)
    with pytest.raises(InputError, match="methods: unknown method"):
        sw.expand_cells(_spec({"methods": ["nosuch"]}), tmp_path, "c")
    with pytest.raises(InputError, match="sweep entry 'fedavg' engine.lr=-1.*engine.lr"):
        sw.expand_cells(_spec({"methods": ["fedavg"], "options": {"engine.lr": [-1]}}), tmp_path, "c")
    # a setting the entry's method would not apply names the entry (the server-based fedavg takes it)
    with pytest.raises(InputError, match=r"^sweep entry 'abps' realworld.deadline.policy=fixed: abps: "
                                         r"realworld.deadline.policy 'fixed' is not used"):
        sw.expand_cells(_spec({"methods": ["fedavg", "abps"], "options": {"realworld.deadline.policy": ["fixed"]}}),
                        tmp_path, "c")


def test_a_sweep_file_reads_its_paths_from_its_own_folder(tmp_path, monkeypatch):
    """`cohort:`, `checkpoints:` and `config:` are read from the sweep file's folder whichever
    folder the sweep is started from; a missing preset names the entry and where it was looked for."""
    sub = tmp_path / "study"
    sub.mkdir()
    (sub / "s.yaml").write_text("methods: [{method: abps, config: presets/a.yaml}]\ncohort: coh\n"
                                "checkpoints: ck\nseeds: [1]\n")
    (sub / "presets").mkdir()
    (sub / "presets" / "a.yaml").write_text("params: {kappa: 3}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    spec, base = sw.load_sweep(Path("..") / "study" / "s.yaml")
    assert (spec.cohort, spec.checkpoints, base) == (str(sub / "coh"), str(sub / "ck"), sub)
    assert sw.expand_cells(spec, base, "c")[0].config.params["kappa"] == 3
    (sub / "s.yaml").write_text("methods: [{method: abps, config: abps.yaml}]\ncohort: /abs/coh\nseeds: [1]\n")
    spec, base = sw.load_sweep(sub / "s.yaml")
    assert spec.cohort == "/abs/coh"
    with pytest.raises(InputError, match=r"entry 'abps': config abps.yaml not found at .*study/abps.yaml "
                                         r"\(a relative `config:` is read from the sweep file's folder\)"):
        sw.expand_cells(spec, base, "c")
    # the run-config paths an entry's overrides or an option set are read from there too
    (sub / "s.yaml").write_text("methods:\n- {method: fedavg, overrides: {realworld: {availability: "
                                "{kind: trace, trace: t.csv}}}}\n- {method: abps, overrides: {realworld: "
                                "{profiles: {file: /abs/p.csv}}}}\noptions: {realworld.availability.trace: "
                                "[u.csv, ~/v.csv]}\nseeds: [1]\n")
    spec, _ = sw.load_sweep(Path("..") / "study" / "s.yaml")
    assert spec.methods[0].overrides["realworld"]["availability"] == {"kind": "trace", "trace": str(sub / "t.csv")}
    assert spec.methods[1].overrides["realworld"]["profiles"]["file"] == "/abs/p.csv"
    assert spec.options["realworld.availability.trace"] == [str(sub / "u.csv"), str(Path("~/v.csv").expanduser())]
    (sub / "s.yaml").write_text("methods: [fedavg]\noptions: {realworld: [{availability: {kind: trace, trace: t.csv}, "
                                "round_period_s: 60}], realworld.profiles: [{file: p.csv}]}\nseeds: [1]\n")
    spec, _ = sw.load_sweep(Path("..") / "study" / "s.yaml")
    assert spec.options["realworld"] == [{"availability": {"kind": "trace", "trace": str(sub / "t.csv")},
                                          "round_period_s": 60}]
    assert spec.options["realworld.profiles"] == [{"file": str(sub / "p.csv")}]
    with pytest.raises(InputError, match=r"^sweep entry 'fedavg' realworld=.*: realworld.availability.trace "
                                         r".*study/t.csv: file not found$"):
        sw.expand_cells(spec, sub, "c")  # before any cell runs
    (sub / "t.csv").write_text("center,start,end\n")
    with pytest.raises(InputError, match=r"realworld.profiles.file .*study/p.csv: file not found$"):
        sw.expand_cells(spec, sub, "c")


def test_a_finished_run_under_another_label_is_named_not_run_again(cohort, tmp_path, capsys):
    from cli.app import main

    uri = f"sqlite:///{tmp_path}/m.db"
    doc = {"name": "a", "experiment": "relabel", "seeds": [1], "rounds": 1, "methods": ["fedavg"]}
    first = sw.run_sweep(_spec(doc), CONFIGS, cohort, tracking_uri=uri, progress=False)
    assert len(first.ran) == 1 and first.relabeled == []
    f = tmp_path / "b.yaml"
    f.write_text("name: b\nexperiment: relabel\nseeds: [1]\nrounds: 1\n"
                 "methods: [{method: fedavg, label: fedavg-renamed}, fedprox]\n")
    main(["sweep", "--config", str(f), "--cohort", str(cohort), "--tracking-uri", uri, "--no-progress"])
    err = capsys.readouterr().err
    assert ("note: row 'fedavg-renamed' seed 1 is the finished run 'fedavg' of this experiment (the same run "
            "config); it is not run again, and reports show it as 'fedavg'") in err
    assert "'fedprox'" not in err  # a new row: run, no note


def _cell_runs(client, exp_id):
    return client.search_runs([exp_id], "tags.`abps.kind` = 'cell'", max_results=1000)


def test_resume_after_failure_and_kill(cohort, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/ml.db"
    spec = _spec({"name": "resume", "seeds": [1, 2], "rounds": 2, "methods": ["fedavg", "abps"]})
    real = sw.cells.run_cell
    calls: list[tuple[str, int]] = []

    def failing(config, cohort_dir, seed, threads=1, **checkpoint):
        calls.append((config["method"], seed))
        if config["method"] == "abps" and seed == 2:
            raise RuntimeError("simulated crash")
        return real(config, cohort_dir, seed, threads, **checkpoint)

    monkeypatch.setattr(sw.cells, "run_cell", failing)
    out1 = sw.run_sweep(spec, CONFIGS, cohort, tracking_uri=uri, progress=False)
    assert len(out1.ran) == 3 and len(out1.failed) == 1
    assert "simulated crash" in next(iter(out1.failed.values()))
    client = MlflowClient(uri)
    assert client.get_run(out1.parent_run_id).info.status == "FAILED"
    missing = next(iter(out1.failed))

    # a sweep killed while logging this cell leaves a RUNNING, half-written run behind
    stale = client.create_run(out1.experiment_id, tags={"abps.kind": "cell", "abps.config_hash": missing[0],
                                                       "seed": str(missing[1]), "method": "abps"})
    client.log_metric(stale.info.run_id, "test_auroc_mean", 0.5, step=1)

    calls.clear()
    monkeypatch.setattr(sw.cells, "run_cell",
                        lambda c, d, s, t=1, **k: (calls.append((c["method"], s)), real(c, d, s, t, **k))[1])
    out2 = sw.run_sweep(spec, CONFIGS, cohort, tracking_uri=uri, progress=False)
    assert calls == [("abps", 2)]  # only the missing cell is computed
    assert sorted(out2.skipped) == sorted(k for k in (c.key for c in out2.cells) if k != missing)
    assert out2.parent_run_id == out1.parent_run_id  # the same parent run holds every cell
    assert client.get_run(out2.parent_run_id).info.status == "FINISHED"
    assert client.get_run(stale.info.run_id).info.status == "KILLED"
    runs = _cell_runs(client, out1.experiment_id)
    finished = [r for r in runs if r.info.status == "FINISHED"]
    keys = [(r.data.tags["abps.config_hash"], int(r.data.tags["seed"])) for r in finished]
    assert len(finished) == 4 and len(set(keys)) == 4  # no duplicates
    assert all(r.data.tags["mlflow.parentRunId"] == out1.parent_run_id for r in finished)
    # each cell records which engine step computed it (fused kernels and eager differ in rounding)
    from federation.engine import kernels
    assert {r.data.tags["abps.engine_step"] for r in finished} == {kernels.step_name()}
    # every cell logs the clinical figures, as abps train does (metrics and the per-center table)
    for r in finished:
        assert any(k.startswith("clin_brier") for k in r.data.metrics), sorted(r.data.metrics)
        assert "clinical_per_center.csv" in {a.path for a in client.list_artifacts(r.info.run_id)}
    # the resumed cell equals a direct computation
    cell = next(c for c in out2.cells if c.key == missing)
    direct = real(cell.config.model_dump(mode="json"), str(cohort), 2)
    assert out2.summaries[missing]["final_auroc_mean"] == direct["summary"]["final_auroc_mean"]

    # every cell run shares the same param keys (missing ones logged as "none") for the compare view
    params = [r.data.params for r in finished]
    assert len({tuple(sorted(p)) for p in params}) == 1
    fed = next(p for r, p in zip(finished, params) if r.data.tags["method"] == "fedavg")
    assert fed["params.kappa"] == "none" and fed["method"] == "fedavg" and fed["rounds"] == "2"

    calls.clear()
    out3 = sw.run_sweep(spec, CONFIGS, cohort, tracking_uri=uri, progress=False)
    assert calls == [] and not out3.ran and len(out3.skipped) == 4


def test_interrupted_logging_leaves_no_finished_run(cohort, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/ml.db"
    spec = _spec({"name": "halfway", "seeds": [1], "rounds": 2, "methods": ["fedavg"]})
    from federation.run.tracking import Tracker

    real_log = Tracker.log_json

    def boom(self, obj, name):
        if name == "config.json":
            raise KeyboardInterrupt  # killed after metrics and per_center.json, before config.json
        real_log(self, obj, name)

    monkeypatch.setattr(Tracker, "log_json", boom)
    with pytest.raises(KeyboardInterrupt):
        sw.run_sweep(spec, CONFIGS, cohort, tracking_uri=uri, progress=False)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("halfway")
    (run,) = _cell_runs(client, exp.experiment_id)
    assert run.info.status == "FAILED" and "final_auroc_mean" in run.data.metrics
    monkeypatch.setattr(Tracker, "log_json", real_log)
    out = sw.run_sweep(spec, CONFIGS, cohort, tracking_uri=uri, progress=False)
    assert len(out.ran) == 1
    statuses = sorted(r.info.status for r in _cell_runs(client, exp.experiment_id))
    assert statuses == ["FAILED", "FINISHED"]


def _histories(client, exp_id):
    out = {}
    for r in _cell_runs(client, exp_id):
        key = (r.data.tags["abps.label"], r.data.tags["seed"])
        out[key] = {m: [(h.step, h.value) for h in sorted(client.get_metric_history(r.info.run_id, m),
                                                          key=lambda h: h.step)]
                    for m in ("test_auroc_mean", "val_auroc_mean", "cum_bytes", "final_auroc_mean")}
        out[key]["params"] = dict(r.data.params)
    return out


def test_local_and_ray_engines_and_worker_counts_give_identical_metrics(cohort, tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/ml.db"
    spec = _spec({"name": "engines", "seeds": [1, 2], "rounds": 2, "methods": ["fedavg", "abps-x"]})
    got = {}
    for engine, workers in (("local", 1), ("local", 2), ("ray", 2)):
        exp = f"engines-{engine}-{workers}"
        out = sw.run_sweep(spec, CONFIGS, cohort, executor=engine, workers=workers, tracking_uri=uri,
                           experiment=exp, progress=False)
        assert len(out.ran) == 4 and not out.failed
        client = MlflowClient(uri)
        got[(engine, workers)] = _histories(client, out.experiment_id)
    ref = got[("local", 1)]
    assert len(ref) == 4 and all(len(v["test_auroc_mean"]) == 2 for v in ref.values())
    assert ref[("fedavg", "1")] != ref[("fedavg", "2")]  # the seed matters
    for k, v in got.items():
        assert v == ref, k


def test_a_local_ray_that_times_out_at_startup_is_started_again():
    """Ray waits a fixed 30 s for its raylet; on busy cores that can fail once (seen under a
    parallel test run): the local start is tried again after a shutdown; other errors are not."""
    from federation.sweep.executors import start_local_ray

    class FakeRay:
        def __init__(self, errors):
            self.errors, self.calls = list(errors), []

        def init(self, **kwargs):
            self.calls.append(("init", kwargs["num_cpus"]))
            if self.errors:
                raise self.errors.pop(0)

        def shutdown(self):
            self.calls.append(("shutdown", None))

    timeout = Exception("The current node timed out during startup. This could happen because ...")
    gcs = RuntimeError("Timed out waiting for file /tmp/ray/session_x/gcs_server_port_ab12")
    ray = FakeRay([timeout])
    start_local_ray(ray, 2)
    assert ray.calls == [("init", 2), ("shutdown", None), ("init", 2)]
    ray = FakeRay([gcs, timeout])
    start_local_ray(ray, 2)
    assert [c[0] for c in ray.calls] == ["init", "shutdown", "init", "shutdown", "init"]
    ray = FakeRay([timeout, gcs, timeout])
    with pytest.raises(Exception, match="timed out during startup"):
        start_local_ray(ray, 2)
    assert [c[0] for c in ray.calls] == ["init", "shutdown", "init", "shutdown", "init"]
    ray = FakeRay([ValueError("num_cpus")])
    with pytest.raises(ValueError):
        start_local_ray(ray, 2)
    assert ray.calls == [("init", 2)]


def test_executor_key(tmp_path):
    p = tmp_path / "s.yaml"  # the old `engine:` key is refused in test_bad_sweep_files
    p.write_text("methods: [fedavg]\nexecutor: ray\nworkers: 3\n")
    spec, _ = sw.load_sweep(p)
    assert spec.executor == "ray" and spec.workers == 3
    # `engine:` inside an entry's overrides is the run config's model / optimizer section, as before
    spec = _spec({"methods": [{"method": "fedavg", "overrides": {"engine": {"lr": 0.01}}}], "seeds": [1]})
    assert sw.expand_cells(spec, CONFIGS, "c")[0].config.engine.lr == 0.01


def test_sweep_artifacts_are_strict_json_and_runs_show_compute_time(cohort, tmp_path, monkeypatch):
    """One writer (federation.run.tracking.Tracker): NaN becomes null in sweep artifacts, as in
    results.json; a cell run's start / end times are those of its computation, not of the logging;
    per-round metrics carry the time their round ended."""
    import time

    from mlflow.tracking import MlflowClient

    real = sw.cells.run_cell
    seen = {}

    def slow_nan(config, cohort_dir, seed, threads=1, **checkpoint):
        res = real(config, cohort_dir, seed, threads, **checkpoint)
        first = next(iter(res["per_center"]))
        res["per_center"][first]["test_auroc"] = float("nan")  # a one-class test split
        seen.update(res)
        time.sleep(1.0)  # the driver logs well after the work ended
        return res

    monkeypatch.setattr(sw.cells, "run_cell", slow_nan)
    uri = f"sqlite:///{tmp_path}/ml.db"
    spec = _spec({"name": "strict", "seeds": [1], "rounds": 2, "methods": ["fedavg"]})
    out = sw.run_sweep(spec, CONFIGS, cohort, tracking_uri=uri, progress=False)
    client = MlflowClient(uri)
    rid = next(iter(out.ran.values()))
    path = client.download_artifacts(rid, "per_center.json", str(tmp_path))
    text = Path(path).read_text()
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert "NaN" not in text and doc[next(iter(doc))]["test_auroc"] is None
    run = client.get_run(rid)
    assert run.info.start_time == seen["started_ms"] and run.info.end_time == seen["ended_ms"]
    hist = sorted(client.get_metric_history(rid, "test_auroc_mean"), key=lambda m: m.step)
    assert [m.timestamp for m in hist] == seen["round_ms"]
    assert client.get_run(out.parent_run_id).data.tags["abps.executor"] == "local x1"


def test_a_running_sweep_logs_rounds_live(cohort, tmp_path, monkeypatch):
    """While a cell runs, its run exists (RUNNING) and already holds the finished rounds."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/ml.db"
    seen: list[tuple[str, int]] = []
    real_event = sw.log.CellLog.event

    def spy(self, kind, cell, payload):
        real_event(self, kind, cell, payload)
        if kind == "round":
            client = MlflowClient(uri)
            rid = self.open[cell.key][0]
            run = client.get_run(rid)
            steps = sorted(m.step for m in client.get_metric_history(rid, "val_auroc_mean"))
            seen.append((run.info.status, steps[-1]))

    monkeypatch.setattr(sw.log.CellLog, "event", spy)
    spec = _spec({"name": "live", "seeds": [1], "rounds": 3, "methods": ["fedavg"]})
    out = sw.run_sweep(spec, CONFIGS, cohort, tracking_uri=uri, progress=False)
    assert seen == [("RUNNING", 1), ("RUNNING", 2), ("RUNNING", 3)]
    assert MlflowClient(uri).get_run(next(iter(out.ran.values()))).info.status == "FINISHED"


def test_engine_option_is_renamed(tmp_path, capsys):
    from cli.app import main

    p = tmp_path / "s.yaml"
    p.write_text("methods: [fedavg]\n")
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--config", str(p), "--engine", "ray", "--cohort", str(tmp_path)])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == "error: --engine is now called --executor (local or ray)"


def test_longest_expected_cells_go_first():
    """The pool / Ray get the cells longest-expected-first (LPT); ties keep the sweep's order."""
    from federation.methods import get_method
    from federation.sweep.schedule import FIXED_SECONDS

    spec, base = sw.load_sweep(CONFIGS / "table1.yaml")
    cells = sw.expand_cells(spec, base, "c")
    order = sw.longest_first(cells)
    assert sorted(c.index for c in order) == list(range(len(cells)))
    assert [c.method for c in order[:5]] == ["bnn-fl"] * 5 and [c.seed for c in order[:5]] == spec.seeds
    costs = [sw.expected_seconds(c) for c in order]
    assert costs == sorted(costs, reverse=True)
    fedavg = next(c for c in cells if c.method == "fedavg")
    assert sw.expected_seconds(fedavg) == FIXED_SECONDS + 50 * 0.55 == FIXED_SECONDS + 50 * get_method("fedavg").seconds_per_round
    es = next(c for c in cells if c.method == "fedavg-x")  # early stopping, at most 100 rounds: 50 expected
    assert sw.expected_seconds(es) == FIXED_SECONDS + 50 * 0.70
    extras, base_x = sw.load_sweep(CONFIGS / "table1-extras.yaml")
    assert sw.longest_first(sw.expand_cells(extras, base_x, "c"))[0].method == "sage"


def test_cell_order_on_the_pool_changes_no_number(cohort):
    """Cells are pure functions: a shuffled order on the 2-process pool (workers reused across cells)
    gives the same summaries and histories as the longest-first order."""
    import random

    from federation.sweep.executors import run_pool

    spec = _spec({"seeds": [1, 2], "rounds": 2, "methods": ["fedavg", "abps-x", "fedprox"]})
    cells = sw.expand_cells(spec, CONFIGS, "c")
    shuffled = list(cells)
    random.Random(5).shuffle(shuffled)
    assert [c.index for c in shuffled] != [c.index for c in sw.longest_first(cells)]
    got = []
    for order in (sw.longest_first(cells), shuffled):
        res = {c.index: p["result"] for kind, c, p in run_pool(order, str(cohort), 1, 2, lambda n: None)
               if kind == "done"}
        assert sorted(res) == list(range(len(cells))) and all(r is not None for r in res.values())
        # JSON text: a one-class center's NaN figures compare equal as text (NaN != NaN as floats)
        got.append({i: json.dumps([r["summary"], r["history"], r["per_center"]], sort_keys=True)
                    for i, r in res.items()})
    assert got[0] == got[1]
    assert got[0][0] != got[0][1]  # fedavg seed 1 vs seed 2: the seed matters


def test_table1_benchmark_reports_cell_seconds_by_row(cohort, capsys):
    """benchmarks/bench_table1.py on a tiny reduced sweep: the JSON carries each row's mean seconds
    inside the workers and the line says the run is reduced (not the target's workload)."""
    from benchmarks import bench_table1

    doc = bench_table1.main(["--cohort", str(cohort), "--methods", "fedavg,local", "--seeds", "1",
                             "--rounds", "1", "--workers", "1"])
    assert doc["cells"] == doc["ran"] == 2 and doc["failed"] == 0 and doc["reduced"]
    assert sorted(doc["cell_s_mean_by_row"]) == ["fedavg", "local"]
    assert doc["cell_s_total"] == pytest.approx(sum(doc["cell_s_mean_by_row"].values()))
    assert 0 < doc["cell_s_total"] <= doc["wall_s"] and doc["target_min"] == 30.0
    assert "REDUCED run, not the target workload" in capsys.readouterr().out


@pytest.mark.parametrize("name, methods, seeds, rounds", [
    ("era", ["fedavg", "feddyn", "abps-x", "abps"], [11, 22, 33, 44, 55], 100),
    ("heterogeneity", ["fedavg", "fedavg-x", "abps-x", "local"], [11, 22, 33], 50)])
def test_fidelity_sweep_files_expand_to_their_studies(name, methods, seeds, rounds):
    from federation.core.config import load_yaml

    spec = sw.SweepSpec.model_validate(load_yaml(CONFIGS / f"{name}.yaml"))
    cells = sw.expand_cells(spec, CONFIGS, "c0")
    assert len(cells) == len(methods) * len(seeds)
    assert [c.config.method for c in cells[::len(seeds)]] == methods
    assert {c.seed for c in cells} == set(seeds) and {c.config.max_rounds for c in cells} == {rounds}


def test_a_pool_sweep_says_a_data_warning_once_in_one_line(tmp_path):
    import subprocess
    import sys

    small = write_fedprox_cohort(tmp_path / "small", n_centers=4, seed=1, mean_size=60.0)  # one center < 30 train rows
    (tmp_path / "s.yaml").write_text("name: w\nseeds: [1, 2]\nrounds: 1\nmethods: [fedavg]\nworkers: 2\n")
    p = subprocess.run([sys.executable, "-c", "from cli.app import main; main()", "sweep", "--config",
                        str(tmp_path / "s.yaml"), "--cohort", str(small), "--tracking-uri",
                        f"sqlite:///{tmp_path}/m.db", "--no-progress"], capture_output=True, text=True, timeout=600,
                       cwd=Path(__file__).resolve().parents[1])
    assert p.returncode == 0, p.stderr[-1500:]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert [ln for ln in lines if "per-center preprocessing" in ln] == [lines[0]] and lines[0].startswith("warning: ")
    assert not [ln for ln in lines if "Warning:" in ln or ln.startswith("  ")], p.stderr  # no raw Python warning

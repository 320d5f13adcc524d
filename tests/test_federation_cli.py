"""End to end: `abps synth fedprox`, `abps train` (results.json + MLflow), presets, errors, dispatch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cli.synth_fedprox_cmd  # noqa: F401  (registers `abps synth fedprox`)
import cli.train_cmd  # noqa: F401
from cli.app import main
from federation.core.config import build_config, load_yaml
from federation.methods import get_method
from federation.methods.baselines import BASELINES

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "cohort"
    main(["synth", "fedprox", "--out", str(out), "--centers", "6", "--seed", "3", "--mean-size", "90",
          "--shared", "0.8"])
    return out


@pytest.fixture(scope="module")
def ml_uri(tmp_path_factory):
    """One sqlite store for the module (creating its schema is the slow part of MLflow)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/ml.db"


def test_train_fedavg_writes_results_and_mlflow(cohort, tmp_path, ml_uri):
    from mlflow.tracking import MlflowClient

    uri = ml_uri
    out = tmp_path / "res" / "results.json"
    main(["train", "--method", "fedavg", "--cohort", str(cohort), "--seeds", "11", "22", "--rounds", "3",
          "--output", str(out), "--tracking-uri", uri, "--experiment", "t", "--no-progress"])
    doc = json.loads(out.read_text())
    assert set(doc["seeds"]) == {"11", "22"}
    for s in doc["seeds"].values():
        assert {"final_auroc_mean", "final_auroc_std", "total_bytes", "rel_bandwidth", "rounds_run"} <= set(s)
        assert s["rounds_run"] == 3 and s["rel_bandwidth"] == pytest.approx(3 / 50)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("t")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(parents) == 1 and len(children) == 2
    child = children[0]
    assert child.data.params["engine.lr"] == "0.001" and child.data.params["method"] == "fedavg"
    from federation.engine import kernels
    assert child.data.tags["abps.engine_step"] == kernels.step_name()  # which step computed it
    import torch

    # where it was computed: SIMD level, CPU, library versions; the kernel build on the fused step
    tags = child.data.tags
    assert tags["abps.platform.cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert tags["abps.platform.engine_step"] == kernels.step_name() and tags["abps.platform.cpu"]
    assert f"torch={torch.__version__}" in tags["abps.platform.versions"]
    if kernels.step_name() == "fused":
        assert "-march=" in tags["abps.platform.kernel_flags"] and tags["abps.platform.kernel_compiler"]
    assert parents[0].data.tags["abps.platform.cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    for key in ("val_auroc_mean", "test_auroc_mean", "val_auroc_std", "cum_bytes", "rel_bandwidth"):
        assert key in child.data.metrics
    hist = client.get_metric_history(child.info.run_id, "cum_bytes")
    assert sorted(m.step for m in hist) == [1, 2, 3]
    arts = {a.path for a in client.list_artifacts(child.info.run_id)}
    assert {"per_center.json", "config.json"} <= arts
    per_center = json.loads(Path(client.download_artifacts(child.info.run_id, "per_center.json", str(tmp_path)))
                            .read_text())
    assert len(per_center) == 6 and all("|" in k for k in per_center)
    text = json.dumps(per_center)
    assert "stay_id" not in text and "subject_id" not in text
    assert "results.json" in {a.path for a in client.list_artifacts(parents[0].info.run_id)}


def test_unknown_method_exits_2_listing_names(cohort, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--method", "nope", "--cohort", str(cohort), "--no-progress"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fedavg" in err and "moon" in err


def test_presets_validate_and_match_builtin_defaults():
    for cls in BASELINES:
        file_cfg = load_yaml(CONFIGS / f"{cls.name}.yaml")
        from_file = build_config(cls.name, get_method(cls.name).default_config, file_cfg)
        builtin = build_config(cls.name, cls.default_config, None, rounds=from_file.rounds)

        def norm(c):
            return c.model_copy(update={"params": cls.Params.model_validate(c.params).model_dump()})

        assert norm(from_file) == norm(builtin), cls.name


def test_benchmark_config_dispatches(tmp_path, monkeypatch):
    from federation.benchmark import BENCHMARKS

    seen = {}
    monkeypatch.setattr(BENCHMARKS["vv"], "run",
                        lambda config, rounds, seeds, output, uri, exp, resume=False, progress=False:
                        seen.update(config=config, seeds=seeds, rounds=rounds, progress=progress))
    cfg = tmp_path / "vv.yaml"
    cfg.write_text("benchmark: vv\nsimulation: {ticks: 4}\n")
    main(["train", "--config", str(cfg), "--seeds", "1", "2", "--rounds", "5"])
    assert seen == {"config": {"benchmark": "vv", "simulation": {"ticks": 4}}, "seeds": [1, 2], "rounds": 5,
                    "progress": True}
    main(["train", "--config", str(cfg), "--rounds", "5", "--no-progress", "--force"])
    assert seen["progress"] is False
    cfg.write_text("benchmark: vv\nnodes: 4\n")  # checked before it runs: one line naming the file
    seen.clear()
    with pytest.raises(SystemExit) as exc:
        main(["train", "--config", str(cfg), "--rounds", "5"])
    assert exc.value.code == 2 and seen == {}


def test_a_benchmark_config_runs_again_and_a_folder_output_holds_results_json(tmp_path, monkeypatch, capsys):
    """A gossip preset runs twice (a new folder under runs/<its MLflow experiment>/ each time); a
    config's `output: FOLDER` is the folder of results.json, refused when that file exists unless --force."""
    from federation.benchmark import BENCHMARKS
    from federation.run.results import results_file, write_results

    outputs = []

    def fake_run(config, rounds, seeds, output, uri, exp, resume=False, progress=False):
        outputs.append(Path(output))
        write_results(results_file(output), {"rounds": rounds})

    monkeypatch.setattr(BENCHMARKS["vv"], "run", fake_run)
    monkeypatch.chdir(tmp_path)
    preset = CONFIGS / "vv-fmnist.yaml"
    for _ in range(2):
        main(["train", "--config", str(preset), "--rounds", "3", "--no-progress"])
    assert len(set(outputs)) == 2 and all(o.name == "results.json" and o.exists() for o in outputs)
    assert {o.parent.parent for o in outputs} == {Path("runs") / "vv-fmnist"}  # tracking.experiment
    cfg = tmp_path / "vv.yaml"
    cfg.write_text("benchmark: vv\nname: tiny\nsimulation: {ticks: 4}\noutput: out\n")
    main(["train", "--config", str(cfg), "--no-progress"])
    assert outputs[-1] == Path("out") / "results.json"
    before = (tmp_path / "out" / "results.json").read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["train", "--config", str(cfg), "--rounds", "2", "--no-progress"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "results.json exists; give --force" in err
    assert (tmp_path / "out" / "results.json").read_bytes() == before
    main(["train", "--config", str(cfg), "--rounds", "2", "--no-progress", "--force"])
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == {"rounds": 2}


def test_param_option_reaches_the_method_config(cohort, tmp_path, ml_uri):
    out = tmp_path / "r.json"
    main(["train", "--method", "fedprox", "--cohort", str(cohort), "--seeds", "5", "--rounds", "1",
          "--param", "mu=0.5", "--output", str(out), "--tracking-uri", ml_uri, "--experiment", "t2",
          "--no-progress"])
    doc = json.loads(out.read_text())
    assert doc["config"]["params"] == {"mu": 0.5}
    with pytest.raises(SystemExit) as exc:
        main(["train", "--method", "fedprox", "--cohort", str(cohort), "--param", "mu", "--no-progress"])
    assert exc.value.code == 2

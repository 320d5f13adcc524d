"""The cross runs from the CLI: `abps train` on an image federation, `abps sweep` on a cross
sweep file (a synthetic clinical cohort and a 3-client Fashion-MNIST federation), `abps report`'s
cross table checked against the ledger's arithmetic."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import cli.report_cmd  # noqa: F401  (registers `abps report`)
import cli.sweep_cmd  # noqa: F401
import cli.synth_fedprox_cmd  # noqa: F401
import cli.train_cmd  # noqa: F401
from cli.app import main
from etl.errors import InputError
from etl.images import FASHION_MNIST_DIR

pytestmark = pytest.mark.skipif(not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
                                reason="Fashion-MNIST not installed at /usr/share/datasets/fashion-mnist")

FULL = 220_411  # parameters of one SAGE Fashion-MNIST model (tests/test_cross_images.py)


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cross")
    clin = root / "clin"
    main(["synth", "fedprox", "--out", str(clin), "--centers", "4", "--seed", "3", "--mean-size", "80"])
    fm = root / "fm"
    fm.mkdir()
    (fm / "images.yaml").write_text("n_clients: 3\nalpha_dir: 0.1\ntrain_samples: 900\n")
    return clin, fm


def test_train_on_an_image_federation(sets: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    import cli.runs_cmd  # noqa: F401  (registers `abps runs`)

    _, fm = sets
    out = tmp_path / "results.json"
    main(["train", "--method", "sage", "--cohort", str(fm), "--rounds", "1", "--seeds", "4",
          "--param", "selector=rg", "--output", str(out), "--tracking-uri",
          f"sqlite:///{tmp_path}/ml.db", "--no-progress"])
    doc = json.loads(out.read_text())
    assert doc["metric"] == "accuracy" and doc["n_centers"] == 3
    seed = doc["seeds"]["4"]
    # RG: every client takes one random neighbour; the ledger counts each undirected edge once (2 or 3
    # of the complete graph's 3), payload = omega (encoder + decoder) in fp32
    omega = FULL - (64 * 64 + 64) - (64 * 10 + 10)
    assert seed["model_bytes"] in (2 * omega * 4, 3 * omega * 4) and seed["probe_bytes"] == 0
    assert 0.0 <= seed["final_auroc_mean"] <= 1.0
    # the run list heads the column with the metric the runs hold (accuracy here, not AUROC)
    capsys.readouterr()
    main(["runs", "--experiment", fm.name, "--tracking-uri", f"sqlite:///{tmp_path}/ml.db"])
    shown = capsys.readouterr().out
    assert "accuracy mean +- std" in shown and "AUROC" not in shown


def test_cross_sweep_and_report(sets: tuple[Path, Path], tmp_path: Path) -> None:
    clin, fm = sets
    f = tmp_path / "cross.yaml"
    f.write_text(f"name: xs\nexperiment: xs\nseeds: [1]\nrounds: 2\n"
                 f"datasets:\n  clinical: {clin}\n  fmnist: {{cohort: {fm}, rounds: 1}}\n"
                 "methods:\n  - fedavg\n  - {method: sage, label: sage-os, params: {schedule: [2, 4]}}\n"
                 "executor: local\nworkers: 1\n")
    uri = f"sqlite:///{tmp_path}/ml.db"
    main(["sweep", "--config", str(f), "--tracking-uri", uri, "--no-progress"])
    out = tmp_path / "report"
    main(["report", "--experiment", "xs", "--out", str(out), "--tracking-uri", uri, "--no-log"])
    rows = list(csv.DictReader((out / "cross_table.csv").open()))
    got = {(r["selector"], r["dataset"]): r for r in rows}
    assert set(got) == {(s, d) for s in ("fedavg", "sage-os") for d in ("clinical", "fmnist")}
    assert {r["metric"] for r in rows if r["dataset"] == "fmnist"} == {"accuracy"}
    assert {r["metric"] for r in rows if r["dataset"] == "clinical"} == {"auroc"}
    # FedAvg: n center-server links x the full fp32 model per round; relative to 50 FedAvg rounds
    assert float(got[("fedavg", "clinical")]["rel_bandwidth"]) == pytest.approx(2 / 50)
    assert float(got[("fedavg", "fmnist")]["rel_bandwidth"]) == pytest.approx(1 / 50)
    assert float(got[("fedavg", "fmnist")]["total_mb"]) == pytest.approx(3 * FULL * 4 / 1e6)
    assert all(0.0 <= float(r["mean"]) <= 1.0 for r in rows)
    md = (out / "cross_table.md").read_text()
    assert "fmnist accuracy" in md and "clinical AUROC" in md
    assert "Cross table" in (out / "report.md").read_text()
    # resumable: a rerun finds every cell finished
    main(["sweep", "--config", str(f), "--tracking-uri", uri, "--no-progress"])
    with pytest.raises(SystemExit):
        main(["sweep", "--config", str(f), "--cohort", str(clin), "--tracking-uri", uri, "--no-progress"])


def test_bad_image_spec_names_the_option(tmp_path: Path) -> None:
    from federation.data.load import load_federation

    (tmp_path / "images.yaml").write_text("n_clients: 1\n")
    with pytest.raises(InputError, match="images.yaml: option 'n_clients'"):
        load_federation(tmp_path)


def test_a_cross_sweep_checks_every_data_set_before_a_cell_runs(sets: tuple[Path, Path], tmp_path: Path) -> None:
    from federation.sweep.cross import run_cross_sweep

    clin, _ = sets
    f = tmp_path / "cross.yaml"
    base = "name: xb\nseeds: [1]\nrounds: 1\nmethods: [fedavg]\nexecutor: local\nworkers: 1\n"
    uri = f"sqlite:///{tmp_path}/ml.db"
    f.write_text(base + f"datasets:\n  good: {clin}\n  gone: {tmp_path / 'nothing'}\n")
    with pytest.raises(InputError, match=r"cross.yaml: datasets.gone: .*nothing/cohort.parquet: file not found"):
        run_cross_sweep(f, tracking_uri=uri, progress=False)
    assert not (tmp_path / "ml.db").exists()  # the good data set's cells did not run first
    f.write_text(base + f"cohort: {clin}\ndatasets:\n  good: {clin}\n")  # one of the two would be ignored
    with pytest.raises(InputError, match="a cross sweep names its cohorts under `datasets:`; drop `cohort:`"):
        run_cross_sweep(f, tracking_uri=uri, progress=False)


@pytest.mark.parametrize(("entry", "words"), [
    ("{cohort: C, seeds: [-5]}", "datasets.a: seeds must be integers from 0 to 2^63 - 1"),
    ("{cohort: C, seeds: [1, 1]}", "datasets.a: a seed is listed twice"),
    ("{cohort: C, seeds: [true]}", "datasets.a: Input should be a valid integer"),
    ("{cohort: C, rounds: true}", "datasets.a: Input should be a valid integer"),
])
def test_a_cross_data_set_checks_seeds_and_rounds_as_a_sweep_file(tmp_path: Path, entry: str, words: str) -> None:
    from federation.sweep.cross import load_cross_sweep

    f = tmp_path / "cross.yaml"
    f.write_text("name: xb\nseeds: [1]\nmethods: [fedavg]\ndatasets:\n  a: " + entry + "\n")
    with pytest.raises(InputError) as err:
        load_cross_sweep(f)
    assert str(err.value).startswith(f"{f}: {words}"), err.value
    f.write_text("name: xb\nseeds: [1]\nmethods: [fedavg]\ndatasets:\n  1: C\n  '1': D\n")
    with pytest.raises(InputError, match="datasets: the label '1' is given twice"):
        load_cross_sweep(f)

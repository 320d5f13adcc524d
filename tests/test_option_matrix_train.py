"""The option matrix (tests/option_matrix.py) for the training and reading commands: `abps train`
on a clinical cohort, on an image federation and with each benchmark config; `abps sweep`; `abps
runs`, `report`, `ui` on a store. Also the two DP-parameter cases: a DP setting on base ABPS (which
releases no metadata) is refused, and YAML's `.inf` is the same setting as `inf`."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from etl.images import FASHION_MNIST_DIR
from tests.option_matrix import Kind, Probe, check_base_repeats, check_cell, commands, options, run_cli

HAVE_FMNIST = (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file()


def _fake_cifar(root: Path) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with (folder / name).open("wb") as fh:
            pickle.dump({b"data": rng.integers(0, 255, (40, 3072), dtype=np.uint8),
                         b"labels": rng.integers(0, 10, 40).tolist()}, fh)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny clinical cohorts, config files, two finished stores, tiny image inputs."""
    from federation.data.synthetic import write_fedprox_cohort

    root = tmp_path_factory.mktemp("matrix-train-inputs")
    c1 = write_fedprox_cohort(root / "c1", n_centers=4, seed=1, mean_size=60.0)
    c2 = write_fedprox_cohort(root / "c2", n_centers=4, seed=2, mean_size=60.0)
    (root / "lr.yaml").write_text("method: fedprox\nengine: {lr: 0.05}\n")
    (root / "lr-avg.yaml").write_text("method: fedavg\nengine: {lr: 0.05}\n")
    _fake_cifar(root / "cifar")
    sage = "benchmark: sage\nname: t\ndataset: cifar10\ndata_root: {root}\nn_clients: 3\ngraph: ba\nba_m: 1\n" \
           "alpha_dir: {a}\nselectors: [RG]\ntrain_samples: 120\ntest_samples: 30\n"
    (root / "sage.yaml").write_text(sage.format(root=root / "cifar", a=5.0))
    (root / "sage2.yaml").write_text(sage.format(root=root / "cifar", a=0.5))
    vv = ("benchmark: vv\nname: vv-t\nsimulation: {{n_nodes: 4, degree: 2, ticks: {t}, t_acquisition: 1, "
          "eval_every: 10, test_subset: 50, target_accuracy: 0.5, lr: {lr}}}\n"
          "arms: [{{name: plain, averaging: plain}}]\n")
    (root / "vv.yaml").write_text(vv.format(t=20, lr=0.01))
    (root / "vv2.yaml").write_text(vv.format(t=20, lr=0.05))
    for name, n in (("fm", 3), ("fm2", 4)):
        (root / name).mkdir()
        (root / name / "images.yaml").write_text(f"n_clients: {n}\nalpha_dir: 0.1\ntrain_samples: 300\n")
    sweep = "name: s\nseeds: [1]\nrounds: 1\nmethods: [{m}]\nexecutor: local\nworkers: 1\n"
    (root / "sweep.yaml").write_text(sweep.format(m="fedavg"))
    (root / "sweep2.yaml").write_text(sweep.format(m="fedprox"))
    for store, method in (("store", "fedavg"), ("store2", "fedprox")):
        (root / store).mkdir()
        p = subprocess.run(["abps", "train", "--method", method, "--cohort", str(c1), "--seeds", "1", "--rounds", "1",
                            "--output", str(root / store / "r.json"), "--tracking-uri",
                            f"sqlite:///{root / store / 'mlflow.db'}", "--no-progress"],
                           capture_output=True, text=True, cwd=root, env=_env(root))
        assert p.returncode == 0, p.stderr[-800:]
    # peer-to-peer: two 2-center cohorts for `abps launch`, two 1-center cohorts for a lone `abps peer`
    for name, n, seed in (("p2", 2, 1), ("p2b", 2, 2), ("p1", 1, 1), ("p1b", 1, 2)):
        write_fedprox_cohort(root / name, n_centers=n, seed=seed, mean_size=60.0)
    lone = pl.read_parquet(root / "p1" / "centers.parquet")["center_id"][0]
    for name, port in (("peers.txt", _free_port()), ("peers2.txt", _free_port())):
        (root / name).write_text(f"{lone} 127.0.0.1:{port}\n")
    return {"c1": c1, "c2": c2, "root": root, "lone": lone}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(root: Path) -> dict[str, str]:
    import os
    import sys

    return {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "ABPS_STATE": str(root / "state.json"),
            "HOME": os.environ.get("HOME", str(root))}


def _threads_probe(i):
    import torch

    return Probe(["--threads", str(torch.get_num_threads() + 1)])  # never the default


def _existing_output(scratch: Path) -> None:
    (scratch / "r.json").write_text('{"earlier": true}\n')


def _existing_peer_output(scratch: Path) -> None:
    (scratch / "p.json").write_text('{"earlier": true}\n')


def _other_report(scratch: Path) -> None:
    (scratch / "rep").mkdir()
    (scratch / "rep" / "report.json").write_text('{"experiment": "other", "sections": {}}\n')


_TRAIN = ["--seeds", "1", "--rounds", "1", "--output", "r.json", "--tracking-uri", "sqlite:///m.db", "--no-progress"]

_COMMON = {
    "output": lambda i: Probe(["--output", "r2.json"]),
    "force": lambda i: Probe(["--force"], setup=_existing_output),
    "tracking_uri": lambda i: Probe(["--tracking-uri", "sqlite:///m2.db"]),
    "experiment": lambda i: Probe(["--experiment", "other"]),
    "seeds": lambda i: Probe(["--seeds", "2"]),
    "threads": _threads_probe,
    "method": lambda i: Probe(["--method", "fedavg"]),
    "param": lambda i: Probe(["--param", "mu=0.5"]),
    "goal": lambda i: Probe(["--goal", "diversity"]),
}


def _store_setup(scratch: Path, i: dict[str, Path]) -> None:
    (scratch / "mlflow").mkdir()
    shutil.copy(i["root"] / "store" / "mlflow.db", scratch / "mlflow" / "mlflow.db")
    shutil.copy(i["root"] / "store2" / "mlflow.db", scratch / "other.db")


def _fake_ui_server(monkeypatch, scratch: Path) -> None:
    """`abps ui` starts the MLflow server: record its command line instead and start `true`."""
    import cli.runs_cmd as rc

    real = subprocess.Popen

    def popen(cmd, **kw):
        (scratch / "ui-command.json").write_text(json.dumps([str(c) for c in cmd]))
        return real(["true"], start_new_session=True)

    monkeypatch.setattr(rc.subprocess, "Popen", popen)
    monkeypatch.setattr(rc, "_wait_healthy", lambda base, proc, timeout_s: True)


KINDS = [
    Kind(("train",), "train-clinical", lambda i: ["--method", "fedprox", "--cohort", str(i["c1"]), *_TRAIN],
         {**_COMMON, "cohort": lambda i: Probe(["--cohort", str(i["c2"])]),
          "config": lambda i: Probe(["--config", str(i["root"] / "lr.yaml")])}),
    Kind(("train",), "train-sage", lambda i: ["--config", str(i["root"] / "sage.yaml"), *_TRAIN],
         {**_COMMON, "cohort": lambda i: Probe(["--cohort", str(i["c2"])]),
          "config": lambda i: Probe(["--config", str(i["root"] / "sage2.yaml")])}),
    Kind(("train",), "train-vv", lambda i: ["--config", str(i["root"] / "vv.yaml"), *_TRAIN],
         {**_COMMON, "cohort": lambda i: Probe(["--cohort", str(i["c2"])]),
          "config": lambda i: Probe(["--config", str(i["root"] / "vv2.yaml")])}),
    # FedProx's local loss term does not run on images: FedAvg, whose --param is refused
    Kind(("train",), "train-images", lambda i: ["--method", "fedavg", "--cohort", str(i["root"] / "fm"), *_TRAIN],
         {**_COMMON, "cohort": lambda i: Probe(["--cohort", str(i["root"] / "fm2")]),
          "method": lambda i: Probe(["--method", "local"]),
          "config": lambda i: Probe(["--config", str(i["root"] / "lr-avg.yaml")])}),
    Kind(("sweep",), "sweep", lambda i: ["--config", str(i["root"] / "sweep.yaml"), "--cohort", str(i["c1"]),
                                         "--tracking-uri", "sqlite:///m.db", "--no-progress"],
         {"config": lambda i: Probe(["--config", str(i["root"] / "sweep2.yaml")]),
          "executor": lambda i: Probe(["--executor", "nosuch"]),  # (ray would start a local cluster)
          "engine": lambda i: Probe(["--engine", "ray"]),
          "address": lambda i: Probe(["--address", "127.0.0.1:1"]),
          "cohort": lambda i: Probe(["--cohort", str(i["c2"])]),
          "seeds": lambda i: Probe(["--seeds", "2"]),
          "tracking_uri": lambda i: Probe(["--tracking-uri", "sqlite:///m2.db"]),
          "experiment": lambda i: Probe(["--experiment", "other"])}),
    Kind(("runs",), "runs", lambda i: ["--tracking-uri", "sqlite:///mlflow/mlflow.db"],
         {"experiment": lambda i: Probe(["--experiment", "nosuch"]),
          "tracking_uri": lambda i: Probe(["--tracking-uri", "sqlite:///other.db"])}, setup=_store_setup),
    Kind(("report",), "report", lambda i: ["--experiment", "c1", "--out", "rep", "--no-log", "--tracking-uri",
                                           "sqlite:///mlflow/mlflow.db"],
         {"experiment": lambda i: Probe(["--experiment", "nosuch"]),
          "out": lambda i: Probe(["--out", "rep2"]),
          "force": lambda i: Probe(["--force"], setup=_other_report),
          "tracking_uri": lambda i: Probe(["--tracking-uri", "sqlite:///other.db"])}, setup=_store_setup),
    Kind(("ui",), "ui", lambda i: ["--tracking-uri", "sqlite:///mlflow/mlflow.db"],
         {"host": lambda i: Probe(["--host", "0.0.0.0"]),
          "experiment": lambda i: Probe(["--experiment", "nosuch"]),
          "tracking_uri": lambda i: Probe(["--tracking-uri", "sqlite:///other.db"])},
         setup=_store_setup, patch=_fake_ui_server),
    Kind(("launch",), "launch", lambda i: ["--local", "2", "--method", "fedavg", "--cohort", str(i["root"] / "p2"),
                                           "--seed", "1", "--rounds", "1", "--output", "r.json",
                                           "--tracking-uri", "sqlite:///m.db"],
         {"method": lambda i: Probe(["--method", "abps"]),
          "cohort": lambda i: Probe(["--cohort", str(i["root"] / "p2b")]),
          "output": lambda i: Probe(["--output", "r2.json"]),
          "force": lambda i: Probe(["--force"], setup=_existing_output),
          "peers": lambda i: Probe(["--peers", str(i["root"] / "peers.txt")]),
          "config": lambda i: Probe(["--config", str(i["root"] / "lr-avg.yaml")]),
          "param": lambda i: Probe(["--param", "mu=0.5"]),
          "on_failure": lambda i: Probe(["--on-failure", "nosuch"]),
          "workdir": lambda i: Probe(["--workdir", "wd"]),
          "tracking_uri": lambda i: Probe(["--tracking-uri", "sqlite:///m2.db"]),
          "experiment": lambda i: Probe(["--experiment", "other"])},
         trivial={"timeout": "a wait limit: a federation whose messages all arrive in time runs the same",
                  "start_timeout": "a wait limit: peers that all come up in time run the same (tests/test_p2p.py "
                                   "times a lone peer out by it)"}),
    Kind(("peer",), "peer", lambda i: ["--cohort", str(i["root"] / "p1"), "--center", str(i["lone"]), "--peers",
                                       str(i["root"] / "peers.txt"), "--method", "fedavg", "--seed", "1",
                                       "--output", "p.json", "--insecure", "--rounds", "1"],
         {"cohort": lambda i: Probe(["--cohort", str(i["root"] / "p1b")]),
          "center": lambda i: Probe(["--center", "nosuch"]),
          "peers": lambda i: Probe(["--peers", str(i["root"] / "peers2.txt")]),
          "method": lambda i: Probe(["--method", "abps"]),
          "output": lambda i: Probe(["--output", "p2.json"]),
          "force": lambda i: Probe(["--force"], setup=_existing_peer_output),
          "certs": lambda i: Probe(["--certs", "nosuch"]),
          "config": lambda i: Probe(["--config", str(i["root"] / "lr-avg.yaml")]),
          "param": lambda i: Probe(["--param", "mu=0.5"]),
          "listen": lambda i: Probe(["--listen", "nohost"]),
          "capture": lambda i: Probe(["--capture", "cap.bin"]),
          "checkpoint": lambda i: Probe(["--checkpoint", "ck.pt"])},
         trivial={"timeout": "a wait limit: a federation whose messages all arrive in time runs the same",
                  "start_timeout": "a wait limit: a lone center waits for no other",
                  "await_rejoin": "a lone center has no other center to wait for"}),
    # the caches of this run's scratch folder, never the user's own
    Kind(("cache", "clear"), "cache-clear", lambda i: [],
         patch=lambda monkeypatch, scratch: monkeypatch.setenv("ABPS_CACHE_DIR", str(scratch / "cache"))),
    Kind(("cache", "list"), "cache-list", lambda i: [],
         patch=lambda monkeypatch, scratch: monkeypatch.setenv("ABPS_CACHE_DIR", str(scratch / "cache"))),
]

_NEEDS_FMNIST = {"train-vv", "train-images"}


def _marks(kind: Kind) -> list:
    return [pytest.mark.skipif(not HAVE_FMNIST, reason="Fashion-MNIST not installed")] \
        if kind.name in _NEEDS_FMNIST else []


CELLS = [pytest.param(k, p.name, id=f"{k.name}-{p.name}", marks=_marks(k)) for k in KINDS for p in options(k.command)]


def test_every_command_and_benchmark_has_a_kind():
    from federation.benchmark import BENCHMARKS as _BENCHMARKS
    from tests.test_option_matrix_etl import KINDS as DATA_KINDS

    assert set(commands()) == {k.command for k in [*KINDS, *DATA_KINDS]}
    bench = {"sage": "train-sage", "vv": "train-vv"}
    assert set(_BENCHMARKS) <= set(bench) and set(bench.values()) <= {k.name for k in KINDS}


@pytest.mark.parametrize("kind", [pytest.param(k, id=k.name, marks=_marks(k)) for k in KINDS])
def test_base_runs_repeat(kind, inputs, tmp_path, capsys, monkeypatch):
    check_base_repeats(kind, inputs, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("kind,opt", CELLS)
def test_option_is_applied_or_refused(kind, opt, inputs, tmp_path_factory, capsys, monkeypatch):
    root = tmp_path_factory.getbasetemp() / f"matrix-{kind.name}"
    root.mkdir(exist_ok=True)
    check_cell(kind, opt, inputs, root, capsys, monkeypatch)


# ---------------------------------------------------------------------------------- DP parameters


def test_dp_on_base_abps_is_refused_not_ignored(inputs, tmp_path, capsys, monkeypatch):
    """Base ABPS releases no metadata: the README's DP example on it is refused naming the
    parameter, before any MLflow run; with a goal it is applied (a spent epsilon is recorded)."""
    argv = ["train", "--cohort", str(inputs["c1"]), "--seeds", "1", "--rounds", "1", "--output", "r.json",
            "--tracking-uri", "sqlite:///m.db", "--no-progress", "--param", "metadata_dp_epsilon=1",
            "--param", "metadata_dp_delta=1e-6"]
    code, _, err = run_cli([*argv, "--method", "abps"], tmp_path, capsys, monkeypatch)
    assert code == 2 and err.count("\n") == 1 and "metadata_dp_epsilon applies only when metadata is released" in err
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "m.db").exists()
    code, _, err = run_cli([*argv, "--goal", "diversity"], tmp_path, capsys, monkeypatch)
    assert code == 0, err
    seed = json.loads((tmp_path / "r.json").read_text())["seeds"]["1"]
    assert seed["method_summary"]["dp_epsilon_spent"] == pytest.approx(1.0, rel=1e-3)


def test_yaml_infinity_is_the_same_setting_as_inf(inputs, tmp_path, capsys, monkeypatch):
    docs = []
    for n, spelling in enumerate(("inf", ".inf")):
        d = tmp_path / str(n)
        d.mkdir(exist_ok=True)
        code, _, err = run_cli(["train", "--method", "abps-div", "--cohort", str(inputs["c1"]), "--seeds", "1",
                                "--rounds", "1", "--output", "r.json", "--tracking-uri", "sqlite:///m.db",
                                "--no-progress", "--param", f"metadata_dp_epsilon={spelling}"], d, capsys, monkeypatch)
        assert code == 0, err
        docs.append(json.loads((d / "r.json").read_text()))
    assert docs[0]["config"] == docs[1]["config"]
    assert docs[0]["config"]["params"]["metadata_dp_epsilon"] == "inf"
    assert docs[0]["seeds"]["1"]["final_auroc_mean"] == docs[1]["seeds"]["1"]["final_auroc_mean"]

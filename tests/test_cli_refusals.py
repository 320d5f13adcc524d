"""`abps train` and `abps sweep` refuse, in one line and before anything runs, values that would
otherwise end in a traceback (a seed past 64 bits, an absurd thread count) or be silently replaced
(a repeated --param, a --param goal that --goal overrides, an empty --experiment, a store URI for a
config that turns tracking off)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.app import main
from cli.project import MAX_SEED
from tests.cli_helpers import refused as _refused


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    from federation.data.synthetic import write_fedprox_cohort

    return write_fedprox_cohort(tmp_path_factory.mktemp("refuse") / "c", n_centers=3, seed=1, mean_size=40.0)


@pytest.mark.parametrize(("extra", "words"), [
    (["--method", "fedavg", "--seeds", str(MAX_SEED + 1)], f"--seeds must be integers from 0 to {MAX_SEED}"),
    (["--method", "fedavg", "--threads", "100000"], "--threads"),
    (["--method", "abps", "--param", "kappa=2", "--param", "kappa=4"], "--param kappa: given twice"),
    (["--method", "abps", "--param", "goal=homogeneity", "--goal", "diversity"],
     "--goal diversity: --param goal=homogeneity names another goal"),
    (["--method", "fedavg", "--experiment", " "], "--experiment: an empty name"),
    (["--goal", "diversity", "--param", "goal=homogeneity"],             # the goal's preset, not --method
     "--goal diversity: --param goal=homogeneity names another goal"),
    (["--method", "abps", "--param", "kappa=true"],
     "abps: invalid parameter kappa (--param or the config's params:): a number, not true / false"),
    (["--method", "fedprox", "--param", "mu=false"], "fedprox: invalid parameter mu"),
    (["--method", "abps", "--param", "tau_mode=global"],
     "abps: invalid parameter set (--param or the config's params:): tau_mode is a setting of the goal-aware "
     "filter, which runs only with a goal"),
    (["--method", "random-partners", "--param", "metadata=full"], "metadata is a setting of the goal-aware filter"),
    (["--method", "sage", "--param", "er_p=0.5"], "sage: invalid parameter set (--param or the config's params:): "
     "params.er_p is used only with graph 'er', not 'complete': drop it or change params.graph"),
])
def test_train_refuses(cohort, tmp_path, capsys, extra, words):
    err = _refused(["train", "--cohort", str(cohort), "--rounds", "1", "--no-progress",
                    "--tracking-uri", f"sqlite:///{tmp_path}/ml.db", "--output", str(tmp_path / "r.json"), *extra], capsys)
    assert words in err, err
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "ml.db").exists()


def test_the_largest_seed_is_taken(cohort, tmp_path):
    """The bound is the random streams' own: MAX_SEED itself trains."""
    main(["train", "--cohort", str(cohort), "--method", "fedavg", "--rounds", "1", "--no-progress", "--seeds",
          str(MAX_SEED), "--tracking-uri", f"sqlite:///{tmp_path}/ml.db", "--output", str(tmp_path / "r.json")])
    assert (tmp_path / "r.json").is_file()


def test_a_matching_param_goal_is_the_same_run(cohort, tmp_path, capsys):
    """--param goal=diversity with --goal diversity says the same thing twice: taken."""
    import json

    main(["train", "--cohort", str(cohort), "--method", "abps", "--goal", "Diversity", "--param", "goal=diversity",
          "--rounds", "1", "--no-progress", "--tracking-uri", f"sqlite:///{tmp_path}/ml.db",
          "--output", str(tmp_path / "r.json")])
    assert json.loads((tmp_path / "r.json").read_text())["config"]["params"]["goal"] == "diversity"


_VV = ("benchmark: vv\nname: vv-t\nsimulation: {{n_nodes: 4, degree: 2, ticks: 2, t_acquisition: 1, eval_every: 10, "
       "test_subset: 50, target_accuracy: 0.5, lr: 0.01}}\narms: [{{name: plain, averaging: plain}}]\n{extra}")


@pytest.mark.parametrize(("extra", "options", "words"), [
    ("threads: -3\n", [], "vv config threads: an integer from 0"),
    ("threads: abc\n", [], "vv config threads: an integer from 0"),
    ("threads: [1, 2]\n", [], "vv config threads: an integer from 0"),
    ("seeds: [18446744073709551616]\n", [], "seeds must be a list of integers from 0 to"),
    ("tracking: {enabled: false}\n", ["--tracking-uri", "sqlite:///X/ml.db"], "--tracking-uri: this vv config turns tracking off"),
    ("tracking: {enabeld: false}\n", [], "vv config tracking: unknown key 'enabeld' (known: enabled, experiment, uri)"),
    ("data: {rooot: /nonexistent}\n", [], "vv config data: unknown key 'rooot' (known: name, root)"),
    ("seeds: [0, 0]\n", [], "seeds: 0 is listed twice"),
    ("grid: {n_nodes: [100000]}\n", [], "simulation.n_nodes 100000 (grid cell n_nodes=100000): more nodes than the "
                                         "60000 training images of fashion-mnist"),
])
def test_a_vv_config_refuses(tmp_path, capsys, extra, options, words):
    cfg = tmp_path / "vv.yaml"
    cfg.write_text(_VV.format(extra=extra))
    options = [o.replace("X", str(tmp_path)) for o in options]
    err = _refused(["train", "--config", str(cfg), "--output", str(tmp_path / "r.json"), *options], capsys)
    assert words in err, err
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "ml.db").exists()


_PLAIN_ARM = "arms: [{name: plain, averaging: plain}]"


@pytest.mark.parametrize(("edit", "extra", "options", "words"), [
    (("degree: 2", "degree: 3, topology: star"), "", [],
     "vv config arm plain: simulation.degree is used only with topology 'regular', not 'star': drop it or change "
     "simulation.topology"),
    (("lr: 0.01", "lr: 0.01, alpha: 0.05"), "", [],
     "vv config arm plain: simulation.alpha is used only with partition 'dirichlet', not 'iid': drop it or change "
     "simulation.partition"),
    (("lr: 0.01", "lr: 0.01, transfer_check: evaluation"), "", [],
     "vv config arm plain: simulation.transfer_check is used only with transfer_threshold set, not None: drop it or "
     "change simulation.transfer_threshold"),
    (("", ""), "grid: {ticks: [4, 5]}\n", ["--rounds", "2"],
     "--rounds 2: grid.ticks [4, 5] sets the ticks of every run; drop --rounds or grid.ticks"),
    ((_PLAIN_ARM, "arms: [{name: plain, averaging: plain, ticks: 6}]"), "grid: {ticks: [4, 5]}\n", [],
     "vv config arm plain: ticks is varied by grid.ticks [4, 5]: drop it from the arm or from the grid"),
    ((_PLAIN_ARM, "arms: [{name: plain, averaging: plain, ticks: 6}]"), "", ["--rounds", "2"],
     "--rounds 2: arm plain sets its own ticks; drop --rounds or the arm's ticks"),
    (("", ""), "tracking: {enabled: false, uri: 'sqlite:///x.db'}\n", [],
     "vv config tracking.uri: tracking is off (tracking.enabled: false); drop tracking.uri or turn tracking on"),
])
def test_a_vv_setting_that_would_not_be_applied_is_refused(tmp_path, capsys, edit, extra, options, words):
    """A key the run would not read (degree on a star, alpha of an iid partition, --rounds under a
    grid of ticks, an arm's value of a key the grid varies) is refused, naming it."""
    cfg = tmp_path / "vv.yaml"
    text = _VV.format(extra=extra)
    assert edit[0] in text
    cfg.write_text(text.replace(*edit) if edit[0] else text)
    err = _refused(["train", "--config", str(cfg), "--output", str(tmp_path / "r.json"), *options], capsys)
    assert err == f"error: {cfg}: {words}"
    assert not (tmp_path / "r.json").exists()


def test_a_sweep_refuses_a_seed_past_64_bits(cohort, tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nseeds: [9223372036854775808]\nrounds: 1\nmethods: [fedavg]\nexecutor: local\nworkers: 1\n")
    err = _refused(["sweep", "--config", str(spec), "--cohort", str(cohort),
                    "--tracking-uri", f"sqlite:///{tmp_path}/ml.db"], capsys)
    assert "seeds must be integers from 0 to 2^63 - 1" in err, err


def test_a_sweep_without_a_cohort_uses_the_projects_as_train_does(cohort, tmp_path, monkeypatch, capsys):
    """No --cohort and no `cohort:`: the project's cohort (./cohort here), said on stderr; none at all
    is refused in one line naming the file and the ways to give one."""
    import shutil

    from cli.app import main

    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nseeds: [1]\nrounds: 1\nmethods: [fedavg]\nexecutor: local\nworkers: 1\n")
    monkeypatch.chdir(tmp_path)
    args = ["sweep", "--config", str(spec), "--tracking-uri", f"sqlite:///{tmp_path}/ml.db", "--no-progress"]
    err = _refused(args, capsys)
    assert err.startswith(f"error: {spec}: no cohort: give --cohort DIR") and "`cohort:` in the file" in err, err
    shutil.copytree(cohort, tmp_path / "cohort")
    main(args)
    out = capsys.readouterr()
    assert "cohort: cohort (this project's default; --cohort DIR for another)" in out.err
    assert "sweep s: 1 cells, 0 already finished, 1 run now, 0 failed" in out.out


@pytest.mark.parametrize(("line", "words"), [
    ("rounds: true", "invalid sweep field rounds: a number, not true / false"),
    ("workers: true", "invalid sweep field workers: a number, not true / false"),
    ("experiment: ''", "experiment: an empty name"),
    ("checkpoints: {afile}", "checkpoints: '{afile}' is not a folder"),
    # each thread or process is the operating system's: 10^5 of them crashed the sweep (a segfault)
    ("resources: {{threads: 100000}}", "invalid sweep field resources.threads: Input should be less than or equal to 1024"),
    ("workers: 100000", "invalid sweep field workers: Input should be less than or equal to 1024"),
    # --rounds sets every cell's rounds: a per-cell value would be replaced unseen (and its cells run once)
    ("options: {{rounds: [2, 3]}}", "sweep s: options.rounds varies what --rounds (1) sets for every cell"),
    ("options: {{rounds: [0]}}", "sweep s: options.rounds varies what --rounds (1) sets for every cell"),
    ("methods: [{{method: fedavg, overrides: {{rounds: -1}}}}]", "sweep entry 'fedavg': overrides.rounds is replaced by"),
    ("methods: [{{method: fedavg, overrides: {{early_stopping: {{enabled: true, max_rounds: 7}}}}}}]",
     "sweep entry 'fedavg': overrides.early_stopping.max_rounds is replaced by --rounds (1); give one of them"),
    ("options: {{early_stopping: [{{enabled: true, max_rounds: 7}}]}}",
     "sweep s: options.early_stopping.max_rounds varies what --rounds (1) sets for every cell"),
    ("methods: [{{method: abps, params: {{kappa: 2}}, overrides: {{params: {{kappa: 3}}}}}}]",
     "sweep entry 'abps': overrides.params and params: both set method parameters; give them in params:"),
    ("options: {{engine.lr: [0.01, 0.010]}}", "sweep s: row 'fedavg[engine.lr=0.01]' twice with seed 1: the same run"),
    ("methods: [fedavg, {{method: fedavg, label: again}}]", "sweep s: rows 'fedavg' and 'again' with seed 1: the same run"),
    ("options: {{method: [fedprox]}}", "sweep s: options.method: the methods are the entries of `methods:`"),
    ("methods: [{{method: fedavg, overrides: {{method: fedprox}}}}]",
     "sweep entry 'fedavg': overrides.method: give the entry's `method:` instead"),
    ("methods: [{{method: fedavg, config: .}}]", "entry 'fedavg': config . is a folder, not a run config file at"),
    ("resources: {{num_cpus: 7}}", "resources.num_cpus 7 applies to --executor ray only"),
])
def test_a_sweep_file_refuses(cohort, tmp_path, capsys, line, words):
    """Before any cell trains: a flag where a number goes, an empty experiment name (it fell back
    to `name:`), a checkpoint folder that is a file (the cell trained, then a traceback)."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    spec = tmp_path / "s.yaml"
    methods = "" if line.startswith("methods:") else "methods: [fedavg]\n"
    spec.write_text(f"name: s\nseeds: [1]\n{methods}{line.format(afile=afile)}\n")
    err = _refused(["sweep", "--config", str(spec), "--cohort", str(cohort), "--rounds", "1",
                    "--tracking-uri", f"sqlite:///{tmp_path}/ml.db"], capsys)
    assert words.format(afile=afile) in err, err
    assert not (tmp_path / "ml.db").exists()


@pytest.mark.parametrize("command", [["runs"], ["report", "--out", "rep"], ["ui"]])
def test_reading_commands_refuse_an_empty_experiment(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = _refused([*command, "--experiment", " ", "--tracking-uri", f"sqlite:///{tmp_path}/ml.db"], capsys)
    assert err == "error: --experiment: an empty name; give a name, or leave the option out for the default"
    assert not (tmp_path / "rep").exists()


@pytest.mark.parametrize("command", [["runs"], ["report", "--out", "rep"]])
def test_a_tracking_server_that_does_not_answer_is_named_at_once(command, tmp_path, capsys, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nothing listens on: refused at once (MLflow retried for minutes)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.chdir(tmp_path)
    err = _refused([*command, "--experiment", "x", "--tracking-uri", f"http://127.0.0.1:{port}"], capsys)
    assert err.startswith(f"error: MLflow tracking server http://127.0.0.1:{port}: cannot connect (")
    assert not (tmp_path / "rep").exists()


def test_a_tracking_server_that_accepts_and_never_answers_http_is_named(tmp_path, capsys, monkeypatch):
    """A port that takes the connection and then says nothing, or says something that is not HTTP
    (MLflow's client waited on it with retries for minutes)."""
    import socket
    import threading

    from etl.errors import InputError
    from federation.run.tracking import _check_server

    with socket.socket() as silent, socket.socket() as other:
        for s in (silent, other):
            s.bind(("127.0.0.1", 0))
            s.listen(4)

        def not_http() -> None:
            while True:
                try:
                    conn, _ = other.accept()
                    conn.recv(1024)
                    conn.sendall(b"SSH-2.0-OpenSSH\r\n")
                    conn.close()
                except OSError:  # the socket closed at the end of the test
                    return

        threading.Thread(target=not_http, daemon=True).start()
        uri = f"http://127.0.0.1:{other.getsockname()[1]}"
        monkeypatch.chdir(tmp_path)
        err = _refused(["runs", "--experiment", "x", "--tracking-uri", uri], capsys)
        assert err == f"error: MLflow tracking server {uri}: it accepts connections but sent no HTTP answer (BadStatusLine)"
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(InputError, match=r"^MLflow tracking server .*: it accepts connections but sent no answer "
                                             r"within 0.5 s$"):
            _check_server(uri, 0.5)


_SAGE = ("benchmark: sage\nname: t\ndataset: cifar10\ndata_root: {root}\nn_clients: 3\ngraph: er\n"
         "selectors: [RG]\ntrain_samples: 120\ntest_samples: 30\n{extra}")


@pytest.mark.parametrize(("extra", "words"), [
    ("er_p: 1.5\n", "option 'er_p': Input should be less than or equal to 1"),
    ("ba_m: 0\n", "option 'ba_m'"),
    ("lr: .nan\n", "option 'lr': Input should be a finite number"),
    ("train_samples: 100000000\n", "option 'train_samples': 100000000 is more than the 200 training images of cifar10"),
])
def test_a_sage_config_refuses(tmp_path, capsys, extra, words):
    from tests.test_option_matrix_train import _fake_cifar

    _fake_cifar(tmp_path / "cifar")  # 5 training batches of 40 images, 40 test images
    cfg = tmp_path / "sage.yaml"
    text = _SAGE.format(root=tmp_path / "cifar", extra=extra)
    if extra.startswith("train_samples"):
        text = text.replace("train_samples: 120\n", "")
    cfg.write_text(text)
    err = _refused(["train", "--config", str(cfg), "--output", str(tmp_path / "r.json"),
                    "--tracking-uri", f"sqlite:///{tmp_path}/ml.db"], capsys)
    assert words in err, err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(("edit", "extra", "words"), [
    (("graph: er", "graph: ba"), "er_p: 0.9\n", "er_p is used only with graph 'er', not 'ba': drop it or change graph"),
    (("", ""), "ba_m: 2\n", "ba_m is used only with graph 'ba', not 'er': drop it or change graph"),
    (("", ""), "pens: {top_m: 3}\n", "pens is used only with selectors 'PENS', not ['RG']: drop it or change selectors"),
    (("", ""), "pfeddst: {c: 2.0}\n",
     "pfeddst is used only with selectors 'PFedDST', not ['RG']: drop it or change selectors"),
    (("[RG]", "[RG, AQ-128]"), "delta: 0.2\n", "delta is used only with selectors 'SAGE-NF' or 'Vanilla SAGE' or "
     "'SAGE-OS', not ['RG', 'AQ-128']: drop it or change selectors"),
    (("[RG]", "[Vanilla SAGE]"), "stage_cost: cumulative\n",
     "stage_cost is used only with selectors 'SAGE-OS', not ['Vanilla SAGE']: drop it or change selectors"),
    (("[RG]", "[LOCAL, PENS]"), "alpha_mix: 0.3\n", "alpha_mix is used only with selectors 'RG' or 'AQ-128' or "
     "'SAGE-NF' or 'Vanilla SAGE' or 'SAGE-OS', not ['LOCAL', 'PENS']: drop it or change selectors"),
])
def test_a_sage_setting_that_no_graph_or_selector_reads_is_refused(tmp_path, capsys, edit, extra, words):
    cfg = tmp_path / "sage.yaml"
    text = _SAGE.format(root=tmp_path / "cifar", extra=extra)
    assert edit[0] in text
    cfg.write_text(text.replace(*edit) if edit[0] else text)
    err = _refused(["train", "--config", str(cfg), "--output", str(tmp_path / "r.json"),
                    "--tracking-uri", f"sqlite:///{tmp_path}/ml.db"], capsys)
    assert err == f"error: {cfg}: sage config: {words}"
    assert not (tmp_path / "r.json").exists()


def test_a_vv_nan_is_not_a_range_error(tmp_path, capsys):
    cfg = tmp_path / "vv.yaml"
    cfg.write_text(_VV.format(extra="").replace("lr: 0.01", "lr: 0.01, beta: .nan"))
    assert "Input should be a finite number" in _refused(["train", "--config", str(cfg)], capsys)


def test_a_sweep_names_an_unknown_method_as_its_file_does(cohort, tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nseeds: [1]\nrounds: 1\nmethods: [nosuch]\nexecutor: local\nworkers: 1\n")
    err = _refused(["sweep", "--config", str(spec), "--cohort", str(cohort),
                    "--tracking-uri", f"sqlite:///{tmp_path}/ml.db"], capsys)
    assert "sweep s: methods: unknown method 'nosuch'; known: " in err and "--method" not in err, err


@pytest.mark.parametrize("text", ["method: fedavg\nrounds: true\n", "method: fedavg\nengine: {lr: false}\n"])
def test_a_flag_where_a_run_config_wants_a_number_is_refused(cohort, tmp_path, capsys, text):
    """pydantic reads a YAML true / false in a number's place as 1 / 0; the file is refused instead."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    err = _refused(["train", "--config", str(cfg), "--cohort", str(cohort), "--no-progress",
                    "--tracking-uri", f"sqlite:///{tmp_path}/ml.db", "--output", str(tmp_path / "r.json")], capsys)
    assert err.startswith(f"error: {cfg}: key '") and "a number, not true / false" in err, err


def test_a_flag_where_a_benchmark_config_wants_a_number_is_refused(tmp_path, capsys):
    cfg = tmp_path / "vv.yaml"
    cfg.write_text(_VV.format(extra="").replace("ticks: 2", "ticks: true"))
    assert "a number, not true / false" in _refused(["train", "--config", str(cfg)], capsys)


def _file_options() -> list[tuple[tuple[str, ...], str]]:
    """(command path, option) of every option of the app that names a file to write."""
    from cli.project import file_path
    from tests.option_matrix import commands

    return [(path, max(p.opts, key=len)) for path, cmd in commands().items() for p in cmd.params
            if getattr(getattr(p, "type_descriptor", None), "parameter_info", None) is not None
            and p.type_descriptor.parameter_info.parser is file_path]


def test_every_output_option_is_a_file_option():
    """Each --output, --capture and --checkpoint of the app is read by cli.project.file_path, so
    a new one cannot silently take a folder path."""
    from tests.option_matrix import commands

    names = {"--output", "--capture", "--checkpoint"}
    declared = {(path, max(p.opts, key=len)) for path, cmd in commands().items() for p in cmd.params
                if names & set(getattr(p, "opts", ()))}
    assert declared and declared == set(_file_options())


@pytest.mark.parametrize(("path", "option"), _file_options())
def test_a_file_option_refuses_a_folder_path(path, option, tmp_path, capsys):
    """`--output DIR/` names a folder: refused, where typer's Path would drop the slash and write
    a file called DIR."""
    target = tmp_path / "runs"
    err = _refused([*path, option, f"{target}/"], capsys)
    assert err == (f"error: Invalid value for '{option}': {target}/ ends in /, which names a folder; give a file "
                   f"such as {target}/results.json"), err
    assert not target.exists()


def test_a_model_larger_than_the_machine_is_refused(cohort, tmp_path, capsys):
    """An absurd width is refused in one line before anything is allocated (it reached the
    kernel's out-of-memory kill); the bound counts the stacked parameters as torch holds them."""
    import os

    from federation.data.tensors import FederatedData
    from federation.engine.mlp import init_params, stacked_param_count

    fd = FederatedData.from_cohort(cohort)
    held = init_params(fd.d, (7, 5), fd.n_centers, 0)
    assert stacked_param_count(fd.d, (7, 5), fd.n_centers) == sum(t.numel() for t in held.values())
    cfg = tmp_path / "huge.yaml"
    cfg.write_text("method: fedavg\nengine: {hidden: [100000000, 100000000]}\n")
    err = _refused(["train", "--cohort", str(cohort), "--config", str(cfg), "--rounds", "1", "--no-progress",
                    "--tracking-uri", f"sqlite:///{tmp_path}/ml.db", "--output", str(tmp_path / "r.json")], capsys)
    need = 16 * stacked_param_count(fd.d, (10**8, 10**8), fd.n_centers) / 2**30
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    assert err == (f"error: engine.hidden [100000000, 100000000]: {fd.n_centers} centers' models with {fd.d} features "
                   f"need at least {need:,.1f} GiB (parameters, gradients and Adam moments), more than this machine's "
                   f"{have:,.1f} GiB"), err
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "ml.db").exists()


def test_cache_clear_names_what_it_cannot_remove(tmp_path, monkeypatch, capsys):
    """A file of the cache this user may not remove: one line naming it, exit 2 (it was a
    traceback); the folders before it are gone, the rest stays."""
    import os

    monkeypatch.setenv("ABPS_CACHE_DIR", str(tmp_path / "c"))
    (tmp_path / "c" / "chartevents").mkdir(parents=True)
    (tmp_path / "c" / "kernels").mkdir()
    (tmp_path / "c" / "chartevents" / "x.parquet").write_bytes(b"\0" * 2**20)
    (tmp_path / "c" / "kernels" / "k.so").write_bytes(b"\0")
    real = os.unlink

    def unlink(path, *a, **k):
        if os.fspath(path).endswith("k.so"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "unlink", unlink)
    err = _refused(["cache", "clear"], capsys)
    assert err == f"error: {tmp_path}/c/kernels/k.so: cannot remove it (Permission denied); 1.0 MiB freed before it"
    assert not (tmp_path / "c" / "chartevents").exists() and (tmp_path / "c" / "kernels" / "k.so").exists()


@pytest.mark.parametrize("command", ["list", "clear"])
def test_a_cache_folder_under_a_file_is_refused_not_listed_as_empty(command, tmp_path, monkeypatch, capsys):
    (tmp_path / "afile").write_text("keep")
    monkeypatch.setenv("ABPS_CACHE_DIR", str(tmp_path / "afile"))
    err = _refused(["cache", command], capsys)
    assert err == (f"error: {tmp_path}/afile: a file, not a folder; the cache folder {tmp_path}/afile/chartevents "
                   "(ABPS_CACHE_DIR) cannot be there")
    monkeypatch.setenv("ABPS_CACHE_DIR", str(tmp_path / "c"))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "chartevents").write_text("keep")
    assert _refused(["cache", command], capsys).startswith(f"error: {tmp_path}/c/chartevents: a file, not a folder")
    assert (tmp_path / "afile").read_text() == (tmp_path / "c" / "chartevents").read_text() == "keep"


def _folder_options() -> list[tuple[tuple[str, ...], str]]:
    """(command path, option) of every --out of the app: a folder to write."""
    from cli.project import folder_path
    from tests.option_matrix import commands

    return [(path, max(p.opts, key=len)) for path, cmd in commands().items() for p in cmd.params
            if "--out" in getattr(p, "opts", ()) and p.type_descriptor.parameter_info.parser is folder_path]


def test_every_out_option_is_a_folder_option():
    from tests.option_matrix import commands

    declared = {(path, "--out") for path, cmd in commands().items() for p in cmd.params if "--out" in getattr(p, "opts", ())}
    assert len(declared) >= 4 and declared == set(_folder_options())


@pytest.mark.parametrize(("path", "option"), _folder_options())
def test_an_empty_out_is_refused(path, option, tmp_path, capsys, monkeypatch):
    """An empty --out was read as the working folder '.'."""
    monkeypatch.chdir(tmp_path)
    err = _refused([*path, option, ""], capsys)
    assert err == f"error: Invalid value for '{option}': an empty path; give a folder such as cohort/", err
    assert list(tmp_path.iterdir()) == []


def test_a_config_that_is_a_folder_is_named_as_one(cohort, tmp_path, capsys):
    err = _refused(["train", "--cohort", str(cohort), "--config", str(tmp_path), "--no-progress",
                    "--tracking-uri", f"sqlite:///{tmp_path}/ml.db"], capsys)
    assert err == f"error: {tmp_path}: a folder, not a config file", err


def test_bad_yaml_names_the_problem_and_its_line(cohort, tmp_path, capsys):
    (tmp_path / "cfg.yaml").write_text("method: fedavg\nengine: {lr: 0.01}\nextra: *nosuch\n")
    err = _refused(["train", "--cohort", str(cohort), "--config", str(tmp_path / "cfg.yaml"), "--no-progress",
                    "--tracking-uri", f"sqlite:///{tmp_path}/ml.db"], capsys)
    assert err == f"error: {tmp_path / 'cfg.yaml'}: not valid YAML (found undefined alias 'nosuch', line 3)", err


def test_a_sweep_file_given_to_train_is_named_as_one(cohort, tmp_path, capsys):
    sweep = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
    err = _refused(["train", "--cohort", str(cohort), "--config", str(sweep), "--no-progress",
                    "--tracking-uri", f"sqlite:///{tmp_path}/ml.db"], capsys)
    assert err == (f"error: --config {sweep}: a sweep file (it lists `methods:`); run it with abps sweep "
                   f"--config {sweep}"), err


@pytest.mark.parametrize("name", ["fedavg.yaml", "vv-fmnist.yaml"])
def test_a_run_config_given_to_sweep_is_named_as_one(name, cohort, tmp_path, capsys):
    run_cfg = Path(__file__).resolve().parents[1] / "configs" / name
    err = _refused(["sweep", "--cohort", str(cohort), "--config", str(run_cfg), "--no-progress",
                    "--tracking-uri", f"sqlite:///{tmp_path}/ml.db"], capsys)
    key = "method" if name == "fedavg.yaml" else "benchmark"
    assert err == (f"error: {run_cfg}: a run config (it names `{key}:`, no `methods:`); run it with abps train "
                   f"--config {run_cfg}"), err
    assert not (tmp_path / "ml.db").exists()


@pytest.mark.parametrize(("text", "words"), [
    ("method: fedavg\nrounds: 2\ndrift: {round: 5, count: 1}\n",
     "cfg.yaml: drift.round 5 is past the run's last round (2): the labels would never flip"),
    ("method: fedavg\nrounds: 2\ndrift: {round: 1, centers: [NOPE]}\n",
     "drift.centers: unknown center_id 'NOPE' (the cohort's centers.parquet lists 3 centers)"),
    ("method: fedavg\nrounds: 2\ndrift: {round: 1, count: 4}\n", "drift.count 4 exceeds the cohort's 3 centers"),
    ("method: fedavg\nrounds: 7\nearly_stopping: {enabled: true, max_rounds: 2}\n",
     "cfg.yaml: rounds: 7 is not used while early_stopping is enabled (early_stopping.max_rounds 2 bounds the run)"),
    ("method: abps\nrounds: 2\nparams: {watch_centers: [NOPE]}\n", "params.watch_centers: unknown center_id 'NOPE'"),
    ("method: fedavg\nrounds: 2\ndrift: {round: true, count: 1}\n", "cfg.yaml: key 'drift.round': a number, not true / false"),
    ("method: fedavg\nrounds: 2\nrealworld: {availability: {kind: always, rate: 0.3}}\n",
     "availability.rate is used only with kind 'bernoulli', not 'always': drop it or change availability.kind"),
    ("method: fedavg\nrounds: 2\nrealworld: {availability: {kind: bernoulli, rate: 0.5, trace: t.csv}}\n",
     "availability.trace is used only with kind 'trace', not 'bernoulli'"),
    ("method: fedavg\nrounds: 2\nrealworld: {deadline: {policy: none, seconds: 5}}\n",
     "deadline.seconds is used only with policy 'fixed', not 'none': drop it or change deadline.policy"),
    ("method: fedavg\nrounds: 2\ndata: {preprocessing: per-center, shrinkage_rows: 10}\n",
     "data.shrinkage_rows is used only with preprocessing 'shrinkage', not 'per-center': drop it or change "
     "data.preprocessing"),
    ("method: fedavg\nrounds: 2\ndata: {preprocessing: federated, small_center: refuse}\n",
     "data.small_center is used only with preprocessing 'auto' or 'per-center', not 'federated'"),
    ("method: fedavg\nrounds: 2\nrealworld: {profiles: {seed: 5}}\n",
     "profiles.seed draws the spreads (low < high); none is given, so it is not used"),
    ("method: fedavg\nrounds: 2\nrealworld: {availability: {kind: daily, utc_offsets: utc, seed: 9}, "
     "round_period_s: 3600}\n", "availability.seed draws the utc_offsets 'spread' only"),
    ("method: abps\nrounds: 2\nrealworld: {deadline: {policy: fixed, seconds: 5}}\n",
     "error: abps: realworld.deadline.policy 'fixed' is not used (a deadline cuts a server's round; this method "
     "has no server); use policy none"),
    ("method: local\nrounds: 2\nexchange: {head_layers: 1}\n",
     "error: local: exchange.head_layers is not used (this method exchanges no model)"),
    ("method: bnn-fl\nrounds: 2\nexchange: {server_momentum: 0.5}\n",
     "error: bnn-fl: exchange.server_momentum is not supported (set it to 0)"),
])
def test_a_run_config_that_would_be_ignored_or_end_in_a_traceback_is_refused(cohort, tmp_path, capsys, text, words):
    """A drift that never happens, a round count that early stopping replaces, a center the cohort
    does not have: one line before any round, never a traceback or a silent change."""
    (tmp_path / "cfg.yaml").write_text(text)
    err = _refused(["train", "--cohort", str(cohort), "--config", str(tmp_path / "cfg.yaml"), "--no-progress",
                    "--tracking-uri", f"sqlite:///{tmp_path}/ml.db", "--output", str(tmp_path / "r.json")], capsys)
    assert words in err, err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(("options", "words"), [
    (["--mean-size", "nan"], "--mean-size must be a finite number"),
    (["--mean-size", "inf"], "--mean-size must be a finite number"),
    (["--mean-size", "0"], "--mean-size must be > 0"),
    (["--mean-size", "1e9"], "about 3,000,000,000 stays, above the 10,000,000"),
    (["--beta", "inf"], "--beta must be a finite number"),
    (["--alpha", "1e9"], "--alpha must be <= 1000"),
    (["--seed", "-3"], "--seed"),
])
def test_synth_fedprox_refuses_numbers_that_would_end_in_a_traceback_or_a_broken_cohort(tmp_path, capsys, options,
                                                                                         words):
    err = _refused(["synth", "fedprox", "--out", str(tmp_path / "g"), "--centers", "3", *options], capsys)
    assert words in err, err
    assert not (tmp_path / "g").exists()


def test_launch_refuses_a_negative_seed(cohort, tmp_path, capsys):
    err = _refused(["launch", "--method", "fedavg", "--cohort", str(cohort), "--output", str(tmp_path / "r.json"),
                    "--local", "3", "--seed", "-1", "--rounds", "1"], capsys)
    assert "--seed" in err and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(("extra", "words"), [
    (["--host", "999.1.1.1"], "--host 999.1.1.1: not an address of this machine"),
    (["--experiment", "nosuch"], "--experiment 'nosuch': no such MLflow experiment in "),
])
def test_ui_names_a_bad_host_or_an_unknown_experiment_before_a_server_starts(tmp_path, capsys, extra, words):
    err = _refused(["ui", "--port", "5989", "--tracking-uri", f"sqlite:///{tmp_path}/ml.db", *extra], capsys)
    assert words in err, err


def test_ui_on_an_mlflow_server_refuses_the_local_uis_options_and_names_a_server_that_is_down(capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    for opt, value in (("--port", "7777"), ("--host", "0.0.0.0")):
        err = _refused(["ui", "--tracking-uri", uri, opt, value], capsys)
        assert err == (f"error: {opt} applies to a UI started here; the tracking URI {uri} is an MLflow server, "
                       "whose UI is already served: drop it")
    err = _refused(["ui", "--tracking-uri", uri, "--experiment", "x"], capsys)
    assert err.startswith(f"error: MLflow tracking server {uri}: cannot connect ("), err


def test_a_deleted_experiment_is_named_before_a_run_starts(cohort, tmp_path, capsys):
    import mlflow

    uri = f"sqlite:///{tmp_path}/ml.db"
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("gone")
    client.delete_experiment(exp)
    capsys.readouterr()  # MLflow's own lines on making the store
    err = _refused(["train", "--cohort", str(cohort), "--method", "fedavg", "--rounds", "1", "--no-progress",
                    "--experiment", "gone", "--tracking-uri", uri, "--output", str(tmp_path / "r.json")], capsys)
    assert err == (f"error: MLflow experiment 'gone' is deleted in {uri}: restore it (mlflow experiments restore "
                   f"--experiment-id {exp}) or give another --experiment")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("command", [["runs"], ["report", "--out", "rep"]])
def test_a_tracking_uri_of_no_store_in_the_environment_is_named(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "foo://x")
    err = _refused(command, capsys)
    assert err == ("error: MLFLOW_TRACKING_URI foo://x: no MLflow store has the scheme 'foo' (e.g. "
                   "sqlite:///mlflow/mlflow.db or http://HOST:5000)")


def test_an_empty_tracking_uri_is_refused(cohort, tmp_path, capsys):
    err = _refused(["train", "--cohort", str(cohort), "--method", "fedavg", "--rounds", "1", "--tracking-uri", " ",
                    "--output", str(tmp_path / "r.json")], capsys)
    assert "--tracking-uri: an empty URI" in err and not (tmp_path / "r.json").exists()


def _single_value_options() -> list[tuple[list[str], str]]:
    """(command path, option) for every option of every command that takes one value, walked from
    the CLI itself: a new command or option is covered without listing it."""
    import typer.main

    from cli.app import _register, app, single_value_options

    _register()
    out = []

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None) or {}
        for name, sub in sorted(subs.items()):
            walk(sub, [*path, name])
        if not subs:
            _, single = single_value_options(path)
            out.extend((path, opt) for opt in sorted(set(single.values())) if opt != "--help")

    walk(typer.main.get_command(app), [])
    return out


def test_every_single_value_option_given_twice_is_refused(capsys):
    """click keeps the last of two values without a word; every command refuses the second instead."""
    from cli.app import main

    cases = _single_value_options()
    assert len(cases) > 60 and (["train"], "--rounds") in cases and (["synth", "mimic"], "--seed") in cases
    for path, opt in cases:
        with pytest.raises(SystemExit) as exc:
            main([*path, opt, "1", opt, "2"])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and err == f"error: {opt}: given twice (it takes one value; give it once)", \
            (path, opt, err)


@pytest.mark.parametrize("command", [["runs"], ["report", "--out", "rep"]])
def test_a_foreign_sqlite_database_is_refused_and_left_as_it_is(command, tmp_path, capsys, monkeypatch):
    """Reading commands fell back to MLflow's client, which added its tables to the user's database."""
    import sqlite3

    db = tmp_path / "other.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE foo (x INTEGER)")
    monkeypatch.chdir(tmp_path)
    err = _refused([*command, "--experiment", "x", "--tracking-uri", f"sqlite:///{db}"], capsys)
    assert err == (f"error: MLflow store {db}: an SQLite database that MLflow did not write (no MLflow tables); "
                   "give another --tracking-uri")
    with sqlite3.connect(db) as con:
        assert [r[0] for r in con.execute("SELECT name FROM sqlite_master")] == ["foo"]


def test_a_tracking_uri_of_no_mlflow_scheme_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = _refused(["runs", "--tracking-uri", "bogus://x"], capsys)
    assert err == ("error: --tracking-uri bogus://x: no MLflow store has the scheme 'bogus' "
                   "(e.g. sqlite:///mlflow/mlflow.db or http://HOST:5000)")


def test_an_mlflow_error_names_what_failed_not_sqlalchemys_advice(capsys):
    """A store that refuses a write (an immutable file): SQLAlchemy's autoflush advice came first."""
    from mlflow.exceptions import MlflowException

    from cli.app import _report

    exc = MlflowException("(raised as a result of Query-invoked autoflush; consider using a session.no_autoflush "
                          "block if this flush is occurring prematurely)\n(sqlite3.OperationalError) attempt to "
                          "write a readonly database\n[SQL: INSERT INTO runs (run_uuid) VALUES (?)]")
    with pytest.raises(SystemExit) as e:
        _report(exc)
    assert e.value.code == 2
    assert capsys.readouterr().err == ("error: MLflow: the store cannot be written (attempt to write a readonly "
                                       "database); give another --tracking-uri (abps report: or --no-log)\n")
    with pytest.raises(SystemExit):
        _report(MlflowException("(raised as a result of Query-invoked autoflush; ...)\n(sqlite3.OperationalError) "
                                "disk I/O error\n[SQL: ...]"))
    assert capsys.readouterr().err == "error: MLflow: (sqlite3.OperationalError) disk I/O error\n"


def test_sweep_workers_beyond_the_thread_bound_are_refused(cohort, tmp_path, capsys):
    err = _refused(["sweep", "--config", str(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"),
                    "--cohort", str(cohort), "--workers", "100000", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"], capsys)
    assert err == "error: --workers 100000: at most 1024"
    assert not (tmp_path / "m.db").exists()


def _apart_bases(cohort: Path, tmp_path: Path) -> dict[tuple[str, ...], list[str]]:
    """A base invocation of every command with a file output, reading a run config, a cohort and
    (where it logs) an MLflow store; a command that gains a file output fails the test below until
    it has one here."""
    from federation.p2p.local import center_list

    peers = tmp_path / "peers.txt"
    peers.write_text("".join(f"{c} 127.0.0.1:{7100 + i}\n" for i, c in enumerate(center_list(cohort))))
    common = ["--cohort", str(cohort), "--method", "fedavg", "--rounds", "1", "--config", str(tmp_path / "run.yaml")]
    store = ["--tracking-uri", f"sqlite:///{tmp_path / 'ml.db'}"]
    return {("train",): ["train", *common, *store],
            ("launch",): ["launch", "--local", "3", *common, *store],
            ("peer",): ["peer", "--center", center_list(cohort)[0], "--peers", str(peers), "--seed", "1", "--insecure",
                        *common]}


def _apart_cases() -> list[tuple[tuple[str, ...], str, str]]:
    """(command, file output, what it must not overwrite): the MLflow store only for commands that
    take --tracking-uri (the others log nothing)."""
    from tests.option_matrix import commands

    logs = {path for path, cmd in commands().items() if any(p.name == "tracking_uri" for p in cmd.params)}
    return [(path, option, target) for path, option in _file_options()
            for target in ("the run config", "the MLflow store", "a file of the cohort folder")
            if target != "the MLflow store" or path in logs]


@pytest.mark.parametrize(("path", "option", "target"), _apart_cases())
def test_a_file_output_never_overwrites_what_the_command_reads(path, option, target, cohort, tmp_path, capsys):
    import shutil

    c = tmp_path / "c"
    shutil.copytree(cohort, c)
    (c / "cohort_report.json").write_text("{}")
    (tmp_path / "run.yaml").write_text("method: fedavg\n")
    base = _apart_bases(c, tmp_path)[path]
    (tmp_path / "ml.db").write_bytes(b"")  # a new, empty store
    victim = {"the run config": tmp_path / "run.yaml", "the MLflow store": tmp_path / "ml.db",
              "a file of the cohort folder": c / "cohort_report.json"}[target]
    before = victim.read_bytes()
    others = ["--output", str(tmp_path / "r.json")] if option != "--output" else []
    err = _refused([*base, *others, option, str(victim)], capsys)
    assert err == f"error: {option} {victim}: would overwrite {target}", err
    assert victim.read_bytes() == before


def test_a_capture_is_a_new_file_and_a_workdir_a_folder(cohort, tmp_path, capsys):
    (tmp_path / "run.yaml").write_text("method: fedavg\n")
    bases = _apart_bases(cohort, tmp_path)
    peer = [*bases[("peer",)], "--output", str(tmp_path / "r.json")]
    old = tmp_path / "old.bin"
    old.write_bytes(b"earlier messages")
    err = _refused([*peer, "--capture", str(old)], capsys)
    assert err == f"error: --capture {old}: exists; a capture is appended to only by a peer that rejoins " \
                  "(--rejoin); give a new file"
    assert old.read_bytes() == b"earlier messages"
    assert _refused([*peer, "--capture", str(tmp_path)], capsys) == f"error: --capture {tmp_path}: is a directory " \
                                                                       "(give a file)"
    launch = [*bases[("launch",)], "--output", str(tmp_path / "l.json")]
    assert _refused([*launch, "--workdir", str(old)], capsys) == f"error: --workdir {old}: is a file, not a folder"
    assert _refused([*launch, "--workdir", str(old / "sub")], capsys) == \
        f"error: --workdir {old / 'sub'}: cannot make the folder (Not a directory)"


def test_cache_clear_keeps_the_folder_abps_cache_dir_names(tmp_path, monkeypatch, capsys):
    for var, root, kept in (("ABPS_CACHE_DIR", tmp_path / "mine", True), ("XDG_CACHE_HOME", tmp_path / "xdg", False)):
        monkeypatch.delenv("ABPS_CACHE_DIR", raising=False)
        monkeypatch.setenv(var, str(root))
        folder = root if var == "ABPS_CACHE_DIR" else root / "abps"  # the program's own folder under XDG
        (folder / "kernels").mkdir(parents=True)
        (folder / "kernels" / "k.so").write_bytes(b"\0")
        main(["cache", "clear"])
        assert "cache clear: 0.0 MiB freed" in capsys.readouterr().out
        assert folder.is_dir() == kept and not (folder / "kernels").exists() and root.is_dir()


def test_training_into_an_experiment_of_another_cohort_is_noted(tmp_path, capsys):
    """Two cohort folders of the same name share the default experiment (the folder's name): the
    second training says so, since `abps runs` and the report show one cohort at a time."""
    from federation.data.synthetic import write_fedprox_cohort

    uri = f"sqlite:///{tmp_path / 'ml.db'}"
    note = "note: experiment cohort also holds runs on another cohort"
    for i, seed in enumerate((1, 2, 2)):  # the third trains the second cohort again: the first is still there
        c = write_fedprox_cohort(tmp_path / ("a" if i == 0 else "b") / "cohort", n_centers=3, seed=seed,
                                 mean_size=40.0) if i < 2 else tmp_path / "b" / "cohort"
        main(["train", "--cohort", str(c), "--method", "fedavg", "--rounds", "1", "--tracking-uri", uri,
              "--output", str(tmp_path / f"r{i}.json"), "--no-progress"])
        err = capsys.readouterr().err
        assert (note in err) == (i > 0), err


@pytest.mark.parametrize("source", ["mimic", "eicu", "meds"])
def test_etl_rebuilds_its_own_cohort_and_replaces_another_only_with_force(source, mimic_demo_dir, eicu_demo_dir,
                                                                          tmp_path, monkeypatch, capsys):
    """The same settings rebuild --out (the same files); another task is refused in one line that
    names the setting, the folder untouched; --force replaces it."""
    src = {"mimic": mimic_demo_dir, "eicu": eicu_demo_dir,
           "meds": mimic_demo_dir.parent / "mimic-iv-demo-extra" / "meds-official"}[source]
    monkeypatch.chdir(tmp_path)
    argv = ["etl", "--source", source, "--data-dir", str(src), "--out", "c", "--min-center-stays", "1"] + {
        "mimic": ["--chart-cache", "off"], "eicu": [], "meds": ["--meds-splits", "tuning,held_out"]}[source]
    main([*argv, "--threads", "1"])
    first = {f.name: f.read_bytes() for f in (tmp_path / "c").glob("*.parquet")}
    main([*argv, "--threads", "2"])  # how it is built is no other setting
    assert {f.name: f.read_bytes() for f in (tmp_path / "c").glob("*.parquet")} == first
    capsys.readouterr()
    other, was, now = ("--min-age", "min_age 18.0", "60.0") if source == "meds" else ("--task", "task 'in-hospital-mortality'", "'los-3'")
    value = "60" if source == "meds" else "los-3"
    err = _refused([*argv, other, value], capsys)
    assert err == (f"error: --out c: holds a cohort built with other settings ({was}, now {now}); give --force "
                   "to replace it, or another --out")
    assert {f.name: f.read_bytes() for f in (tmp_path / "c").glob("*.parquet")} == first
    main([*argv, other, value, "--force"])
    assert json.loads((tmp_path / "c" / "cohort_report.json").read_text())["options"][other[2:].replace("-", "_")] \
        == json.loads(now.replace("'", '"'))


@pytest.mark.parametrize("kind", ["loop", "long"])
@pytest.mark.parametrize("command", [
    ["synth", "fedprox", "--centers", "2", "--out", "{p}"],
    ["train", "--method", "fedavg", "--rounds", "1", "--no-progress", "--tracking-uri", "none",
     "--cohort", "{cohort}", "--output", "{p}/r.json"],
    ["train", "--method", "fedavg", "--rounds", "1", "--no-progress", "--tracking-uri", "none", "--cohort", "{p}"],
    ["sweep", "--config", "{p}"],
])
def test_a_path_that_is_a_link_loop_or_too_long_a_name_is_named_in_one_line(command, kind, cohort, tmp_path, capsys,
                                                                            monkeypatch):
    """Whichever command meets it first (pathlib's resolve, open, mkdir, a stat): one line naming
    the path and the system's reason, exit 2, never a traceback."""
    monkeypatch.chdir(tmp_path)
    if kind == "loop":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        p, words = "a", ("a loop of symbolic links", "too many levels of symbolic links", "a loop of them")
    else:
        p, words = "x" * 300, ("file name too long",)
    err = _refused([arg.format(p=p, cohort=cohort) for arg in command], capsys)
    assert any(w in err for w in words) and p in err, err

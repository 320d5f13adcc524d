"""Outputs and the MLflow store under faults: a damaged or foreign store, a read-only store or
output folder, a full disk, an output path that cannot be a file; outputs committed whole (a cohort
folder swapped as one unit, a results file created only if absent); per-center figures under the
subgroups' small-cell rule; runs of one method with different configs not pooled."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from cli.app import main

REPO = Path(__file__).resolve().parents[1]


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run ``abps ARGS`` in-process; (exit code, stdout, stderr)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, *needles: str) -> str:
    assert code == 2, (code, err[-800:])
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("warning:", "cohort:"))
             and " INFO " not in ln]  # MLflow's own log lines on creating a store
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    """A synthetic FedProx cohort of 6 centers: some centers' test cells hold fewer than 30 rows."""
    from federation.data.synthetic import write_fedprox_cohort

    return write_fedprox_cohort(tmp_path_factory.mktemp("c") / "cohort", n_centers=6, seed=3, mean_size=120.0)


def _train(cohort: Path, uri: str, *extra: str) -> list[str]:
    return ["train", "--method", "fedavg", "--cohort", str(cohort), "--seeds", "1", "--rounds", "1",
            "--tracking-uri", uri, "--no-progress", *extra]


def _mlflow_runs(uri: str, experiment: str = "cohort") -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id])


# ---------------------------------------------------------------------------------- the store


def test_a_damaged_or_foreign_store_is_one_line_naming_it(cohort, tmp_path, capsys):
    good = tmp_path / "good.db"
    assert cli(capsys, *_train(cohort, f"sqlite:///{good}", "--output", str(tmp_path / "r0.json")))[0] == 0
    truncated = tmp_path / "truncated.db"
    truncated.write_bytes(good.read_bytes()[:4096 + 100])  # the header survives, the tables do not
    foreign = tmp_path / "foreign.db"
    foreign.write_text("name,value\na,1\n")
    for db in (truncated, foreign):
        before = db.read_bytes()
        line = one_line_error(*cli(capsys, "runs", "--tracking-uri", f"sqlite:///{db}")[::2], str(db))
        assert "MLflow store" in line
        one_line_error(*cli(capsys, *_train(cohort, f"sqlite:///{db}", "--output", str(tmp_path / "r.json")))[::2],
                       str(db))
        assert db.read_bytes() == before and not (tmp_path / "r.json").exists()


@contextlib.contextmanager
def _tmpfs(where: Path, size: str = "4m"):
    """A small tmpfs mounted at ``where`` (root only; CI runs as root)."""
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if r.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs as root: {r.stderr.decode()[:200]}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")


@contextlib.contextmanager
def _read_only_view(src: Path, where: Path):
    """``src`` bind-mounted read-only at ``where`` (root only)."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(src), str(where)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(where)], check=True)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@needs_root
def test_a_read_only_store_is_read_and_never_written(cohort, tmp_path, capsys):
    rw = tmp_path / "rw"
    rw.mkdir()
    assert cli(capsys, *_train(cohort, f"sqlite:///{rw / 'mlflow.db'}", "--output", str(tmp_path / "r0.json")))[0] == 0
    with _read_only_view(rw, tmp_path / "ro") as ro:
        uri = f"sqlite:///{ro / 'mlflow.db'}"
        code, out, err = cli(capsys, "runs", "--tracking-uri", uri)
        assert code == 0 and "fedavg" in out and "Traceback" not in err, err
        one_line_error(*cli(capsys, *_train(cohort, uri, "--output", str(tmp_path / "r.json")))[::2],
                       str(ro / "mlflow.db"), "not writable")
        assert not (tmp_path / "r.json").exists()
        assert sorted(p.name for p in ro.iterdir()) == sorted(p.name for p in rw.iterdir())


def test_an_output_that_cannot_be_written_fails_before_the_work(cohort, tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    (tmp_path / "outfile").write_text("keep")
    one_line_error(*cli(capsys, *_train(cohort, uri, "--output", str(tmp_path / "outfile" / "results.json")))[::2],
                   "--output", "outfile")
    assert (tmp_path / "outfile").read_text() == "keep"
    assert _mlflow_runs(uri) == []  # refused before any MLflow run started, not after training


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_in_a_folder_that_takes_no_file_fails_before_the_work(cohort, tmp_path, capsys):
    # /proc passes the permission bits for root and is not mounted read-only: only a try tells
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    code, _, err = cli(capsys, *_train(cohort, uri, "--output", "/proc/abps-results.json"))
    one_line_error(code, err, "--output /proc/abps-results.json: /proc")
    assert _mlflow_runs(uri) == []


@needs_root
def test_a_read_only_output_folder_fails_before_the_work(cohort, tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    (tmp_path / "rw").mkdir()
    with _read_only_view(tmp_path / "rw", tmp_path / "ro") as ro:
        one_line_error(*cli(capsys, *_train(cohort, uri, "--output", str(ro / "results.json")))[::2],
                       "--output", "not writable")
    assert _mlflow_runs(uri) == []


@needs_root
def test_a_full_disk_is_one_line_and_keeps_the_previous_results(cohort, tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    with _tmpfs(tmp_path / "small", "1m") as small:
        out = small / "results.json"
        out.write_text('{"previous": true}\n')
        fd = os.open(small / "filler", os.O_WRONLY | os.O_CREAT)  # fill the disk up
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        code, _, err = cli(capsys, *_train(cohort, uri, "--output", str(out), "--force"))
        one_line_error(code, err, str(out), "No space left on device")
        assert out.read_text() == '{"previous": true}\n'
        assert sorted(p.name for p in small.iterdir()) == ["filler", "results.json"]  # no temporary left


@needs_root
def test_a_full_disk_under_etl_out_is_one_line_and_keeps_the_previous_cohort(mimic_demo_dir, tmp_path, capsys):
    """The disk fills while `abps etl` writes its Parquet files (Polars words that as "File out of
    specification" or "Invalid thrift"): one line naming --out and the reason, the previous
    cohort folder intact, no temporary folder left."""
    args = ("etl", "--mimic-dir", str(mimic_demo_dir), "--window-years", "20", "--min-center-stays", "1")
    assert cli(capsys, *args, "--out", str(tmp_path / "ref"))[0] == 0
    with _tmpfs(tmp_path / "small", "1m") as small:
        out = small / "cohort"
        shutil.copytree(tmp_path / "ref", out)
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        filler = small / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        os.truncate(filler, filler.stat().st_size - 8192)  # room for the temporary folder, not the files
        code, _, err = cli(capsys, *args, "--out", str(out), "--chart-cache", "off")
        one_line_error(code, err, f"--out {out}: cannot write there (No space left on device)")
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        assert sorted(p.name for p in small.iterdir()) == ["cohort", "filler"]


def test_a_refused_write_worded_by_atomic_write_text_names_out_not_the_temporary_folder(tmp_path):
    """atomic_write_text words a full disk as "cannot write <temporary path>: ..."; inside a folder
    output that becomes the --out line. Any other InputError passes unchanged."""
    import errno

    from etl.errors import InputError
    from etl.io import atomic_output_dir, atomic_write_text

    out = tmp_path / "o"

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(InputError) as e, atomic_output_dir(out) as tmp:
        real = os.replace
        try:
            os.replace = full  # the rename of atomic_write_text's temporary file
            atomic_write_text(tmp / "cohort_report.json", "{}")
        finally:
            os.replace = real
    assert str(e.value) == f"--out {out}: cannot write there ({os.strerror(errno.ENOSPC)})"
    with pytest.raises(InputError, match="^bad value in x.csv$"), atomic_output_dir(out):
        raise InputError("bad value in x.csv")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_write_refused_reads_the_errno_or_probes_the_folder(tmp_path):
    import errno

    from etl.io import write_refused

    try:
        try:
            raise OSError(errno.ENOSPC, "full")
        except OSError as inner:
            raise RuntimeError("parquet: underlying IO error") from inner
    except RuntimeError as exc:
        assert write_refused(tmp_path, exc) == os.strerror(errno.ENOSPC)
    # an error that is not a refused write, in a folder that takes the probe: not a write failure
    assert write_refused(tmp_path, ValueError("bad value")) is None
    assert list(tmp_path.iterdir()) == []  # the probe file is removed
    # the probe meets a file size limit (RLIMIT_FSIZE): its reason
    code = ("import resource, pathlib, sys; from etl.io import write_refused; "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)); "
            f"print(write_refused(pathlib.Path({str(tmp_path)!r}), ValueError('x')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.stdout.strip() == os.strerror(errno.EFBIG), r.stderr[-500:]


# ---------------------------------------------------------------------------------- commits


def test_a_results_file_written_meanwhile_is_not_overwritten(cohort, tmp_path, capsys, monkeypatch):
    """Two `abps train --output r.json` at once: the one that finishes second finds r.json written
    after its start check, and fails instead of overwriting it (no --force)."""
    from federation.run.tracking import Tracker

    out = tmp_path / "r.json"
    real = Tracker.log_json

    def other_run_finishes(self, obj, name):  # the other run commits while this one trains
        if name == "results.json" and not out.exists():
            out.write_text('{"other": true}\n')
        return real(self, obj, name)

    monkeypatch.setattr(Tracker, "log_json", other_run_finishes)
    code, _, err = cli(capsys, *_train(cohort, f"sqlite:///{tmp_path / 'm.db'}", "--output", str(out)))
    one_line_error(code, err, str(out), "exists", "--force")
    assert out.read_text() == '{"other": true}\n'
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".r.json")] == []


def test_a_cohort_folder_is_replaced_as_one_unit(tmp_path, monkeypatch):
    """After every file-system step of the commit, the output folder holds the old files or the
    new ones, never a mix (two writers at once then never leave cohort.parquet from one and
    centers.parquet from the other); a file the new output does not write is kept."""
    import etl.io as eio

    out = tmp_path / "cohort"
    out.mkdir()
    for name in ("cohort.parquet", "centers.parquet", "cohort_report.json"):
        (out / name).write_text(f"old {name}")
    (out / "notes.txt").write_text("the user's")
    states: list[dict[str, str]] = []

    def snap():
        states.append({p.name: p.read_text() for p in out.iterdir()} if out.is_dir() else {})

    for name in ("replace", "rename", "link"):
        real = getattr(os, name)

        def wrapped(*a, _real=real, **k):
            r = _real(*a, **k)
            snap()
            return r

        monkeypatch.setattr(eio.os, name, wrapped)
    real_exchange = eio._exchange

    def exchange(a, b):
        r = real_exchange(a, b)
        snap()
        return r

    monkeypatch.setattr(eio, "_exchange", exchange)
    with eio.atomic_output_dir(out) as tmp:
        for name in ("cohort.parquet", "centers.parquet", "cohort_report.json"):
            (tmp / name).write_text(f"new {name}")
        states.clear()
    snap()
    old = {n: f"old {n}" for n in ("cohort.parquet", "centers.parquet", "cohort_report.json")}
    new = {n: f"new {n}" for n in old}
    for s in states:
        files = {k: v for k, v in s.items() if k != "notes.txt"}
        assert files in (old, new), s
    assert states[-1] == {**new, "notes.txt": "the user's"}
    assert [p.name for p in tmp_path.iterdir()] == ["cohort"]


def test_two_etl_runs_at_once_leave_one_whole_output(mimic_demo_dir, tmp_path):
    """Two `abps etl --out X` with different seeds, started together: X is one of them, whole."""
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "ABPS_STATE": os.environ["ABPS_STATE"]}
    out = tmp_path / "x"

    def etl(dest: Path, seed: int) -> list[str]:
        return [sys.executable, "-c", "from cli.app import main; main()", "etl", "--mimic-dir", str(mimic_demo_dir),
                "--out", str(dest), "--window-years", "20", "--min-center-stays", "1", "--threads", "1",
                "--chart-cache", "off", "--seed", str(seed)]

    procs = [subprocess.Popen(etl(out, s), env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True) for s in (1, 2)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()[-500:]
    seed = json.loads((out / "cohort_report.json").read_text())["options"]["seed"]
    ref = tmp_path / "ref"
    r = subprocess.run(etl(ref, seed), env=env, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-500:]
    for name in ("cohort.parquet", "centers.parquet"):
        assert pl.read_parquet(out / name).equals(pl.read_parquet(ref / name)), name
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_train_refuses_a_cohort_folder_mixing_two_etl_runs(mimic_demo_dir, tmp_path, capsys):
    """cohort.parquet of one `abps etl` run beside centers.parquet of another (copied in by hand,
    or left by a writer that replaced files one by one), or the other way round: the SHA-256 the
    report records differs, and train refuses the folder with one line naming it and the file."""
    from etl.io import check_cohort_files, cohort_digests
    from etl.mimic import EtlOptions, run_etl

    runs = {}
    for seed in (1, 2):
        runs[seed] = tmp_path / f"s{seed}"
        rep = run_etl(mimic_demo_dir, runs[seed], EtlOptions(window_years=20, min_center_stays=1, seed=seed,
                                                              chart_cache="off"))
        assert rep["files"] == cohort_digests(runs[seed])  # the report records the pair it was written with
        check_cohort_files(runs[seed])
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    for swapped in ("centers.parquet", "cohort.parquet"):
        assert (runs[1] / swapped).read_bytes() != (runs[2] / swapped).read_bytes()
        mixed = tmp_path / f"mixed-{swapped}"
        mixed.mkdir()
        for name in ("cohort.parquet", "centers.parquet", "cohort_report.json"):
            (mixed / name).write_bytes((runs[2 if name == swapped else 1] / name).read_bytes())
        code, _, err = cli(capsys, *_train(mixed, uri, "--output", str(tmp_path / "r.json")))
        line = one_line_error(code, err, str(mixed), swapped, "cohort_report.json", "different runs")
        assert line.startswith(f"error: {mixed / swapped} is not the file cohort_report.json records"), line
        assert not (tmp_path / "r.json").exists()


def test_train_refuses_a_synthetic_cohort_folder_mixing_two_runs(cohort, tmp_path, capsys):
    from federation.data.synthetic import write_fedprox_cohort

    other = write_fedprox_cohort(tmp_path / "other", n_centers=6, seed=4, mean_size=120.0)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("cohort.parquet", "fedprox_manifest.json"):
        (mixed / name).write_bytes((cohort / name).read_bytes())
    (mixed / "centers.parquet").write_bytes((other / "centers.parquet").read_bytes())
    code, _, err = cli(capsys, *_train(mixed, f"sqlite:///{tmp_path / 'm.db'}"))
    one_line_error(code, err, str(mixed), "centers.parquet", "fedprox_manifest.json")
    (mixed / "fedprox_manifest.json").write_text("{not json")
    code, _, err = cli(capsys, *_train(mixed, f"sqlite:///{tmp_path / 'm.db'}"))
    one_line_error(code, err, "fedprox_manifest.json", "not readable JSON")


# ---------------------------------------------------------------------------------- privacy


def test_per_center_figures_obey_the_small_cell_rule(cohort, tmp_path, capsys):
    """per_center.json and clinical_per_center.csv leave out the test figures of a center whose test
    cell is small by the subgroups' rule (fewer than 30 rows or 5 of either class)."""
    from mlflow.tracking import MlflowClient

    from federation.core.clinical import MIN_CELL_EVENTS, MIN_CELL_ROWS, is_small_cell

    assert (MIN_CELL_ROWS, MIN_CELL_EVENTS) == (30, 5)
    assert [is_small_cell(n, p) for n, p in ((29, 10), (30, 5), (30, 4), (30, 26), (30, 25), (40, None), (2, None))] \
        == [True, False, True, True, False, False, True]
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    assert cli(capsys, *_train(cohort, uri, "--output", str(tmp_path / "r.json")))[0] == 0
    coh = pl.read_parquet(cohort / "cohort.parquet").filter(pl.col("split") == "test")
    counts = {r["center_id"]: (r["n"], r["pos"]) for r in coh.group_by("center_id").agg(
        pl.len().alias("n"), pl.col("label").sum().alias("pos")).iter_rows(named=True)}
    small = {c for c, (n, p) in counts.items() if n < 30 or p < 5 or n - p < 5}
    assert small and small != set(counts)  # the cohort has both kinds of center
    client = MlflowClient(uri)
    child = next(r for r in _mlflow_runs(uri) if "mlflow.parentRunId" in r.data.tags)
    pc = json.loads(Path(client.download_artifacts(child.info.run_id, "per_center.json", str(tmp_path))).read_text())
    rows = list(csv.DictReader(open(client.download_artifacts(child.info.run_id, "clinical_per_center.csv",
                                                              str(tmp_path)))))
    assert set(pc) == set(counts) and {r["center_id"] for r in rows} == set(counts)
    for cid, fig in pc.items():
        assert fig["suppressed"] is (cid in small)
        if cid in small:
            assert all(fig[k] is None for k in ("n_test", "n_pos", "brier", "test_auroc", "auprc", "ece"))
            assert fig["n_train"] > 0
        else:
            assert (fig["n_test"], fig["n_pos"]) == counts[cid] and fig["brier"] is not None
    for r in rows:
        assert (r["suppressed"] == "True") is (r["center_id"] in small)
        if r["center_id"] in small:
            assert r["n_test"] == r["n_pos"] == r["brier"] == ""
        else:
            assert (int(r["n_test"]), int(r["n_pos"])) == counts[r["center_id"]]


# ---------------------------------------------------------------------------------- abps runs


def test_runs_of_one_method_with_different_configs_are_not_pooled(cohort, tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    lr = tmp_path / "lr.yaml"
    lr.write_text("method: fedavg\nengine: {lr: 0.05}\n")
    assert cli(capsys, *_train(cohort, uri, "--output", str(tmp_path / "a.json")))[0] == 0
    assert cli(capsys, *_train(cohort, uri, "--output", str(tmp_path / "b.json"), "--config", str(lr)))[0] == 0
    code, out, _ = cli(capsys, "runs", "--tracking-uri", uri)
    assert code == 0
    # the latest configuration is shown (one seed), the other named in a note, never pooled silently
    assert "fedavg: 1 earlier run(s) with another configuration left out" in out
    assert "finished runs (1)" in out  # the latest configuration's seed, not both runs of seed 1 pooled


def test_a_kappa_1_run_is_not_labelled_kappa_3(cohort, tmp_path, capsys):
    from federation.report import collect_runs
    from federation.run.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    assert cli(capsys, "train", "--method", "abps", "--param", "kappa=1", "--cohort", str(cohort), "--seeds", "1",
               "--rounds", "1", "--tracking-uri", uri, "--no-progress", "--output", str(tmp_path / "r.json"))[0] == 0
    (cell,) = collect_runs(Tracker(uri, "cohort", create=False)).cells
    assert cell.label == "abps [kappa=1]"
    code, out, _ = cli(capsys, "runs", "--tracking-uri", uri)
    assert code == 0 and "kappa=3" not in out and "abps [kappa=1]" in out
    # kappa 1.0 in a config file is the same configuration: the same row, the same config hash
    (tmp_path / "k.yaml").write_text("method: abps\nparams: {kappa: 1.0}\n")
    assert cli(capsys, "train", "--config", str(tmp_path / "k.yaml"), "--cohort", str(cohort), "--seeds", "1",
               "--rounds", "1", "--tracking-uri", uri, "--no-progress", "--output", str(tmp_path / "r2.json"))[0] == 0
    docs = [json.loads((tmp_path / f).read_text()) for f in ("r.json", "r2.json")]
    assert docs[0]["config"]["params"] == docs[1]["config"]["params"] == {"kappa": 1}
    code, out, _ = cli(capsys, "runs", "--tracking-uri", uri)
    assert code == 0 and out.count("abps [kappa=1]") == 1 and "kappa=1.0" not in out


def test_cohort_identity_and_manifest_check_read_the_files_once(tmp_path, monkeypatch):
    """cohort_id keeps its value (SHA-256 of each name then bytes, first 16 hex digits), the
    per-file digests are each file's SHA-256, and identity + manifest check open each file once."""
    import builtins
    import hashlib

    from etl import io as etl_io
    from federation.data.tensors import cohort_id

    (tmp_path / "cohort.parquet").write_bytes(b"abc" * 1000)
    (tmp_path / "centers.parquet").write_bytes(b"xyz")
    want = hashlib.sha256(b"cohort.parquet" + b"abc" * 1000 + b"centers.parquet" + b"xyz").hexdigest()[:16]
    (tmp_path / "cohort_report.json").write_text(json.dumps({"files": {
        "cohort.parquet": hashlib.sha256(b"abc" * 1000).hexdigest(),
        "centers.parquet": hashlib.sha256(b"xyz").hexdigest()}}))
    opened: list[str] = []
    real_open = builtins.open

    def counting_open(file, *a, **k):
        if str(file).endswith(".parquet"):
            opened.append(Path(file).name)
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", counting_open)
    etl_io._digests_of.cache_clear()
    assert cohort_id(tmp_path) == want
    etl_io.check_cohort_files(tmp_path)  # matches the manifest: no error, no second read
    assert sorted(opened) == ["centers.parquet", "cohort.parquet"]
    (tmp_path / "centers.parquet").write_bytes(b"xyw")  # a changed file is read again and refused
    os.utime(tmp_path / "centers.parquet", ns=(1, 1))
    with pytest.raises(etl_io.InputError, match="centers.parquet is not the file"):
        etl_io.check_cohort_files(tmp_path)


def test_an_earlier_read_only_output_leaves_nothing_behind(tmp_path, monkeypatch):
    """Replacing an output whose folders are read-only: the old folder, swapped into the temporary
    side, is removed whole (it stayed as a hidden .NAME.tmp-* folder with its rows). Removing an
    entry needs a writable folder, as for any user; root's override is taken away by checking the
    folder's mode bits before each removal."""
    import os
    import stat

    from etl.io import atomic_output_dir

    def as_a_user(remove):
        def checked(path, *, dir_fd=None):
            folder = os.fstat(dir_fd) if dir_fd is not None else os.stat(os.path.dirname(os.fspath(path)) or ".")
            if not folder.st_mode & stat.S_IWUSR:
                raise PermissionError(13, "Permission denied", os.fspath(path))
            return remove(path, dir_fd=dir_fd)
        return checked

    out = tmp_path / "o"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "rows.parquet").write_bytes(b"rows")
    (out / "sub").chmod(0o555)
    out.chmod(0o555)
    monkeypatch.setattr(os, "unlink", as_a_user(os.unlink))
    monkeypatch.setattr(os, "rmdir", as_a_user(os.rmdir))
    with atomic_output_dir(out) as tmp:
        (tmp / "new.txt").write_text("new")
    assert (out / "new.txt").read_text() == "new" and (out / "sub" / "rows.parquet").read_bytes() == b"rows"
    assert sorted(q.name for q in tmp_path.iterdir()) == ["o"]


def test_a_failed_removal_leaves_the_parent_folder_as_it_was(tmp_path, monkeypatch):
    """Only folders inside the temporary tree are made writable to remove it: the folder that holds
    --out (a shared folder, /tmp) keeps its mode when the removal fails."""
    import os
    import stat
    import warnings

    from etl.io import atomic_output_dir

    parent = tmp_path / "shared"
    (parent / "o").mkdir(parents=True)
    parent.chmod(0o1777)
    real_rmdir = os.rmdir

    def refuse_the_root(path, *, dir_fd=None):
        if os.path.basename(os.fspath(path)).startswith(".o.tmp-"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_rmdir(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "rmdir", refuse_the_root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with atomic_output_dir(parent / "o") as tmp:
            (tmp / "new.txt").write_text("new")
    assert stat.S_IMODE(parent.stat().st_mode) == 0o1777
    assert any("could not be removed" in str(w.message) for w in caught)


def test_an_out_that_is_a_link_writes_into_the_folder_it_names(tmp_path):
    from etl.io import atomic_output_dir

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with atomic_output_dir(tmp_path / "link") as tmp:
        (tmp / "new.txt").write_text("new")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real" / "new.txt").read_text() == "new"
    assert sorted(q.name for q in tmp_path.iterdir()) == ["link", "real"]


def test_a_killed_runs_unfinished_output_is_removed_by_the_next_run_and_a_living_ones_kept(tmp_path):
    """A writer killed with SIGKILL cannot clean up: its hidden temporary folder, with the rows it
    had written, must not outlive the next run for the same --out; a writer still running keeps it."""
    import signal
    import warnings

    from etl.io import atomic_output_dir

    out = tmp_path / "cohort"
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from etl.io import atomic_output_dir\n"
         f"with atomic_output_dir({str(out)!r}) as tmp:\n"
         "    (tmp / 'rows.parquet').write_bytes(b'patient rows')\n"
         "    print('ready', flush=True)\n"
         "    time.sleep(60)\n"],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        (left,) = tmp_path.glob(".cohort.tmp-*")
        os.utime(left, (1.0, 1.0))  # old enough to be taken for stale, were it not locked
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing removed, so no warning
            with atomic_output_dir(out) as tmp:
                (tmp / "a.txt").write_text("1")
        assert (left / "rows.parquet").read_bytes() == b"patient rows"  # the living writer's folder is kept
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert left.exists()  # SIGKILL: nothing ran to remove it
    os.utime(left, (1.0, 1.0))
    with pytest.warns(UserWarning, match=r"--out .*cohort: removed 1 unfinished output\(s\)"), \
            atomic_output_dir(out) as tmp:
        (tmp / "a.txt").write_text("2")
    assert not left.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cohort"]
    assert (out / "a.txt").read_text() == "2"


def test_an_out_holding_a_mount_point_is_refused_before_any_work(tmp_path, monkeypatch):
    """Replacing such a folder would copy the mounted files into the new output and remove them
    with the old one: another file system's files are never touched."""
    from etl.errors import InputError
    from etl.io import atomic_output_dir

    out = tmp_path / "cohort"
    (out / "data" / "disk").mkdir(parents=True)
    (out / "data" / "disk" / "f.txt").write_text("not ours")
    mounted = str(out / "data" / "disk")
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: str(p) == mounted or real(p))
    with pytest.raises(InputError) as e, atomic_output_dir(out):
        pass
    assert str(e.value) == f"--out {out}: {mounted} inside it is a mount point; give the output a folder of its own"
    assert (out / "data" / "disk" / "f.txt").read_text() == "not ours"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cohort"]   # no temporary folder made
    monkeypatch.setattr(os.path, "ismount", real)
    with atomic_output_dir(out) as tmp:
        (tmp / "a.txt").write_text("1")
    assert (out / "data" / "disk" / "f.txt").read_text() == "not ours"   # kept: the run did not write it

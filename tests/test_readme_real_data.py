"""The README's real-data commands ("With credentialed MIMIC-IV"), parsed from README.md so that
they cannot drift, run on the real 100-patient MIMIC-IV demo (with the small-data options the README
prints beside them, 1 round, one seed for the sweeps); the subgroup table accounts for every test
row; `abps etl` never writes patient data unignored into a git work tree; `abps cache clear`."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from tests.cli_helpers import run_main as _main

REPO = Path(__file__).resolve().parents[1]


def readme_real_data_commands() -> tuple[list[list[str]], list[str]]:
    """The ``abps`` command lines of the README's "With credentialed MIMIC-IV" block (comments
    dropped) and the small-data ETL options the README prints beside them."""
    text = (REPO / "README.md").read_text()
    section = text.split("## With credentialed MIMIC-IV", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    cmds = [shlex.split(ln.split("#", 1)[0])[1:] for ln in block.splitlines() if ln.strip()]
    small = re.search(r"add\s+`([^`]+)`\s+to\s+`abps etl`", section)
    assert small, "the README names the small-data options of abps etl"
    return cmds, small.group(1).split()


def test_readme_real_data_commands_run_on_the_real_demo(mimic_demo_dir: Path, tmp_path: Path, monkeypatch,
                                                        capsys) -> None:
    cmds, small = readme_real_data_commands()
    assert [c[0] for c in cmds] == ["etl", "train", "train", "sweep", "sweep", "report"]
    monkeypatch.chdir(tmp_path)
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "configs").symlink_to(REPO / "configs")
    for cmd in cmds:
        args = list(cmd)
        if args[0] == "etl":
            args[args.index("--mimic-dir") + 1] = str(mimic_demo_dir)
            args += small
        elif args[0] == "train":
            args += ["--rounds", "1", "--no-progress"]
        elif args[0] == "sweep":
            args += ["--rounds", "1", "--seeds", "11", "--no-progress"]
        elif args[0] == "report":
            args += ["--no-log"]
        assert _main(args) == 0, (args, capsys.readouterr().err[-2000:])
    out = capsys.readouterr().out
    assert "cohort: " in out and "-> cohort" in out
    assert "fedavg: AUROC" in out and "abps [goal=diversity]: AUROC" in out
    assert "sweep table1: " in out and "sweep table1-extras: " in out
    assert (tmp_path / "report" / "table1" / "table1.md").is_file() and (tmp_path / "report" / "table1" / "fig3.png").is_file()
    doc = json.loads((tmp_path / "report" / "table1" / "report.json").read_text())
    labels = {r["label"] for r in doc["sections"]["table1"]["rows"]}
    assert {"fedavg", "abps-div", "abps-x", "centralized", "abps-drift", "sage"} <= labels

    # the subgroup table accounts for every test row: per axis, the groups' rows plus the rows in
    # no group are the evaluated test rows (sex is known for every demo stay: its groups hold them all)
    import polars as pl

    (res,) = list((tmp_path / "runs" / "cohort").glob("fedavg-*/results.json"))
    run = json.loads(res.read_text())
    clin = run["seeds"]["11"]["clinical"]
    none = clin["subgroup_unassigned"]
    n_eval = sum(r["n"] for r in clin["subgroups"] if r["axis"] == "sex")
    assert none["sex"] == 0
    for axis in ("age", "race"):
        assert sum(r["n"] for r in clin["subgroups"] if r["axis"] == axis) + none[axis] == n_eval, axis
    test_rows = pl.read_parquet(tmp_path / "cohort" / "cohort.parquet").filter(pl.col("split") == "test")
    unknown = test_rows.filter(~pl.col("race").is_in(["WHITE", "BLACK", "HISPANIC", "ASIAN", "OTHER"])).height
    if not run["dropped_centers"].get("centers"):
        assert n_eval == test_rows.height
    assert 0 < none["race"] <= unknown
    assert f"race {none['race']}" in clin["subgroup_note"]
    fair = (tmp_path / "report" / "table1" / "fairness.md").read_text()
    assert "Test rows in no group" in fair and "race" in fair.split("Test rows in no group", 1)[1]


def test_etl_refuses_an_unignored_folder_in_a_git_work_tree(mimic_demo_dir: Path, tmp_path: Path, capsys) -> None:
    git = shutil.which("git")
    assert git, "git is needed (CI works on a clone)"
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run([git, "init", "-q", str(repo)], check=True)
    args = ["etl", "--mimic-dir", str(mimic_demo_dir), "--window-years", "20", "--min-center-stays", "1"]
    assert _main([*args, "--out", str(repo / "cohort")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not ignored by git" in err and "/cohort/" in err and ".gitignore" in err
    assert not (repo / "cohort").exists()
    # ignored: the check passes (the folder in the work tree is then git's business no more)
    (repo / ".gitignore").write_text("/cohort/\n")
    from cli.project import check_out_ignored

    check_out_ignored(repo / "cohort")
    check_out_ignored(tmp_path / "outside")  # outside any work tree
    # the chartevents cache (stay_id rows) is held to the same rule
    assert _main([*args, "--out", str(tmp_path / "o"), "--chart-cache", str(repo / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --chart-cache {repo / 'cache'}: not ignored by git")
    assert "stay_id" in err and "/cache/" in err and not (repo / "cache").exists() and not (tmp_path / "o").exists()
    # this repository ignores the README's suggested folders
    for folder in ("cohort", "cohort-los3", "report"):
        assert subprocess.run([git, "-C", str(REPO), "check-ignore", "-q", f"{folder}/x"]).returncode == 0, folder


def test_cache_clear_removes_the_caches(tmp_path: Path, monkeypatch, capsys) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("ABPS_CACHE_DIR", str(root))
    (root / "chartevents").mkdir(parents=True)
    (root / "chartevents" / "a.parquet").write_bytes(b"x" * 2**20)
    (root / "kernels").mkdir()
    (root / "kernels" / "k.so").write_bytes(b"y" * 2**19)
    (root / "chartevents" / "a.json").write_text(json.dumps({"source_name": "chartevents.csv.gz", "rows": 1234}))
    (root / "chartevents" / "b.json").write_text("{not json")
    (root / "chartevents" / "c.json").write_text(json.dumps({"source_name": "chartevents.csv.gz", "rows": 5,
                                                             "source_path": str(tmp_path / "gone.csv.gz")}))
    keep = tmp_path / "cache-sibling"
    keep.mkdir()
    assert _main(["cache", "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0] == f"chartevents: {root / 'chartevents'} (4 files, 1.0 MiB)"
    assert listed[1] == "  a.parquet: chartevents.csv.gz, 1,234 rows, 1.0 MiB"
    assert listed[2].startswith("  b.json: unreadable manifest")
    assert listed[3] == f"  c.parquet: {tmp_path / 'gone.csv.gz'}, 5 rows, 0.0 MiB (source gone: `abps cache clear` frees it)"
    assert listed[4] == f"kernels: {root / 'kernels'} (1 file, 0.5 MiB)" and listed[-1] == "cache list: 1.5 MiB in all"
    assert root.is_dir()  # listing removes nothing
    assert _main(["cache", "clear"]) == 0
    assert root.is_dir() and not any(root.iterdir()) and keep.is_dir()  # the folder ABPS_CACHE_DIR names stays
    assert "cache clear: 1.5 MiB freed" in capsys.readouterr().out
    make = (REPO / "Makefile").read_text()
    clean = make.split("\nclean:", 1)[1].split("\n\n", 1)[0]
    assert "cache clear" not in clean  # the per-user cache serves every clone: `make clean` leaves it


def test_cache_list_and_clear_on_odd_entries(tmp_path: Path, monkeypatch, capsys) -> None:
    """Manifests of another shape are listed as unreadable; a cache folder that is a link or a
    file is refused by ``cache clear`` with one line, and what it points to is left alone."""
    root = tmp_path / "cache"
    monkeypatch.setenv("ABPS_CACHE_DIR", str(root))
    (root / "chartevents").mkdir(parents=True)
    docs = {"c1.json": "[]", "c2.json": '"x"', "c3.json": '{"rows": 1e999}', "c4.json": "[" * 100000}
    for name, text in docs.items():
        (root / "chartevents" / name).write_text(text)
    assert _main(["cache", "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0].strip() for ln in listed if "unreadable manifest" in ln] == sorted(docs)
    real = tmp_path / "elsewhere"
    real.mkdir()
    (real / "keep.parquet").write_bytes(b"z")
    (root / "kernels").symlink_to(real)
    assert _main(["cache", "clear"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {root / 'kernels'}: not a folder of the cache")
    assert (real / "keep.parquet").is_file()

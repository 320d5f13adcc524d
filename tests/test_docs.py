"""The documentation cannot drift from the code: the generated reference pages list every command,
option, config key, method, results.json key and MLflow name; every repository path a page names
exists; no page tells development history; and the tutorial's commands run (on reduced sizes)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from cli.runs_cmd import stop_process_tree

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _gen():
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "scripts" / "docs_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gen = _gen()


def _pages() -> list[Path]:
    return sorted([*DOCS.rglob("*.md"), REPO / "README.md"])


# ---- generated reference --------------------------------------------------------------------

def test_cli_page_lists_every_command_and_option():
    page = gen.cli_page()
    commands = gen.cli_commands()
    assert {c for c, _ in commands} >= {"abps etl", "abps train", "abps sweep", "abps report", "abps runs",
                                         "abps ui", "abps synth mimic", "abps synth fedprox"}
    for full, cmd in commands:
        assert f"## `{full}`" in page
        section = page.split(f"## `{full}`", 1)[1].split("\n## ", 1)[0]
        for p in cmd.params:
            if p.name != "help":
                for opt in p.opts:
                    assert f"`{opt}`" in section, (full, opt)
    # a default and a help text arrive as the code states them
    train = page.split("## `abps train`", 1)[1].split("\n## ", 1)[0]
    assert "| `--threads` | integer in [0, 1024] |" in train and "| `0` | torch CPU threads (0 = torch default; at most 1024) |" in train


def test_config_page_lists_every_key_with_type_and_default():
    page = gen.config_page()
    keys = gen.config_keys(gen._project().RunConfig)
    assert len(keys) > 40
    for key, _typ, _default, meaning in keys:
        assert f"| `{key}` | " in page, key
        assert meaning.strip(), f"config key {key} has no meaning: give its class docstring an Attributes entry"
    rows = {k: (t, d, m) for k, t, d, m in keys}
    assert rows["engine.lr"][:2] == ("float", "`0.001`")
    assert rows["realworld.availability.kind"][1] == "`always`"
    assert "bytes per second" in rows["realworld.profiles.uplink"][2]
    assert rows["reference_rounds"][2] == "FedAvg rounds in the bandwidth denominator"
    for key, *_ in gen.config_keys(gen._project().SweepSpec):
        assert f"| `{key}` | " in page, key
    for method, prow in gen.method_params().items():
        assert f"### `{method}`" in page
        for key, *_ in prow:
            assert f"| `{key}` | " in page.split(f"### `{method}`", 1)[1], (method, key)


def test_methods_page_lists_every_registered_method():
    page = gen.methods_page()
    names = gen._project().method_names()
    assert len(names) >= 20 and names[0] == "local"
    for name in names:
        cls = gen._project().all_methods()[name]
        assert f"| `{name}` | {gen._cell(cls.display_name)} | {cls.family} |" in page
    # the equation map is read from the class's own docstring
    assert "Algorithm 1" in page.split("| `abps` |", 1)[1].split("\n", 1)[0]


def test_outputs_and_mlflow_pages_cover_what_a_real_run_writes():
    outputs, ml = gen.outputs_page(), gen.mlflow_page()
    s = gen._project().schema
    for c in (*s.COHORT_COLUMNS, *s.CENTER_COLUMNS):
        assert f"`{c}`" in outputs, c
    # the hand-written data dictionary explains every column the schema defines
    dictionary = (DOCS / "data_dictionary.md").read_text()
    undocumented = [c for c in (*s.COHORT_COLUMNS, *s.CENTER_COLUMNS)
                    if c not in dictionary and not c.startswith(("cci_", "meta_cci_", "heart_rate_", "sbp_",
                                                                 "dbp_", "mbp_", "resp_rate_", "spo2_", "temperature_"))]
    assert not undocumented
    keys = gen.results_keys()
    assert ("seeds.<seed>.final_auroc_mean", "float") in keys
    for k, _ in keys:
        assert f"| `{k}` |" in outputs
        assert gen.results_meaning(k), f"results.json key {k!r} has no meaning in scripts/docs_reference.py"
    run = gen.sample_run()
    assert {"val_auroc_mean", "isolation_rate", "final_auroc_mean", "rel_bandwidth"} <= set(run["metrics"])
    for name in run["metrics"]:
        assert gen.meaning(name), f"MLflow metric {name!r} has no meaning in scripts/docs_reference.py"
        assert f"| `{name}` |" in ml
    for tag in run["tags"]:
        assert f"| `{tag}` |" in ml
    assert "abps.kind" in run["tags"] and "per_center.json" in run["artifacts"]


# ---- paths and history ----------------------------------------------------------------------

def test_every_path_and_module_a_page_names_exists():
    bad = {p.relative_to(REPO).as_posix(): gen.missing_paths(p.read_text()) for p in _pages()}
    assert not {k: v for k, v in bad.items() if v}
    # the check itself catches a stale path and a stale module
    assert gen.missing_paths("see `federation/no_such.py` and federation.no_such.f") == [
        "federation.no_such.f", "federation/no_such.py"]
    assert gen.missing_paths("federation/engine/mlp.py, federation.engine.mixing.mix, etl.schema") == []


HISTORY = re.compile(r"\b[Ss]ession[- ][0-9]|this session|the lead\b|[0-9]+ engineers|load average|\bat load [0-9]|\(load [0-9]|[Ii]ssue [0-9]+|"
                     r"issue #[0-9]+|left for later")


def test_no_page_tells_development_history():
    hits = [f"{p.relative_to(REPO)}:{i}: {line.strip()[:80]}" for p in _pages()
            for i, line in enumerate(p.read_text().splitlines(), 1) if HISTORY.search(line)]
    hits += [f"generated {uri}" for uri, page in gen.GENERATORS.items() if HISTORY.search(page())]
    assert not hits


def test_no_product_text_tells_development_history():
    # what the product prints and writes (report titles, messages, configs) names no tracker issue
    files = [p for d in ("cli", "etl", "federation", "abps", "configs") for p in sorted((REPO / d).rglob("*"))
             if p.suffix in (".py", ".sql", ".yaml")]
    assert len(files) > 50
    hits = [f"{p.relative_to(REPO)}:{i}: {line.strip()[:80]}" for p in files
            for i, line in enumerate(p.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not hits


def test_every_figure_names_the_command_that_made_it():
    for p in DOCS.rglob("*.md"):
        text = p.read_text()
        for m in re.finditer(r"!\[[^\]]*\]\(([^)]+\.png)\)", text):
            after = text[m.end():m.end() + 400]  # the caption under the figure
            assert re.search(r"`(abps|python|\.venv/bin/|chromium|make) ", after), (p.name, m.group(1))
            assert (p.parent / m.group(1)).is_file(), m.group(1)


# ---- the tutorial runs ----------------------------------------------------------------------

#: How CI reduces each tutorial command (the page shows the full-size run): a small synthetic
#: MIMIC-IV (3,000 stays), 10-year windows so that about 30 centers keep at least 20 stays, one round.
REDUCE = {("synth", "mimic"): ["--stays", "3000", "--seed", "3"],
          ("etl",): ["--window-years", "10", "--min-center-stays", "20"],
          ("train",): ["--rounds", "1", "--no-progress"]}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tutorial_commands() -> list[tuple[str, list[str]]]:
    """``[(command line, first documented output lines)]`` of the tutorial's console blocks."""
    text = (DOCS / "tutorial.md").read_text()
    out = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        for chunk in re.split(r"^(?=\$ )", block, flags=re.M):
            if chunk.startswith("$ "):
                cmd, *output = chunk[2:].splitlines()
                out.append((cmd, output))
    return out


def _shape(line: str) -> str:
    """A console line with its numbers, run ids, timestamps and spacing masked: what a page's
    transcript and a run on another cohort share."""
    line = re.sub(r"[0-9a-f]{32}", "<id>", line)
    line = re.sub(r"[0-9][0-9.,]*", "#", line)
    line = re.sub(r"[━─┏┓┗┛┡┩└┘┳┻╇┴┬]+", "-", line)
    return re.sub(r"\s+", " ", line).strip()


def test_tutorial_commands_run_on_a_small_cohort(tmp_path):
    cmds = tutorial_commands()
    assert [c.split()[:2] for c, _ in cmds if c.startswith("abps")] == [
        ["abps", "synth"], ["abps", "etl"], ["abps", "train"], ["abps", "train"], ["abps", "runs"],
        ["abps", "ui"], ["abps", "report"]]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "ABPS_STATE": str(tmp_path / "state.json")}
    for line, documented in cmds:
        argv = shlex.split(line)
        if argv[0] == "export":
            key, value = argv[1].split("=", 1)
            env[key] = value
            continue
        assert argv[0] == "abps", line
        for key, extra in REDUCE.items():
            if tuple(argv[1:1 + len(key)]) == key:
                argv += extra
        cli = [sys.executable, "-c", "from cli.app import main; main()", *argv[1:]]
        env["PYTHONPATH"] = str(REPO)
        if argv[1] == "ui":  # a server: it must print its URL line, then it is stopped
            port = _free_port()
            p = subprocess.Popen([*cli, "--port", str(port)], cwd=tmp_path, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
            try:
                first = p.stdout.readline()
            finally:
                stop_process_tree(p.pid, timeout_s=30)  # abps ui, its MLflow server and the server's workers
                p.wait(timeout=5)
            assert first.startswith(f"MLflow UI: http://127.0.0.1:{port}"), first
            continue
        res = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, (line, res.stderr[-1500:])
        # every output line the page shows is one the command prints, numbers, run ids and spacing aside
        got = {_shape(x) for x in (res.stdout + res.stderr).splitlines()}
        stale = [d for d in documented if d.strip() and _shape(d) not in got]
        assert not stale, (line, stale, sorted(got))
    assert (tmp_path / "report" / "cohort" / "table1.md").is_file() and (tmp_path / "report" / "cohort" / "fig3.png").is_file()


def test_own_method_example_trains(tmp_path):
    """The how-to's example method registers and trains two rounds, in a fresh process (so the
    example never joins the registry the conformance tests iterate)."""
    code = re.search(r"```python\n(.*?)```", (DOCS / "own-method.md").read_text(), flags=re.S).group(1)
    script = code + f"""
from federation.core.config import build_config
from federation.run.runner import run_training
from federation.data.synthetic import write_fedprox_cohort

cohort = write_fedprox_cohort({str(tmp_path / 'c')!r}, n_centers=4, seed=1, mean_size=120.0)
doc = run_training(build_config("ring", Ring.default_config, None, 2), cohort, [3], track=False, progress=False)
s = doc["seeds"]["3"]
assert s["rounds_run"] == 2 and s["model_bytes"] > 0, s
print("ok", s["model_bytes"])
"""
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0 and res.stdout.startswith("ok"), res.stderr[-2000:]


def test_every_documented_etl_output_folder_is_ignored_by_git():
    """``abps etl`` refuses an ``--out`` inside a git work tree that does not ignore it (the cohort
    holds patient identifiers): every ``abps etl ... --out PATH`` the README, the docs and the
    config comments show, run from the repository's root, names a folder this repository ignores.
    Placeholders (upper case, absolute paths, ``D/...``) are the reader's own folders."""
    texts = [REPO / "README.md", *sorted(DOCS.glob("*.md")), *sorted((REPO / "configs").glob("*.yaml"))]
    outs = {}
    for path in texts:
        for line in path.read_text(encoding="utf-8").splitlines():
            if "federation.data.holdout " in line:  # a tuning cohort: COHORT_DIR OUT_DIR, rows copied
                args = [a for a in re.split(r"`|&&|;", line.split("federation.data.holdout ", 1)[1])[0].split()
                        if not a.startswith("-")]
                found = args[1:2]
            elif "abps etl" in line:
                command = re.split(r"`|\babps |&&|;", line.split("abps etl", 1)[1])[0]  # to the next command
                found = [m.group(1) for m in re.finditer(r"--out[ =](\S+)", command)]
            else:
                continue
            for out in found:
                out = out.strip("`'\"")
                if out.startswith(("/", "$")) or out != out.lower() or re.match(r"^[a-z]/", out):
                    continue
                outs.setdefault(out.rstrip("/"), path.relative_to(REPO))
    assert len(outs) >= 6 and "cohort-tune" in outs, outs  # the parser still finds the examples
    for out, where in outs.items():
        probe = out.replace("$h", "0") + "/cohort.parquet"
        p = subprocess.run(["git", "check-ignore", "-q", "--no-index", probe], cwd=REPO)
        assert p.returncode == 0, f"{where}: abps etl --out {out} is not ignored by .gitignore"


def test_every_documented_report_folder_holds_one_experiment():
    """``abps report`` replaces a folder holding another experiment's report only with --force:
    every ``abps report --experiment E --out DIR`` the README, the docs and the config comments
    show names a folder of its own, so the commands run one after another as written."""
    texts = [REPO / "README.md", *sorted(DOCS.glob("*.md")), *sorted((REPO / "configs").glob("*.yaml"))]
    owner: dict[str, tuple[str, Path]] = {}
    found = 0
    for path in texts:
        for line in path.read_text(encoding="utf-8").splitlines():
            for part in re.split(r"\babps report\b|federation\.report\.\w+", line)[1:]:
                command = re.split(r"`|&&|;|\babps ", part)[0]
                exp, out = re.search(r"--experiment[ =](\S+)", command), re.search(r"--out[ =](\S+)", command)
                if not exp or not out or out.group(1) != out.group(1).lower() or out.group(1).startswith("/"):
                    continue
                found += 1
                folder, experiment = out.group(1).strip("`'\"").rstrip("/"), exp.group(1).strip("`'\"")
                first = owner.setdefault(folder, (experiment, path.relative_to(REPO)))
                assert first[0] == experiment, (f"{path.relative_to(REPO)}: --out {folder} for experiment {experiment}, "
                                                f"which {first[1]} uses for {first[0]}")
    assert found >= 10  # the parser still finds the examples


def test_the_paper_size_sage_tables_are_the_stored_results():
    """docs/sage.md's paper-size tables are what `python -m benchmarks.sage_grid table` prints from the
    results kept in docs/results/sage-grid/: a row pasted from elsewhere, or a result file changed
    without its row, fails here."""
    from benchmarks.sage_grid import GRAPHS, table

    page = (REPO / "docs" / "sage.md").read_text()
    for graph in GRAPHS:
        printed = table(graph)
        if printed:
            assert printed in page, f"docs/sage.md lacks the {graph} table that the stored results print"
    section = page.split("## Results: paper-size grids", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if re.match(r"\| [A-Za-z -]+\d* \| 0\.\d{4} \|", ln)]
    printed = {r for g in GRAPHS for r in table(g).splitlines()}
    assert rows and not [r for r in rows if r not in printed]  # every row of the section is a stored result


def test_the_readme_transcript_is_the_tutorials():
    """The README's console block shows the tutorial's commands and output lines (which the test
    above holds to the program), apart from the lines that name where the data and runs are."""
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```console\n(.*?)```", readme, flags=re.S)
    tutorial = {_shape(x) for cmd, out in tutorial_commands() for x in (f"$ {cmd}", *out)}
    where = ("$ export ", "found MIMIC-IV ", "MLflow UI: ")  # the data folder, the run ids of one run
    lines = [x for b in blocks for x in b.splitlines() if x.strip() and not x.startswith(where)]
    assert len(lines) > 10 and [x for x in lines if _shape(x) not in tutorial] == []

"""Every command in the shell blocks of the README and the docs/ pages, checked the cheapest way that
would catch it breaking: `fedfactor` commands run as written in a temporary folder (training cut to one
round), every `snakemake` command as a dry run (in this process: a subprocess would spend seconds
importing torch each time), usage lines (`fedfactor train --config FILE ...`) and `mlflow ui/server`
parsed by their own parsers, `pip install` extras looked up in pyproject.toml, ```python blocks
compiled (the factor analysis one run). What needs the network (a fresh virtual environment, pip), a
GPU, SLURM or a finished paper study is only dry-run or parsed; the test suite's own command is not
run. A command this file does not know how to check fails it."""

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
# The README and every page under docs/: where the commands a user copies live
DOCS = {p.relative_to(REPO).as_posix(): p.read_text()
        for p in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]}
# Placeholders the docs write for "any study"
PLACEHOLDERS = {"config/studies/X.yaml": "config/studies/factorized_fl_label.yaml"}


def _blocks() -> list[tuple[str, int, str]]:
    """(file, line number, text) of every ```bash block."""
    return [(name, text[:m.start()].count("\n") + 2, m[1])
            for name, text in DOCS.items() for m in re.finditer(r"^```bash\n(.*?)^```", text, re.M | re.S)]


def _commands() -> list[tuple[str, str]]:
    """(id, command) per command: continuation lines joined, a heredoc kept whole, `&&` chains split.
    The id is `file:Lline`, so a failure names where the command is written."""
    out = []
    for name, line_no, block in _blocks():
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            start, text = line_no + i, lines[i]
            heredoc = re.search(r"<<'?(\w+)'?", text)
            if heredoc:  # the body up to its terminator belongs to this command
                end = lines.index(heredoc[1], i + 1)
                text, i = "\n".join(lines[i:end + 1]), end
            while text.endswith("\\"):
                i += 1
                text = text[:-1] + lines[i].strip()
            i += 1
            if heredoc:
                out.append((f"{name}:L{start}", text))
                continue
            tokens = shlex.split(text, comments=True)
            if tokens and "&&" not in tokens:  # as written, for bash (redirections stay redirections)
                out.append((f"{name}:L{start}", text))
                continue
            part: list[str] = []
            for token in [*tokens, "&&"]:
                if token != "&&":
                    part.append(token)
                elif part:
                    out.append((f"{name}:L{start}", shlex.join(part)))
                    part = []
    return out


COMMANDS = _commands()


def _argv(command: str) -> list[str]:
    argv = [PLACEHOLDERS.get(a, a) for a in shlex.split(command, comments=True)]
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):  # VAR=value before the program
        argv.pop(0)
    return argv


def _kind(command: str) -> str:
    argv = _argv(command)
    if "<<" in command or argv[0] == "echo":
        return "write"
    if argv[:3] == ["python3", "-m", "venv"] or argv[0] in (".", "source", "export"):
        return "environment"
    if argv[0] == "pip":
        return "pip"
    if argv[:3] == ["python", "-m", "pytest"]:
        return "test-suite"
    if argv[:3] == ["python", "-m", "benchmarks"]:
        return "benchmarks"
    if argv[:2] == ["python", "-m"] and argv[2].startswith("probes."):
        return "probes"
    if argv[0] == "mutmut" or argv[:3] == ["mkdir", "-p", "mutants/src"]:
        return "mutation"
    if argv[0] in ("snakemake", "mlflow"):
        return argv[0]
    if argv[0] == "bash" and argv[1].startswith("workflow/scripts/"):
        return "script"
    if argv[0] == "fedfactor":
        # placeholders: [optional], a | b, NAME, RUNS..., {...}
        usage = any(a.startswith("[") or a == "|" or "..." in a or re.fullmatch(r"[A-Z][A-Z_]+", a) for a in argv)
        return "fedfactor-usage" if usage else "fedfactor"
    return "unknown"


def _of(kind):
    found = [(i, c) for i, c in COMMANDS if _kind(c) == kind]
    assert found, f"the docs have no {kind} command any more: update this test"
    return pytest.mark.parametrize("command", [c for _, c in found], ids=[i for i, _ in found])


def test_every_documented_command_is_one_this_test_checks():
    assert len(COMMANDS) >= 30
    assert [c for _, c in COMMANDS if _kind(c) == "unknown"] == []


@_of("script")
def test_the_scripts_the_docs_run_exist_parse_and_take_their_arguments(command):
    """`bash workflow/scripts/cpu_scale.sh simfed`: the script is bash that parses, and each paper it is
    given has CPU-scale studies (the script's own check, run on its arguments alone)."""
    argv = _argv(command)
    script = REPO / argv[1]
    assert script.is_file() and subprocess.run(["bash", "-n", str(script)]).returncode == 0, command
    for paper in argv[2:]:
        assert list((REPO / "config" / "studies" / "cpu").glob(f"{paper}*.yaml")), f"{command}: {paper}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder where the docs' file-writing commands have run (mine.yaml, cluster.yaml)."""
    work = tmp_path_factory.mktemp("readme")
    for _, command in COMMANDS:
        if _kind(command) == "write":
            subprocess.run(["bash", "-euc", command], cwd=work, check=True)
    return work


def test_the_files_the_docs_write_are_study_yaml(workdir):
    for name in ("mine.yaml", "cluster.yaml"):
        assert isinstance(yaml.safe_load((workdir / name).read_text()), dict), name


@_of("pip")
def test_pip_installs_name_extras_pyproject_has(command):
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    argv = _argv(command)
    target = argv[argv.index("-e") + 1]
    named = re.fullmatch(r"\.\[([\w,]+)\]", target)
    assert target == "." or (named and set(named[1].split(",")) <= set(extras)), command


@_of("mutation")
def test_the_mutation_commands_have_their_tool_and_its_configuration(command):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert any(d.startswith("mutmut") for d in project["project"]["optional-dependencies"]["mutation"])
    config = project["tool"]["mutmut"]
    # the modules docs/testing.md names are mutated; everything else is only copied
    assert config["source_paths"] == ["src/fedfactor/"] and "src/fedfactor/run/simulator.py" not in config["do_not_mutate"]
    argv = _argv(command)
    assert argv[0] == "mkdir" or argv[1] in ("run", "results", "show"), command


def _snakemake_dry_run(argv: list[str]) -> tuple[bool, str]:
    """`snakemake ARGS -n` as the CLI would run it from the checkout, in this process."""
    from snakemake.cli import args_to_api, parse_args

    out, cwd = io.StringIO(), os.getcwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            parser, args = parse_args(argv)
            ok = args_to_api(args, parser)
    finally:
        os.chdir(cwd)
    return ok, out.getvalue()


@_of("snakemake")
@pytest.mark.slow
def test_snakemake_commands_dry_run(command, workdir, tmp_path):
    argv = _argv(command)[1:]
    if "--report" in argv:  # a report needs the finished study: its dry run stands in
        i = argv.index("--report")
        del argv[i:i + 2]
    # files the docs wrote (mine.yaml, cluster.yaml) lie in the work folder
    argv = [str(workdir / a) if (workdir / a).is_file() else a for a in argv]
    if "--config" in argv:  # one --config: a second would replace the first's keys
        i = argv.index("--config") + 1
        argv = [*argv[:i], f"results={tmp_path}", *argv[i:], "-n"]
    else:
        argv = [*argv, "-n", "--config", f"results={tmp_path}"]
    if "compare" in argv:  # the study it compares with has run
        other = next(a for a in argv if a.startswith("compare_with=")).split("=", 1)[1]
        (tmp_path / other / "runs").mkdir(parents=True)
    ok, out = _snakemake_dry_run(argv)
    assert ok, out[-3000:]
    assert ("compare" in argv) == bool(re.search(r"^compare\s+1$", out, re.M)), out[-3000:]
    # training jobs: the study's, or the tuning's for `snakemake tune`
    assert re.search(r"^(tune_)?train\s+\d+$", out, re.M), out[-3000:]
    assert ("tune" in argv) == bool(re.search(r"^tune_train\s+\d+$", out, re.M)), out[-3000:]
    if "mine.yaml" in command:  # a study variant writes to a folder of its own
        assert f"{tmp_path}/factorized_fl_label+mine/jobs/train/" in out
        assert f"{tmp_path}/factorized_fl_label/" not in out


@_of("fedfactor-usage")
def test_fedfactor_usage_lines_name_real_subcommands_and_options(command):
    from fedfactor.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict)).choices
    argv = _argv(command)[1:]
    if "|" in argv:  # `fedfactor methods | datasets | ...`: each a subcommand
        names = [a for a in argv if a != "|"]
        assert set(names) <= set(subparsers), command
        return
    sub = subparsers[argv[0]]
    options = {o for a in sub._actions for o in a.option_strings}
    used = {re.match(r"\[?(--[\w-]+)", a)[1] for a in argv if re.match(r"\[?--", a)}
    assert used <= options, f"{command}: {used - options} not options of `fedfactor {argv[0]}`"


def _fedfactor(argv: list[str], cwd: Path) -> tuple[int, str]:
    from fedfactor.cli import main

    out, here = io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            status = main(argv)
    finally:
        os.chdir(here)
    return status, out.getvalue()


@pytest.fixture(scope="module")
def trained(workdir):
    """The `fedfactor train` example (docs/cli.md), run as written, with one round instead of ten."""
    (command,) = [c for _, c in COMMANDS if _kind(c) == "fedfactor" and _argv(c)[1] == "train"]
    argv = _argv(command)[1:]
    for config in (a for a in argv if a.endswith(".yaml")):
        argv[argv.index(config)] = str(REPO / config)
    status, out = _fedfactor([*argv, "--set", "fl.rounds=1", "--set", "tracking.enabled=false"], workdir)
    return status, out, workdir / argv[argv.index("--out") + 1]


@pytest.mark.slow
def test_the_train_example_runs(trained):
    status, out, run = trained
    assert status == 0, out[-2000:]
    assert (run / "summary.json").is_file()


def test_the_cost_example_prints_the_bytes_its_comment_says(workdir):
    ((where, command),) = [(i, c) for i, c in COMMANDS if _kind(c) == "fedfactor" and _argv(c)[1] == "cost"]
    argv = _argv(command)[1:]
    argv[argv.index("--config") + 1] = str(REPO / argv[argv.index("--config") + 1])
    status, out = _fedfactor(argv, workdir)
    page = DOCS[where.split(":")[0]]  # the comment under the command, on the page that shows it
    said = re.search(r"^# bytes_total\s+([\d,]+) B", page.split(command.split("#")[0].strip(), 1)[1], re.M)[1]
    assert status == 0 and re.search(rf"^bytes_total\s+{said} B", out, re.M), out


@pytest.mark.slow
def test_the_mlflow_import_example_loads_a_finished_run(trained):
    from mlflow import MlflowClient

    status, out, run = trained
    assert status == 0, out[-2000:]
    (command,) = [c for _, c in COMMANDS if _kind(c) == "fedfactor" and _argv(c)[1] == "mlflow-import"]
    argv = _argv(command)[1:]
    work = run.parents[1]  # the folder the train example ran in
    os.renames(run, work / argv[1] / "iid" / "fedprox" / "seed0")  # as a study's finished run
    status, out = _fedfactor(argv, work)
    assert status == 0, out
    uri = argv[argv.index("--uri") + 1].replace("sqlite:///", f"sqlite:///{work}/")
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(argv[argv.index("--experiment") + 1])
    assert len(client.search_runs([exp.experiment_id])) == 1
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # opens as model training


@_of("mlflow")
@pytest.mark.slow
def test_mlflow_commands_parse_and_the_ui_opens_the_workflows_store(command):
    from mlflow.cli import cli

    argv = _argv(command)[1:]
    sub = cli.get_command(None, argv[0])
    ctx = sub.make_context(argv[0], argv[1:])
    uri = ctx.params["backend_store_uri"]
    if argv[0] == "ui":  # one store for every study: they all share the results root it lies in
        studies = [REPO / "config" / "config.yaml", *(REPO / "config" / "studies").glob("*.yaml")]
        roots = {yaml.safe_load(s.read_text()).get("results", "results") for s in studies}
        assert roots == {"results"} and uri == "sqlite:///results/mlflow.db"


@_of("benchmarks")
def test_benchmark_commands_name_real_benchmarks_and_options(command):
    usage = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout
    argv = _argv(command)[3:]
    for i, a in enumerate(argv):
        if a.startswith("--"):
            assert a in usage, a
        elif i == 0 or not argv[i - 1].startswith("--") or argv[i - 1] == "--quick":  # not an option's value
            assert (REPO / "benchmarks" / f"{a}.py").is_file(), f"no benchmark {a!r}"


@_of("probes")
def test_probe_commands_name_real_probes_and_options(command):
    argv = _argv(command)
    module = argv[2]
    assert (REPO / (module.replace(".", "/") + ".py")).is_file(), f"no probe {module!r}"
    usage = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout
    assert all(a in usage for a in argv[3:] if a.startswith("--")), command


def test_python_blocks_compile_and_the_factor_analysis_one_runs():
    import ast

    import torch

    blocks = [b for text in DOCS.values() for b in re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)]
    assert blocks
    for block in blocks:
        ast.parse(block)  # the method fragment (`def plan(self, ...)`) only compiles
    (snippet,) = [b for b in blocks if "factor_analysis(" in b]
    scope = {"weights": torch.randn(5, 8, 3)}  # K clients x d units x fan-in, as its comment says
    exec(snippet, scope)
    assert scope["shared"].shape == (8,) and scope["shared"].dtype == torch.bool

"""envs/fedfactor.yaml (for `snakemake --sdm conda`) holds exactly pyproject's dependencies."""

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def _requirement(text: str) -> tuple[str, str]:
    name, spec = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*(.*)", text).groups()
    return name.lower().replace("_", "-"), spec.replace(" ", "")


def test_conda_env_has_pyprojects_dependencies_with_the_same_bounds():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = dict(map(_requirement, project["dependencies"]))
    env = yaml.safe_load((REPO / "envs" / "fedfactor.yaml").read_text())
    have = {}
    for dep in env["dependencies"]:
        for item in dep["pip"] if isinstance(dep, dict) else [dep]:
            name, spec = _requirement(item)
            if name not in ("python", "pip"):
                have[name] = spec
    assert have == wanted
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    assert _requirement(python)[1] == project["requires-python"]


def test_every_rule_that_runs_fedfactor_runs_in_the_conda_env():
    # the training jobs' command, which the train and tune_train rules' shells start with
    train = re.search(r"\nTRAIN_COMMAND = \(\n((?:    .*\n)+)\)", (REPO / "workflow/rules/train.smk").read_text())[1]
    for smk in (REPO / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()
        # a rule's shell: its indented string lines, up to the next blank line
        shells = [s.replace("TRAIN_COMMAND", train) for s in re.findall(r"\n    shell:\n((?:        .*\n?)+)", text)]
        assert all(re.search(r"(^|[\"; ]|\} )fedfactor ", s) for s in shells), smk.name
        assert len(shells) == len(re.findall(r"    conda:\n        CONDA_ENV\n(?:    #.*\n)*    shell:", text)), smk.name


def _installs(requirements: list[str]) -> set[str]:
    """Every distribution `pip install` of these requirements brings in, from the installed packages'
    own metadata (extras followed, environment markers evaluated here)."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({"extra": extra}):
            continue
        name = req.name.lower().replace("_", "-")
        key = name + "".join(f"[{e}]" for e in sorted(req.extras))
        if key in seen:
            continue
        seen |= {key, name}
        try:
            deps = requires(name) or []
        except PackageNotFoundError:
            continue
        todo += [(Requirement(d), e) for e in ("", *req.extras) for d in deps]
    return seen


def test_the_plain_install_can_build_the_snakemake_report():
    # `snakemake --report` imports pygments, which snakemake gets only through its `reports` extra
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "pygments" in _installs(project["dependencies"])

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
    for smk in (REPO / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()
        commands = re.findall(r"\n    shell:\n        \"(?:OMP_NUM_THREADS=\{threads\} )?fedfactor ", text)
        assert len(commands) == text.count("\n    shell:") == text.count("    conda:\n        CONDA_ENV\n    shell:"), smk.name

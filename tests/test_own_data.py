"""docs/own_data.md's worked example, run as written: its arrays, its run config and study, `snakemake
tune` and the study, in a folder of its own (the checkout's path put in for `path/to/fedfactor`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # two Snakemake workflows, 8 tuning and 4 final training runs

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "own_data.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.S)


def test_the_own_data_example_runs_as_written(tmp_path, fedfactor_env):
    (python,) = _blocks("python")
    (tmp_path / python.splitlines()[0].removeprefix("# ").split(":")[0]).write_text(python)
    for block in _blocks("yaml"):  # each names its file in its first line: `# my_run.yaml: ...`
        (tmp_path / block.splitlines()[0].removeprefix("# ").split(":")[0]).write_text(block)
    (commands,) = _blocks("sh")  # not ```bash: tests/test_readme_commands.py would dry-run them out of their folder
    for line in commands.strip().splitlines():
        argv = line.replace("path/to/fedfactor", str(REPO)).split()
        if argv[0] == "python":
            argv[0] = sys.executable
        r = subprocess.run(argv, cwd=tmp_path, env=fedfactor_env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{line}\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
    arrays = __import__("numpy").load(tmp_path / "my_arrays.npz")
    assert sorted(arrays.files) == ["x", "x_test", "y", "y_test"]
    chosen = yaml.safe_load((tmp_path / "my_tuned.yaml").read_text())["chosen"]["dir0.5"]
    table = (tmp_path / "results" / "my_study" / "tables" / "table.md").read_text()
    # the table's last column: the learning rate each method's runs used, the one tuning chose
    for method in ("fedavg", "local"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {method} |"))
        assert row.rstrip().endswith(f"| lr {chosen[method]['values']['fl.lr']} |"), row
        assert "(n=2, few seeds)" in row
    assert "chosen on validation (dir0.5)" in table

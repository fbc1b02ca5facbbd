"""Tests for fedfactor.fedfac_simulation.config: the simulation study's config and its checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfactor.cli import main
from fedfactor.errors import UsageError
from fedfactor.fedfac_simulation.config import load_simulation_config

CONFIG = str(Path(__file__).resolve().parents[2] / "config" / "simulation" / "fedfac.yaml")


@pytest.mark.parametrize("args, message", [
    (["--set", "data.bogus=1"], "unknown config key 'data.bogus'"),
    (["--set", "split.tau=banana"], "split.tau"),
    (["--set", "grid.p=[0.3,1.5]"], "grid.p"),
    (["--set", "decompositions=[true,magic]"], "decompositions"),
    (["--set", "grid.p=[0.001]"], "no shared or no personal"),
    (["--set", "train.rounds=0"], "train.rounds"),
])
def test_bad_config_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    out = tmp_path / "sim"
    assert main(["simulate", "--config", CONFIG, *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedfactor: error:") and message in err and "\n" not in err
    assert not out.exists()


def test_missing_config_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_simulation_config(tmp_path / "nope.yaml")


def test_config_file_states_the_defaults():
    assert load_simulation_config(CONFIG) == load_simulation_config()

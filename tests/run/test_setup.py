"""A run set up once: the method built from the config's spec, once a run, and serving that run alone."""

import pytest

from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.methods import build
from fedfactor.run import setup as run_setup
from fedfactor.run import simulator
from fedfactor.run.job import train
from fedfactor.run.setup import read_run, set_up
from fedfactor.run.simulator import Simulator

from ..conftest import TINY


def test_the_setup_fills_the_methods_defaults_and_leaves_the_config_it_was_given():
    cfg = load_config(None, [*TINY, "method.name=fedprox"])
    setup = set_up(cfg)
    assert setup.cfg.method == {"name": "fedprox", "mu": 0.01} == setup.method.spec
    assert cfg.method == {"name": "fedprox"}  # the caller's config is not rewritten
    assert setup.cfg.fl == cfg.fl and setup.method.name == "fedprox"


def test_a_bad_hyperparameter_is_named_when_the_run_is_set_up():
    with pytest.raises(UsageError, match="method 'fedprox' has no parameter 'muu'; valid: mu"):
        read_run(None, [*TINY, "method.name=fedprox", "method.muu=1"])


def test_a_run_builds_its_method_once(tmp_path, monkeypatch):
    built = []

    def counted(spec):
        built.append(spec["name"])
        return build(spec)

    monkeypatch.setattr(run_setup, "build", counted)
    monkeypatch.setattr(simulator, "build", counted)
    summary = train(read_run(None, [*TINY, "fl.rounds=1", "method.name=fedper"]), tmp_path / "run")
    assert built == ["fedper"] and summary["method"] == "fedper"


def test_a_set_up_method_serves_one_run():
    setup = read_run(None, [*TINY, "fl.rounds=1"])
    Simulator(setup.cfg, method=setup.method)
    with pytest.raises(ValueError, match="already served a run: set the run up again"):
        Simulator(setup.cfg, method=setup.method)

"""A study's runs (report/cells.py): keyed by scenario and method label, and the runs that cannot go together."""

import json

import pytest

from fedfactor.errors import UsageError
from fedfactor.report.cells import load_runs
from fedfactor.report.spec import StudySpec

from .test_spec import _doc  # the toy study both files build on

PROTOCOL = {"test_pool": "client", "model": "received", "report": "best"}


def _summary(path, scenario, method, seed, protocol=PROTOCOL, dataset="cifar10"):
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({
        "scenario": scenario, "method": method, "seed": seed, "accuracy": 0.5, "accuracy_mean": 0.5,
        "accuracy_best_mean": 0.5, "accuracy_weighted": 0.5, "bytes_total": 10, "rounds": 2, "clients": 4,
        "protocol": protocol, "dataset": dataset}))


def test_runs_are_keyed_by_the_folder_label(tmp_path):
    """summary.json's `method` is the registered name, which labels share (rc20_rl20 ... are all feddecomp)."""
    study = StudySpec.model_validate(_doc(methods={
        "feddecomp": {"name": "feddecomp", "implemented": True},
        "feddecomp_official": {"name": "feddecomp", "implemented": True}}, claims=[]))
    runs = tmp_path / "runs"
    _summary(runs / "s1" / "feddecomp_official" / "seed1", "s1", "feddecomp", 1)
    _summary(runs / "s1" / "feddecomp_official" / "seed0", "s1", "feddecomp", 0)
    _summary(runs / "s1" / "feddecomp" / "seed0", "s1", "feddecomp", 0)
    _summary(tmp_path / "loose", "s2", "feddecomp", 0)  # not in the workflow's layout: its summary's method
    _summary(runs / "s9" / "feddecomp" / "seed0", "s9", "feddecomp", 0)  # a scenario the study does not list
    _summary(runs / "s1" / "retired" / "seed0", "s1", "feddecomp", 0)  # a label the study no longer lists
    loaded = load_runs(study, [runs, tmp_path / "loose" / "summary.json"])
    assert [r.seed for r in loaded.cells[("s1", "feddecomp_official")]] == [0, 1]
    assert len(loaded.cells[("s1", "feddecomp")]) == 1 and len(loaded.cells[("s2", "feddecomp")]) == 1
    assert loaded.ignored == 2 and loaded.protocol.report == "best" and not loaded.synthetic
    # the same run twice (a folder and its file) counts once
    again = load_runs(study, [runs, runs / "s1" / "feddecomp" / "seed0" / "summary.json"])
    assert len(again.cells[("s1", "feddecomp")]) == 1


def test_runs_that_cannot_go_together_are_refused(tmp_path):
    study = StudySpec.model_validate(_doc(claims=[]))
    _summary(tmp_path / "x" / "s1" / "a" / "seed0", "s1", "fedavg", 0)
    _summary(tmp_path / "y" / "s1" / "a" / "seed0", "s1", "fedavg", 0)
    with pytest.raises(UsageError, match="two runs of scenario s1, method a, seed 0"):
        load_runs(study, [tmp_path / "x", tmp_path / "y"])
    _summary(tmp_path / "z" / "s2" / "a" / "seed0", "s2", "fedavg", 0, protocol={**PROTOCOL, "report": "last"})
    with pytest.raises(UsageError, match="different evaluation protocols"):
        load_runs(study, [tmp_path / "x", tmp_path / "z"])
    _summary(tmp_path / "w" / "s1" / "a" / "seed0", "s1", "fedprox", 0)
    with pytest.raises(UsageError, match="filed under method 'a' but its summary says 'fedprox'"):
        load_runs(study, [tmp_path / "w"])
    _summary(tmp_path / "v" / "s1" / "a" / "seed1", "s1", "a", 1, dataset="synthetic:cifar10")
    assert load_runs(study, [tmp_path / "v"]).synthetic

"""A scale or override file never writes into another study's runs, and a partition depends only on
what defines it: a change of rounds, model or method keeps the partitions (and so the runs' inputs)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from fedfactor.config import load_config
from fedfactor.run.clients import build_partition
from fedfactor.study.workflow import partition_sets, study_folder

from .conftest import snakemake_in_process

REPO = Path(__file__).resolve().parents[1]


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_a_file_that_changes_what_runs_gets_its_own_folder(tmp_path):
    study = _write(tmp_path / "study.yaml", {"study": "s", "seeds": [0, 1]})
    mine = _write(tmp_path / "mine.yaml", {"seeds": [0], "overrides": {"fl": {"rounds": 10}}})
    rounds = _write(tmp_path / "rounds 5.yaml", {"overrides": {"fl": {"rounds": 5}}})
    laptop = _write(tmp_path / "laptop.yaml", {"results": "results/laptop", "overrides": {"fl": {"rounds": 5}}})
    where = _write(tmp_path / "cluster.yaml", {"mlflow": {"uri": "http://host:5000"}, "threads_per_job": 4})
    config = {"study": "s"}
    assert study_folder(config, [study]) == "s"
    assert study_folder(config, [study, mine]) == "s+mine"
    assert study_folder(config, [study, mine, rounds]) == "s+mine+rounds_5"
    # a file naming its own results root (config/scale/*.yaml) already keeps its runs apart
    assert study_folder(config, [study, laptop]) == "s"
    # where the store is or how many threads a job gets does not change any result
    assert study_folder(config, [study, where]) == "s"
    # the default study with an override file (an override file alone is refused: check_config_files)
    assert study_folder(config, [REPO / "config" / "config.yaml", mine]) == "s+mine"


DIGITS = str(REPO / "config" / "runs" / "digits.yaml")


def _sets(**overrides):
    return partition_sets(DIGITS, overrides, "data")


def test_partition_sets_hold_only_what_defines_a_partition():
    base = _sets(partition={"kind": "dirichlet", "alpha": 0.5})
    # rounds, epochs, the model, the method, the protocol: the same partition
    assert _sets(partition={"kind": "dirichlet", "alpha": 0.5}, fl={"rounds": 3, "epochs": 9, "lr": 0.1},
                 model={"name": "mlp"}, method={"name": "fedprox", "mu": 0.1}, eval={"test_pool": "client"}) == base
    # the number of clients, the split, the partition's fields, the dataset: another one
    for changed in ({"fl": {"clients": 10}}, {"data": {"split": [0.6, 0.2, 0.2]}},
                    {"partition": {"kind": "dirichlet", "alpha": 0.1}}, {"data": {"name": "synthetic:digits"}}):
        assert _sets(**{"partition": {"kind": "dirichlet", "alpha": 0.5}, **changed}) != base, changed
    assert 'data.root="data"' in base and not any(s.startswith(("fl.rounds", "model.", "method.")) for s in base)


@pytest.mark.parametrize("scenario", [
    {"partition": {"kind": "dirichlet", "alpha": 0.3, "permute_labels": True}, "fl": {"clients": 7}},
    {"partition": {"kind": "class_groups", "groups": [[0, 1], [2, 3, 4]], "clients_per_group": 2},
     "fl": {"clients": 4}, "data": {"split": [0.7, 0.15, 0.15]}},
])
def test_the_partition_sets_alone_build_the_same_partition_as_the_full_run_config(scenario):
    y = np.random.default_rng(0).integers(0, 10, 600)
    full = load_config(DIGITS, [*_sets(**scenario), "seed=3"])
    alone = load_config(None, [*_sets(**scenario), "seed=3"])
    a, b = (build_partition(cfg, y, len(y), 10) for cfg in (full, alone))
    assert a.to_json(y) == b.to_json(y)


def _jobs(out: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", out, re.M)}


@pytest.mark.slow
def test_rounds_keep_the_partitions_and_an_override_file_keeps_the_studys_runs(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("data: {name: digits}\nmodel: {name: mlp}\nfl: {clients: 4, rounds: 2, epochs: 1}\n")
    doc = {"study": "tiny", "run_config": str(run), "results": str(tmp_path / "results"), "seeds": [0],
           "scenarios": {"iid": {"partition": {"kind": "iid"}}}, "methods": {"fedavg": {"name": "fedavg"}}}
    study = _write(tmp_path / "study.yaml", doc)
    part = tmp_path / "results" / "tiny" / "partitions" / "iid" / "seed0.json"
    snakemake_in_process(str(part), "--cores", "1", "--directory", str(tmp_path), "--configfile", str(study))
    assert part.is_file()

    # more rounds, in the study's overrides or in its run config: the runs again, not the partition
    _write(study, {**doc, "overrides": {"fl": {"rounds": 3}}})
    jobs = _jobs(snakemake_in_process("-n", "--directory", str(tmp_path), "--configfile", str(study)))
    assert jobs["train"] == 1 and "partition" not in jobs
    run.write_text(run.read_text().replace("rounds: 2", "rounds: 4"))
    jobs = _jobs(snakemake_in_process("-n", "--directory", str(tmp_path), "--configfile", str(study)))
    assert jobs["train"] == 1 and "partition" not in jobs
    # a partition's own field: the partition again
    _write(study, {**doc, "scenarios": {"iid": {"partition": {"kind": "iid"}, "fl": {"clients": 3}}}})
    assert _jobs(snakemake_in_process("-n", "--directory", str(tmp_path), "--configfile", str(study)))["partition"] == 1

    # an override file after the study plans everything in a folder of its own, nothing in the study's
    _write(study, doc)
    mine = _write(tmp_path / "mine.yaml", {"overrides": {"fl": {"rounds": 10}}})
    out = snakemake_in_process("-n", "-p", "--directory", str(tmp_path), "--configfile", str(study), str(mine))
    assert f"{tmp_path}/results/tiny+mine/jobs/train/iid/seed0-1.json" in out
    assert f"{tmp_path}/results/tiny/" not in out
    # and an MLflow experiment of its own: its runs share the study's run names (iid/fedavg/seed0)
    assert re.search(r"mlflow-init .*--experiment '?fedfactor-tiny\+mine'? ", out), out

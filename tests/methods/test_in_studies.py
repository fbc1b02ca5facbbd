"""Every baseline a paper study lists trains under that study's protocol.

The study smoke runs (tests/test_study_smoke.py) run one method per study through the whole DAG,
and each paper's own methods have their protocol tests; this runs every baseline a study lists
once per run config, in this process: the study's first scenario
under the study's run config (the paper's protocol: splits, test pool, evaluated model, reported
number), scaled down as the smoke runs are (synthetic data of the dataset's shape, one round, the
run config's scale from tests/conftest.py, every model at 1/8 width), with the study's own
hyperparameters. A method and run config pair is run once, from the first study that lists it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from fedfactor.config import load_config
from fedfactor.run.simulator import Simulator
from fedfactor.methods import METHODS
from fedfactor.study.workflow import study_runs

from ..conftest import SMOKE_SCALE

pytestmark = pytest.mark.slow  # a training round per baseline and study protocol

REPO = Path(__file__).resolve().parents[2]
STUDIES = sorted((REPO / "config" / "studies").glob("*.yaml"))
# The comparison methods of the papers' tables: docs/baselines.md's table (its first column), which
# names this test as the one that trains each under every study's protocol
BASELINES = set(re.findall(r"`(\w+)`", "".join(
    line.split("|")[1] for line in (REPO / "docs/baselines.md").read_text().splitlines() if line.startswith("| `"))))
# What keeps a run to seconds on a CPU, per run config: the smoke runs' scale (tests/conftest.py), one
# round. SimFed's 20-domain split keeps 5 % for validation: of 300 synthetic images some domains would
# get none, and FedFOMO needs validation data (the real CIFAR-100 gives each about 150).
SCALE = {**SMOKE_SCALE,
         "simfed.yaml": {**SMOKE_SCALE["simfed.yaml"], "data": {"split": [0.7, 0.15, 0.15]}}}


def _cases():
    assert {"fedper", "pfedgate", "agnostic_fl"} <= BASELINES  # the table read as meant
    seen = set()
    for path in STUDIES:
        study = yaml.safe_load(path.read_text())
        if "simulation" in study:
            continue
        scenario = next(iter(study["scenarios"]))
        for label, entry in study["methods"].items():
            key = (study["run_config"], entry["name"])
            if entry["name"] not in BASELINES or entry["name"] not in METHODS or key in seen:
                continue
            seen.add(key)
            yield pytest.param(path, scenario, label, id=f"{path.stem}:{label}")


@pytest.mark.parametrize("path, scenario, label", list(_cases()))
def test_study_method_trains_a_round_under_the_study_protocol(path, scenario, label, tmp_path):
    study = yaml.safe_load(path.read_text())
    config = {**study, "data_root": str(tmp_path), "smoke": True,
              "overrides": {"fl": {"rounds": 1, "eval_every": 1, "device": "cpu"}, "tracking": {"enabled": False}}}
    for section, values in SCALE[Path(study["run_config"]).name].items():
        config["overrides"][section] = {**config["overrides"].get(section, {}), **values}
    # the run as the study's workflow expands it (at the study's own values: the smoke runs are not tuned)
    run = next(r for r in study_runs(config) if r.kind == "final" and r.scenario == scenario and r.method == label)
    cfg = load_config(REPO / study["run_config"], run.sets)
    sim = Simulator(cfg)
    records = sim.run()
    assert cfg.data.name.startswith("synthetic:") and cfg.method["name"] == study["methods"][label]["name"]
    assert len(records) == 1 and records[0].test is not None
    assert math.isfinite(records[0].train_loss)
    assert 0.0 <= records[0].test.mean <= 1.0 and records[0].test.count.sum() > 0

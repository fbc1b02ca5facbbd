"""Every study file (config/studies/*.yaml, and the default config/config.yaml) builds a valid DAG.

Without running anything: the study matches the workflow's schema, its run config exists, and every
scenario x method loads exactly as the train rule builds it (`fedfactor.study.workflow.run_sets` on top of
the run config), which checks method names and hyperparameters, dataset names and partition keys.
Each scenario's partition spec is also resolved against its dataset and client count (class-group
presets need a matching number of clients) and its model is built, as a run would, without data.
One test per study walks its cells (a config load takes milliseconds; a test per cell was 900 tests)
and names every cell that fails.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml
from snakemake.utils import validate

from fedfactor.config import load_config
from fedfactor.data import dataset_info, task_label_maps
from fedfactor.models import build_model, resolve_layers
from fedfactor.methods import METHODS, build
from fedfactor.study.workflow import method_entry, run_sets, scenario_sets, study_runs

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
STUDY_FILES = [REPO / "config" / "config.yaml", *sorted((REPO / "config" / "studies").glob("*.yaml"))]


def _read(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def _read_or_empty(path: Path) -> dict:
    """For building test ids: a broken file yields no cases here and fails the schema test instead."""
    try:
        study = _read(path)
    except (OSError, yaml.YAMLError):
        return {}
    return study if isinstance(study, dict) else {}


def _name(path: Path) -> str:
    return str(path.relative_to(REPO / "config"))


def _run_studies():
    """The study files with scenarios (FedFac's simulation study has none)."""
    return [path for path in STUDY_FILES if _read_or_empty(path).get("scenarios")]


def _sets(study: dict, scenario: str, label: str | None = None) -> list[str]:
    """The `--set` arguments the train rule passes, as the study's expansion gives them
    (workflow.study_runs): a scenario's, or a method's in it (at the study's own values)."""
    study = {**study, "data_root": study.get("data_root", "data")}
    if label is None:
        return scenario_sets(study, scenario)
    return next(r.sets for r in study_runs(study) if r.kind == "final" and (r.scenario, r.method) == (scenario, label))


@pytest.mark.parametrize("path", STUDY_FILES, ids=_name)
def test_study_matches_the_schema_and_its_run_config_loads(path):
    study = _read(path)
    validate(copy.deepcopy(study), str(SCHEMA), set_default=True)
    if "simulation" in study:  # FedFac's simulation study: its own config, no runs
        from fedfactor.fedfac_simulation.config import load_simulation_config

        load_simulation_config(REPO / study["simulation"], run_sets(study.get("overrides") or {}))
        return
    run_config = REPO / study["run_config"]
    assert run_config.is_file(), f"{_name(path)}: run_config {study['run_config']} does not exist"
    load_config(run_config)


def test_study_names_and_mlflow_experiments_are_unique():
    studies = {_name(p): _read(p) for p in STUDY_FILES}
    names = [s["study"] for s in studies.values()]
    assert len(set(names)) == len(names), f"study names repeat: {names}"
    # the workflow's default experiment is fedfactor-<study>
    experiments = [(s.get("mlflow") or {}).get("experiment", f"fedfactor-{s['study']}") for s in studies.values()]
    assert len(set(experiments)) == len(experiments), f"MLflow experiments repeat: {experiments}"


@pytest.mark.parametrize("path", _run_studies(), ids=_name)
def test_every_scenario_and_method_of_the_study_loads(path):
    """Every cell of the study, checked in one test that names every failing cell."""
    study = _read(path)
    # methods a study lists before fedfactor implements them are skipped by the workflow (with a note)
    labels = [label for label, entry in (study.get("methods") or {}).items()
              if isinstance(entry, dict) and entry.get("name") in METHODS]
    failures = []
    for scenario in study["scenarios"]:
        for label in [None, *labels]:  # None: the scenario alone
            try:
                if label is None:
                    _check_scenario(study, scenario)
                else:
                    _check_method(study, scenario, label)
            except Exception as error:  # every failing cell is reported, not only the first
                failures.append(f"{scenario}{':' + label if label else ''}: {type(error).__name__}: {error}")
    assert not failures, f"{len(failures)} cells of {_name(path)} fail:\n" + "\n".join(failures)


def _check_scenario(study, scenario):
    """The scenario loads, its partition fits its dataset and client count, and its model builds."""
    cfg = load_config(REPO / study["run_config"], _sets(study, scenario))
    assert cfg.scenario == scenario
    info = dataset_info(cfg.data.name, REPO / cfg.data.root)
    _, num_outputs = task_label_maps(cfg.partition.spec(), info.num_classes, cfg.fl.clients)
    # on the meta device: the layers and their shapes are built without filling their weights,
    # which for the papers' VGG-16 takes seconds per scenario on a CPU
    with torch.device("meta"):
        build_model(cfg.model.name, info.channels, info.height, info.width, num_outputs)


def _check_method(study, scenario, label):
    entry = method_entry(study, scenario, label)  # the study's settings, the scenario's own on top
    cfg = load_config(REPO / study["run_config"], _sets(study, scenario, label))
    cfg.method = build(cfg.method).spec  # typed and checked by the method, as the train job does
    # the study's hyperparameters arrive as given, none dropped or renamed on the way, and so do the
    # method's own run-config overrides
    for section, values in entry.pop("run", {}).items():
        for key, value in values.items():
            assert getattr(getattr(cfg, section), key) == value, f"run.{section}.{key}"
    for key, value in entry.items():
        assert cfg.method[key] == value, f"{key} = {cfg.method.get(key)!r}, study gives {value!r}"
    if "layers" in cfg.method:  # FedFac's Lambda names layers of this scenario's model
        info = dataset_info(cfg.data.name, REPO / cfg.data.root)
        with torch.device("meta"):
            model = build_model(cfg.model.name, info.channels, info.height, info.width, info.num_classes)
        resolve_layers(model, cfg.method["layers"])

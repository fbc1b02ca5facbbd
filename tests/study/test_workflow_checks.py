"""The checks `snakemake -n` makes of a study before any job runs (fedfactor.study.workflow, called by the
Snakefile and workflow/rules/study.smk), grouped by input class, called directly: each refusal takes
milliseconds. tests/study/test_workflow.py runs two of them through a real `snakemake -n`."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from fedfactor.errors import UsageError
from fedfactor.study.workflow import (check_config_files, check_method_names, check_overrides, check_required_keys,
                                      check_results_folder, check_runs, checked_runs, implemented, method_sets,
                                      schema_problem)

REPO = Path(__file__).resolve().parents[2]
SCHEMA = str(REPO / "workflow" / "schemas" / "config.schema.yaml")
DIGITS = str(REPO / "config" / "runs" / "digits.yaml")


def _study(**changes) -> dict:
    study = {"study": "s", "run_config": DIGITS, "data_root": "data", "seeds": [0],
             "scenarios": {"a": {"partition": {"kind": "iid"}}},
             "methods": {"fedavg": {"name": "fedavg"}}}
    study.update(changes)
    return study


# -- the config files themselves: read strictly, the study first ---------------------------------

BOMB = "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefg", "bcdefgh"))


@pytest.mark.parametrize("text, message", [
    ("study: s\nseeds: [0]\nseeds: [0, 1]\n", "key 'seeds' appears twice in one mapping (line 3, column 1)"),
    ("study: s\nscenarios:\n  a: {fl: {rounds: 2}, fl: {rounds: 3}}\n", "key 'fl' appears twice in one mapping"),
    ("study: s\na: &a [x, x, x, x, x, x, x, x, x]\n" + BOMB, "expands to over 100,000 values"),
])
def test_a_study_file_is_read_strictly(tmp_path, text, message):
    path = tmp_path / "study.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=re.escape(message)) as e:
        check_config_files([path])
    assert str(e.value).startswith(str(path))


def test_the_first_file_is_a_study_and_the_others_only_override_it(tmp_path):
    study, other = tmp_path / "study.yaml", tmp_path / "other.yaml"
    study.write_text(json.dumps(_study()))
    other.write_text(json.dumps(_study(study="other")))
    mine = tmp_path / "mine.yaml"
    mine.write_text("seeds: [0]\noverrides: {fl: {rounds: 2}}\n")
    check_config_files([study, mine])
    check_config_files([REPO / "config" / "config.yaml", mine])
    # alone, it would be merged into the default study (the Snakefile loads config/config.yaml after it)
    with pytest.raises(UsageError, match=f"^{mine}: holds no `study:`, so it is no study file.*"
                                         f"--configfile config/config.yaml {mine}$"):
        check_config_files([mine, REPO / "config" / "config.yaml"])
    with pytest.raises(UsageError, match=f"^{other}: a second study \\(study: 'other'\\) after {study}"):
        check_config_files([study, other])


# -- the study's own keys: the schema, as one line ------------------------------------------------

def _schema_problem(study: dict) -> str:
    with pytest.raises(WorkflowError) as e:
        validate(copy.deepcopy(study), SCHEMA, set_default=True)
    return schema_problem(e.value)


@pytest.mark.parametrize("change, message", [
    ({"runs_per_job": 0}, "runs_per_job: 0 is less than the minimum of 1"),
    ({"runs_per_job": -1}, "runs_per_job: -1 is less than the minimum of 1"),
    ({"runs_per_job": "x"}, "runs_per_job: 'x' is not of type 'integer'"),
    ({"runs_per_job": True}, "runs_per_job: True is not of type 'integer'"),
    ({"seeds": [-1]}, "seeds.0: -1 is less than the minimum of 0"),
    ({"seeds": ["0"]}, "seeds.0: '0' is not of type 'integer'"),
    ({"seeds": []}, "seeds: [] should be non-empty"),
    ({"seeds": [0, 1, 0]}, "seeds: [0, 1, 0] has non-unique elements"),
    ({"seeds": 0}, "seeds: 0 is not of type 'array'"),
    ({"scenarios": ["a"]}, "scenarios: ['a'] is not of type 'object'"),
    ({"scenarios": "a"}, "scenarios: 'a' is not of type 'object'"),
    ({"scenarios": {"a": "dirichlet"}}, "scenarios.a: 'dirichlet' is not of type 'object'"),
    ({"scenarios": {"a": 3}}, "scenarios.a: 3 is not of type 'object'"),
    ({"scenarios": {}}, "scenarios: {} should be non-empty"),
    ({"scenarios": {"a b": {}}}, "scenarios: 'a b' does not match"),
    ({"methods": ["fedavg"]}, "methods: ['fedavg'] is not of type 'object'"),
    ({"methods": {"f": "fedavg"}}, "methods.f: 'fedavg' is not of type 'object'"),
    ({"methods": {"f": {"mu": 1}}}, "methods.f: 'name' is a required property"),
    ({"methods": {"f": {"name": 3}}}, "methods.f.name: 3 is not of type 'string'"),
    ({"methods": {"f": {"name": "fedavg", "run": 3}}}, "methods.f.run: 3 is not of type 'object'"),
    ({"runs_per_jobs": 2}, "unknown key 'runs_per_jobs'; valid keys: study, title, run_config,"),
    ({"mlflow": {"url": "x"}}, "mlflow: unknown key 'url'; valid keys: uri, experiment"),
    ({"study": "a b"}, "study: 'a b' does not match"),
    ({"smoke": "maybe"}, "smoke: 'maybe' is not of type 'boolean'"),
])
def test_study_keys_of_the_wrong_type_or_shape_are_one_line(change, message):
    problem = _schema_problem(_study(**change))
    assert problem.startswith(message) and "\n" not in problem, problem


def test_a_long_value_is_cut_short_in_the_schema_message():
    problem = _schema_problem(_study(scenarios=[f"scenario{i}" for i in range(1000)]))
    assert problem.startswith("scenarios: ['scenario0', 'scenario1',") and len(problem) < 330


@pytest.mark.parametrize("key", ["run_config", "seeds", "scenarios", "methods"])
def test_a_study_names_its_run_config_seeds_scenarios_and_methods(key):
    study = _study()
    study.pop(key)
    with pytest.raises(UsageError, match=f"study 's' lacks {key}: a study names run_config, seeds, scenarios"):
        check_required_keys(study)
    check_required_keys({"study": "sim", "simulation": "config/simulation/fedfac.yaml"})


# -- scenarios, overrides and a method's `run`: nothing the workflow sets itself -------------------

@pytest.mark.parametrize("change, message", [
    ({"scenarios": {"a": {"seed": 5}}}, "scenarios.a.seed: the workflow sets it for every run (the study's `seeds`)"),
    ({"scenarios": {"a": {"scenario": "b"}}}, "scenarios.a.scenario: the workflow sets it"),
    ({"scenarios": {"a": {"method": {"mu": 0.1}}}}, "scenarios.a.method: the workflow sets it"),
    ({"scenarios": {"a": {"partition": {"file": "p.json"}}}}, "scenarios.a.partition.file: the workflow sets it"),
    ({"overrides": {"label": "x"}}, "overrides.label: the workflow sets it"),
    ({"overrides": {"tracking": {"uri": "sqlite:///x.db"}}}, "overrides.tracking.uri: the workflow sets it for "
                                                             "every run (the study's `mlflow: {uri: ...}`)"),
    ({"methods": {"f": {"name": "fedavg", "run": {"method": {"name": "local"}}}}}, "methods.f.run.method: "),
    ({"methods": {"f": {"name": "fedavg", "run": {"tracking": {"experiment_id": "3"}}}}},
     "methods.f.run.tracking.experiment_id: "),
    # the scenario's partition job would be used unchanged
    ({"methods": {"f": {"name": "fedavg", "run": {"partition": {"alpha": 0.1}}}}},
     "methods.f.run.partition: the scenario's partition depends on it"),
    ({"methods": {"f": {"name": "fedavg", "run": {"fl": {"epochs": 1, "clients": 4}}}}}, "methods.f.run.fl.clients: "),
    ({"methods": {"f": {"name": "fedavg", "run": {"data": {"name": "mnist"}}}}}, "methods.f.run.data.name: "),
])
def test_keys_the_workflow_sets_are_refused_where_they_would_be_lost(change, message):
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        check_overrides(_study(**change))


def test_a_methods_own_training_settings_and_a_scenarios_data_root_are_fine():
    check_overrides(_study(scenarios={"a": {"data": {"root": "elsewhere"}, "tracking": {"enabled": False}}},
                           methods={"f": {"name": "fedavg", "run": {"fl": {"on_divergence": "skip", "epochs": 1},
                                                                   "data": {"augment": "none"}}}}))


# -- every run config, as its train job loads it ---------------------------------------------------

def _runs(study: dict) -> list[tuple[str, list[str]]]:
    """The runs study.smk gives check_runs: the study's expansion, each at its seeds (checked_runs)."""
    return checked_runs(study, None, "results/s", "sqlite:///results/mlflow.db")


def _check(**change) -> None:
    study = _study(**change)
    check_runs(study["run_config"], _runs(study))


def test_a_sound_study_passes_and_so_does_what_the_train_job_would_coerce():
    _check()
    # JSON strings that the train job's YAML reading and typed config turn into numbers, as it would
    _check(scenarios={"a": {"fl": {"lr": "1e-3", "rounds": "3"}}, "b": {"partition": {"kind": "dirichlet"}}},
           methods={"p": {"name": "fedprox", "mu": "0.1"}, "f": {"name": "fedper", "run": {"fl": {"epochs": 1}}}})


@pytest.mark.parametrize("change, message", [
    # method hyperparameters, typed and checked by the method
    ({"methods": {"p": {"name": "fedprox", "mu": -1}}},
     "scenario 'a', method 'p': method.mu: input should be greater than or equal to 0 (got -1)"),
    ({"methods": {"p": {"name": "fedprox", "muu": 0.1}}}, "scenario 'a', method 'p': method 'fedprox' has no "
                                                          "parameter 'muu'; valid: mu"),
    ({"methods": {"p": {"name": "fedprox", "mu": "much"}}}, "scenario 'a', method 'p': method.mu: "),
    ({"methods": {"f": {"name": "fedavg", "run": {"fl": {"on_divergence": "maybe"}}}}},
     "scenario 'a', method 'f': fl.on_divergence: input should be 'stop' or 'skip' (got 'maybe')"),
    # datasets
    ({"scenarios": {"a": {"data": {"name": "nope"}}}}, "scenario 'a', method 'fedavg': unknown dataset 'nope'; "
                                                      "choose one of: cifar10"),
    ({"scenarios": {"a": {"data": {"name": "npz:/nonexistent/x.npz"}}}}, "scenario 'a', method 'fedavg': npz file "),
    ({"scenarios": {"a": {"data": {"name": 3}}}}, "scenario 'a', method 'fedavg': data.name: "),
    # scenario keys: unknown, of the wrong type, out of range
    ({"scenarios": {"a": {"partiton": {"kind": "iid"}}}}, "scenario 'a', method 'fedavg': unknown config key "
                                                          "'partiton'"),
    ({"scenarios": {"a": {"fl": {"roundz": 2}}}}, "scenario 'a', method 'fedavg': unknown config key 'fl.roundz'"),
    ({"scenarios": {"a": {"fl": 3}}}, "scenario 'a', method 'fedavg': fl: "),
    ({"scenarios": {"a": {"fl": {"rounds": "x"}}}}, "scenario 'a', method 'fedavg': fl.rounds: input should be a "
                                                    "valid integer"),
    ({"scenarios": {"a": {"fl": {"rounds": [1]}}}}, "scenario 'a', method 'fedavg': fl.rounds: "),
    ({"scenarios": {"a": {"fl": {"epochs": True}}}}, "scenario 'a', method 'fedavg': fl.epochs: must be a number"),
    ({"scenarios": {"a": {"fl": {"rounds": 0}}}}, "scenario 'a', method 'fedavg': fl.rounds: input should be "
                                                  "greater than or equal to 1"),
    ({"scenarios": {"a": {"fl": {"rounds": 10**12}}}}, "scenario 'a', method 'fedavg': fl.rounds: input should be "
                                                       "less than or equal to"),
    # partitions and models, against the dataset and the clients
    ({"scenarios": {"a": {"partition": {"kind": "nope"}}}}, "scenario 'a', method 'fedavg': unknown partition "
                                                            "'nope'; choose one of:"),
    ({"scenarios": {"a": {"partition": {"kind": "class_groups", "groups": [[0, 1], [2, 3]],
                                        "clients_per_group": 3}}}},
     "scenario 'a', method 'fedavg': class_groups with 2 groups x 3 clients_per_group needs num_clients = 6"),
    ({"scenarios": {"a": {"model": {"name": "nope"}}}}, "scenario 'a', method 'fedavg': unknown model 'nope'"),
    # the store and the seed the train rule adds
    ({"seeds": [2**64]}, "scenario 'a', method 'fedavg': seed: input should be less than or equal to"),
])
def test_each_run_config_is_checked_as_its_train_job_checks_it(change, message):
    with pytest.raises(UsageError) as e:
        _check(**change)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_the_first_bad_run_is_named_among_many():
    study = _study(scenarios={f"s{i}": {"fl": {"rounds": 2 + i}} for i in range(5)},
                   methods={"f": {"name": "fedavg"}, "p": {"name": "fedprox", "mu": 0.1}})
    study["scenarios"]["s3"]["fl"]["rounds"] = -3
    with pytest.raises(UsageError, match=r"^scenario 's3', method 'f': fl\.rounds: "):
        check_runs(DIGITS, _runs(study))


# -- issue 39: a typo'd method name and a results root that is a file, refused at the DAG build ----


def test_a_method_name_with_a_typo_is_refused_naming_the_nearest_methods():
    study = _study(methods={"fedavg": {"name": "fedavg"}, "x": {"name": "fedavgg"}})
    with pytest.raises(UsageError, match=r"^methods.x: no method is named 'fedavgg'; did you mean fedavg or "):
        check_method_names(study)
    with pytest.raises(UsageError, match="registered: agnostic_fl, "):  # nothing close: every name
        check_method_names(_study(methods={"x": {"name": "qqqqqqq"}}))


def test_a_method_not_implemented_yet_is_listed_with_a_marker_and_skipped():
    study = _study(methods={"fedavg": {"name": "fedavg"}, "soon": {"name": "fedsoon", "implemented": False}})
    check_method_names(study)
    assert implemented(study, ["fedavg", "soon"]) == {"fedavg": True, "soon": False}
    validate(copy.deepcopy(study), SCHEMA, set_default=True)  # the marker passes the study schema
    with pytest.raises(UsageError, match=r"^methods.soon.implemented: true or false \(got 'no'\)"):
        check_method_names(_study(methods={"soon": {"name": "fedsoon", "implemented": "no"}}))


def test_the_implemented_marker_of_a_registered_method_is_no_hyperparameter():
    assert method_sets({"name": "fedprox", "mu": 0.1, "implemented": True}, "p") == [
        'method.name="fedprox"', "method.mu=0.1", 'label="p"']


def test_every_study_names_registered_methods():
    import yaml

    for path in sorted((REPO / "config" / "studies").glob("*.yaml")) + [REPO / "config" / "config.yaml"]:
        study = yaml.safe_load(path.read_text())
        if "methods" in study:
            check_method_names(study)


def test_a_results_root_that_is_a_file_or_under_one_is_refused(tmp_path):
    (tmp_path / "afile").write_text("x\n")
    for results in (tmp_path / "afile", tmp_path / "afile" / "deeper"):
        with pytest.raises(UsageError, match=f"^results: '{tmp_path / 'afile'}' is a file, not a folder"):
            check_results_folder(str(results))
    check_results_folder(str(tmp_path / "new" / "results"))  # made by the jobs
    check_results_folder(str(tmp_path))

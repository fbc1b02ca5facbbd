"""The `paper` / `claims` sections of the study YAMLs (report/study.py): every study file in
config/studies/ checked against the paper CSVs it names, and the study.json the workflow writes from it."""

import json
import re
from pathlib import Path

import pytest
import yaml

from fedfactor.errors import UsageError
from fedfactor.methods import METHODS
from fedfactor.report.spec import StudySpec
from fedfactor.report.study import check_study_sections
from fedfactor.study.workflow import implemented, study_spec

REPO = Path(__file__).resolve().parents[2]
NUMBERS = REPO / "config" / "paper_numbers"
STUDIES = sorted((REPO / "config" / "studies").glob("*.yaml"))
NO_PAPER_TABLE = {"factorized_fl_ablations", "feddecomp_elora_digits"}  # figures only, no transcribed numbers
# not a paper result: every method of the papers' tables on digits, like the default study
NOT_A_PAPER_STUDY = {"default_grid"}


def _study_json(config):
    """study.json as the workflow writes it from a study file (fedfactor.study.workflow.study_spec)."""
    doc = study_spec(config, list(config["scenarios"]), implemented(config, list(config["methods"])))
    return json.loads(json.dumps(doc))


def test_the_workflows_study_json_marks_what_is_implemented_and_keeps_the_sections():
    config = yaml.safe_load((REPO / "config" / "studies" / "factorized_fl_label.yaml").read_text())
    config["methods"]["later"] = {"name": "a_method_not_written_yet"}
    study = StudySpec.model_validate(_study_json(config))
    assert study.methods["fedavg"].implemented and study.methods["fedfomo"].implemented
    assert not study.methods["later"].implemented
    assert len(study.claims) == len(config["claims"]) and len(study.paper.tables) == 1


def test_check_study_sections_names_the_problem():
    base = yaml.safe_load((REPO / "config" / "studies" / "simfed_table5.yaml").read_text())
    broken = {**base, "paper": {**base["paper"], "tables": [{**base["paper"]["tables"][0],
                                                             "methods": {"fedavg": "FedAvg ", "simfed": "SimFed"}}]}}
    with pytest.raises(UsageError, match=r"simfed_table5.csv \(accuracy_pct\): scenario 'cifar10_permuted_iid' x "
                                         r"method 'fedavg': no value of .*'FedAvg '.*its methods on 'CIFAR-10'"):
        check_study_sections(broken, NUMBERS)
    with pytest.raises(UsageError, match="study simfed_table5: claims.0: `kind` must be one of"):
        check_study_sections({**base, "claims": [{**base["claims"][0], "kind": "more"}]}, NUMBERS)
    with pytest.raises(UsageError, match="claim 'factorization_helps_fedavg' names method 'fedper'"):
        check_study_sections({**base, "claims": [{**base["claims"][0], "b": "fedper"}]}, NUMBERS)


def _registered_names(config):
    return {label: (m or {}).get("name") for label, m in config["methods"].items()}


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_every_study_maps_onto_its_paper_csvs_and_lists_what_its_claims_name(path):
    config = yaml.safe_load(path.read_text())
    if "simulation" in config:  # FedFac's simulation: its own table and figures, no runs to claim on
        assert check_study_sections(config, NUMBERS) == (None, [])
        return
    # the schema, every scenario and method label named in `paper` and `claims` listed by the study, and
    # every mapped (dataset, setting, method) found exactly once in the named CSV
    paper, claims = check_study_sections(config, NUMBERS)
    if config["study"] in NOT_A_PAPER_STUDY:
        assert paper is None and claims == []
        return
    assert claims, f"{path.name} lists no claims"
    if config["study"] in NO_PAPER_TABLE:
        assert paper is None
    else:
        assert paper is not None and all((NUMBERS / t.csv).is_file() for t in paper.tables)
    for claim in claims:
        assert set(claim.scenario_names()) <= set(config["scenarios"]), claim.id
        assert {s.method for s in claim.sides()} <= set(config["methods"]), claim.id
    # the study file loads as the study.json the workflow writes from it
    study = StudySpec.model_validate(_study_json(config))
    # a method not implemented yet says so where the study lists it
    text = path.read_text()
    for label, name in _registered_names(config).items():
        if name not in METHODS:
            line = next(x for x in text.splitlines() if re.match(rf"\s+{re.escape(label)}:", x))
            assert "not implemented yet: skipped with a note" in line, line
            assert not study.methods[label].implemented

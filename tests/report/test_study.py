"""study.json and the `paper` / `claims` sections of the study YAMLs: schema, messages, runs, and every
study file in config/studies/ checked against the paper CSVs it names."""

import json
import re
from pathlib import Path

import pytest
import yaml

from fedfactor.errors import UsageError
from fedfactor.methods import METHODS
from fedfactor.report.cells import load_runs
from fedfactor.report.spec import PaperSpec, StudySpec, load_study
from fedfactor.report.study import check_study_sections
from fedfactor.workflow import implemented, study_spec

REPO = Path(__file__).resolve().parents[2]
NUMBERS = REPO / "config" / "paper_numbers"
STUDIES = sorted((REPO / "config" / "studies").glob("*.yaml"))
NO_PAPER_TABLE = {"factorized_fl_ablations", "feddecomp_elora_digits"}  # figures only, no transcribed numbers
# not a paper result: every method of the papers' tables on digits, like the default study
NOT_A_PAPER_STUDY = {"default_grid"}
PROTOCOL = {"test_pool": "client", "model": "received", "report": "best"}


def _doc(**changes):
    doc = {
        "study": "toy", "title": "toy study", "smoke": False, "seeds": [0, 1], "scenarios": ["s1", "s2"],
        "methods": {"a": {"name": "fedavg", "implemented": True}, "b": {"name": "fedper", "implemented": False}},
        "claims": [{"id": "c1", "claim": "a beats b", "source": "Table 1", "kind": "order", "a": "a", "b": "b",
                    "scenarios": ["s1"]}],
    }
    doc.update(changes)
    return doc


def _load(tmp_path, doc):
    path = tmp_path / "study.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return load_study(path)


def test_a_study_file_loads(tmp_path):
    study = _load(tmp_path, _doc())
    assert study.methods["b"].implemented is False and study.paper is None
    assert study.claims[0].a[0].method == "a" and study.claims[0].margin == 0


BAD = [  # (change to a valid study.json, what the one-line message says)
    ("{", "cannot read study file"),
    (_doc(title=None), "title: input should be a valid string"),
    ({k: v for k, v in _doc().items() if k != "smoke"}, "smoke: missing"),
    (_doc(seeds=["1"]), r"seeds.0: input should be a valid integer \(got '1'\)"),
    (_doc(extra=1), "extra: unknown key"),
    (_doc(methods={"a": {"name": "fedavg"}}), "methods.a.implemented: missing"),
    (_doc(claims=[{"id": "c1", "claim": "x", "source": "y", "kind": "bigger"}]),
     "claims.0: `kind` must be one of order, ratio, drop, close, best"),
    (_doc(claims=[{"id": "c1", "claim": "x", "source": "y", "kind": "order", "a": "a", "b": "b", "scenarios": "s1",
                   "margin": "1"}]), r"claims.0.margin: input should be a valid number \(got '1'\)"),
    (_doc(claims=[{"id": "c1", "claim": "x", "source": "y", "kind": "order", "a": "a", "b": "zz", "scenarios": "s1"}]),
     r"claim 'c1' names method 'zz', which the study does not list \(a, b\)"),
    (_doc(claims=[{"id": "c1", "claim": "x", "source": "y", "kind": "drop", "method": "a", "from": "s1", "to": "s9"}]),
     "claim 'c1' names scenario 's9'"),
    (_doc(claims=[{"id": "c1", "claim": "x", "source": "y", "kind": "drop", "method": "a", "from": ["s1", "s2"],
                   "to": "s2"}]), "`from` and `to` pair scenarios one to one: 2 vs 1 given"),
    (_doc(claims=[{"id": "c1", "claim": "x", "source": "y", "kind": "ratio", "a": "a", "b": "b", "scenarios": "s1"}]),
     "ratio claim 'c1' needs `min`, `max` or both"),
    (_doc(claims=[{"id": "c1", "claim": "x", "source": "y", "kind": "close", "tolerance": 1, "a": "a", "b": "b",
                   "method": "a", "from": "s1", "to": "s2", "scenarios": "s1"}]),
     "give either a, b and scenarios, or method, from and to"),
    (_doc(claims=[{"id": "c1", "claim": "x", "source": "y", "kind": "best", "method": "a", "among": ["a", "b"],
                   "scenarios": "s1"}]), "`among` lists the method itself"),
    (_doc(claims=[{"id": "c1", "claim": "x", "source": "y", "kind": "order", "a": "a",
                   "b": {"method": "b", "metric": "bytes"}, "scenarios": "s1"}]), "compares accuracies with bytes"),
    (_doc(claims=[*_doc()["claims"], *_doc()["claims"]]), "claim ids repeat: c1"),
    (_doc(paper={"name": "P", "tables": [{"csv": "t.csv", "metric": "cost_gb", "dataset": "D",
                                          "scenarios": {"s1": {"setting": "X", "clients": [0]}},
                                          "methods": {"a": "A"}}]}),
     "`clients` picks accuracies; this table's metric is cost_gb"),
    (_doc(paper={"name": "P", "tables": [{"csv": "t.csv", "metric": "accuracy_pct", "dataset": "D",
                                          "scenarios": {"s1": {"setting": "X", "clients": [0]}},
                                          "methods": {"a": {"method": "A", "new_clients": "ensemble"}}}]}),
     r"per-client columns \(`clients`\) or new-client strategies \(`new_clients`\), not both"),
    (_doc(paper={"name": "P", "tables": [{"csv": "t.csv", "metric": "accuracy_pct", "scenarios": {"s1": "X"},
                                          "methods": {"a": "A"}}]}),
     "scenario 's1' names no dataset"),
    (_doc(paper={"name": "P", "tables": [{"csv": "t.csv", "metric": "accuracy_pct", "dataset": "D",
                                          "scenarios": {"s1": "X"}, "methods": {"zz": "A"}}]}),
     r"paper.tables\[0\] names method 'zz'"),
    (_doc(paper={"name": "P", "tables": [{"csv": "../t.csv", "metric": "accuracy_pct", "dataset": "D",
                                          "scenarios": {"s1": "X"}, "methods": {"a": "A"}}]}),
     "paper.tables.0.csv: string should match pattern"),
]


@pytest.mark.parametrize("doc, message", BAD, ids=[m for _, m in BAD])
def test_a_bad_study_file_is_one_clear_line(tmp_path, doc, message):
    with pytest.raises(UsageError, match=message) as err:
        _load(tmp_path, doc)
    assert "\n" not in str(err.value) and str(err.value).count("study") >= 1


def test_shorthands_of_the_paper_section():
    paper = PaperSpec.model_validate({"name": "P", "tables": [{
        "csv": "t.csv", "metric": "accuracy_pct", "dataset": "D",
        "scenarios": {"s1": "Standard IID", "s2": {"setting": "A; B"}, "s3": [{"setting": "H"}, {"setting": "G"}]},
        "methods": {"a": "FedAvg", "b": {"method": "FedDecomp", "setting": "R_l=20%"},
                    "c": ["FedAvg", {"method": "FedAvg+", "new_clients": "finetune"}]}}]})
    t = paper.tables[0]
    assert t.metric == ["accuracy_pct"] and paper.numbers == "config/paper_numbers"
    assert [c.setting for c in t.scenarios["s1"]] == ["Standard IID"]
    assert [c.setting for c in t.scenarios["s3"]] == ["H", "G"]
    assert [r.method for r in t.methods["c"]] == ["FedAvg", "FedAvg+"] and t.methods["b"][0].setting == "R_l=20%"


def _study_json(config):
    """study.json as the workflow writes it from a study file (fedfactor.workflow.study_spec)."""
    doc = study_spec(config, list(config["scenarios"]), implemented(config, list(config["methods"])))
    return json.loads(json.dumps(doc))


def test_the_workflows_study_json_marks_what_is_implemented_and_keeps_the_sections():
    config = yaml.safe_load((REPO / "config" / "studies" / "factorized_fl_label.yaml").read_text())
    config["methods"]["later"] = {"name": "a_method_not_written_yet"}
    study = StudySpec.model_validate(_study_json(config))
    assert study.methods["fedavg"].implemented and study.methods["fedfomo"].implemented
    assert not study.methods["later"].implemented
    assert len(study.claims) == len(config["claims"]) and len(study.paper.tables) == 1


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

"""study.json (report/spec.py): its schema, the shorthands of the paper section, one-line messages."""

import json

import pytest

from fedfactor.errors import UsageError
from fedfactor.report.spec import PaperSpec, load_study


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

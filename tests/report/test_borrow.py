"""claims_from (report/borrow.py): a study takes another study's claims, scenario by scenario and method by
method, on hand-written study files; every problem is one UsageError line; and the CPU-scale studies in
config/studies/cpu/ take every claim of the paper studies exactly once."""

from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fedfactor.errors import UsageError
from fedfactor.report.borrow import borrowed_claims, read_study_file
from fedfactor.report.claims import evaluate_claims
from fedfactor.report.spec import check_spec
from fedfactor.study.workflow import implemented, study_spec

REPO = Path(__file__).resolve().parents[2]
PAPER_STUDIES = sorted((REPO / "config" / "studies").glob("*.yaml"))
CPU_STUDIES = sorted((REPO / "config" / "studies" / "cpu").glob("*.yaml"))
PAPER_CLAIMS = 92  # every claim of config/studies/*.yaml


def _claim(id, **kw):
    return {"id": id, "claim": f"claim {id}", "source": "000 Table 1", **kw}


# The paper study's claims, one of each kind. Its methods: a (a seed method, with the text variant a_text),
# b and c; its scenarios s1, s2, s3.
CLAIMS = [
    _claim("beats", kind="order", a="a", b=["b", {"method": "c", "metric": "accuracy"}], scenarios=["s1", "s2", "s3"]),
    _claim("cheap", kind="ratio", a={"method": "b", "metric": "bytes"}, b="a", scenarios=["s1", "s2"], max=1.0),
    _claim("falls", kind="drop", method="b", **{"from": ["s1", "s2"]}, to=["s3", "s3"], note="why this reading"),
    _claim("steady", kind="close", method="c", **{"from": ["s1", "s2"]}, to=["s3", "s3"], tolerance=1.0),
    _claim("top_s3", kind="best", method="a", among=["b", "c"], scenarios=["s3"]),
    _claim("c_near_b", kind="close", a="c", b="b", scenarios=["s1", "s2"], tolerance=2.0),
]


@pytest.fixture
def paper(tmp_path):
    """Writes the paper study (its claims: CLAIMS unless given) and returns its path, absolute."""
    def write(claims=CLAIMS):
        path = tmp_path / "paper.yaml"
        path.write_text(yaml.safe_dump({
            "study": "paperx", "title": "the paper", "run_config": "config/runs/digits.yaml", "seeds": [0, 1, 2],
            "scenarios": {"s1": {}, "s2": {}, "s3": {}},
            "methods": {"a": {"name": "factorized_fl_alpha"}, "a_text": {"name": "factorized_fl_alpha_text"},
                        "b": {"name": "fedavg"}, "c": {"name": "local"}},
            "text_variants": {"a": "a_text"}, "claims": claims,
        }, sort_keys=False))
        return str(path)
    return write


def _ours(labels=("a", "a_text", "b", "c"), **entry):
    """A CPU-scale study, scenarios x and y, that takes the paper study's claims through `entry`."""
    names = {"a": "factorized_fl_alpha", "alpha": "factorized_fl_alpha", "a_text": "factorized_fl_alpha_text",
             "b": "fedavg", "avg": "fedavg", "c": "local"}
    return {"study": "cpu_x", "title": "x at CPU scale", "run_config": "config/runs/digits.yaml", "seeds": [0, 1, 2],
            "scenarios": {"x": {}, "y": {}}, "methods": {m: {"name": names[m]} for m in labels},
            "claims_from": [entry]}


def _by_id(items):
    return {c["id"]: c for c in items}


# s1 and s2 both onto x, s3 onto y
SHARED = {"s1": "x", "s2": "x", "s3": "y"}
# s1 onto x, s2 onto y, s3 needs paper scale
PARTIAL = {"scenarios": {"s1": "x", "s2": "y"}, "needs_paper_scale": {"scenarios": {"s3": "no analogue here"}}}


def test_two_scenarios_mapped_onto_one_are_tested_once(paper):
    claims, deferred = borrowed_claims(_ours(study=paper(), scenarios=SHARED))
    c = _by_id(claims)
    assert deferred == [] and list(c) == [x["id"] for x in CLAIMS]
    assert c["beats"]["scenarios"] == ["x", "y"]  # s1 and s2 are both x: once
    assert c["cheap"]["scenarios"] == ["x"]
    # (s1, s3) and (s2, s3) are both (x, y): one comparison
    assert (c["falls"]["from"], c["falls"]["to"]) == (["x"], ["y"])
    assert (c["steady"]["from"], c["steady"]["to"]) == (["x"], ["y"])
    assert c["top_s3"]["scenarios"] == ["y"]
    assert all(x["origin"] == "paperx" and "scale_note" not in x for x in claims)
    assert c["falls"]["note"] == "why this reading" and c["falls"]["kind"] == "drop"


def test_a_partly_mapped_claim_keeps_its_mapped_comparisons_and_says_which_need_paper_scale(paper):
    extra = _claim("falls_twice", kind="drop", method="b", **{"from": ["s1", "s1"]}, to=["s2", "s3"])
    claims, deferred = borrowed_claims(_ours(study=paper([*CLAIMS, extra]), **PARTIAL))
    c = _by_id(claims)
    assert c["beats"]["scenarios"] == ["x", "y"]
    assert c["beats"]["scale_note"] == ("tested on 2 of the paper study's 3 scenarios; paper scale only: "
                                        "s3: no analogue here")
    assert (c["falls_twice"]["from"], c["falls_twice"]["to"]) == (["x"], ["y"])  # (s1, s3) left out
    assert "s3: no analogue here" in c["falls_twice"]["scale_note"]
    assert "scale_note" not in c["cheap"] and "scale_note" not in c["c_near_b"]  # all of theirs mapped
    assert c["cheap"]["scenarios"] == ["x", "y"] and c["c_near_b"]["scenarios"] == ["x", "y"]
    # every comparison needs s3: not tested here, with the reason
    d = _by_id(deferred)
    assert sorted(d) == ["falls", "steady", "top_s3"] and sorted(c) == ["beats", "c_near_b", "cheap", "falls_twice"]
    assert d["falls"] == {"origin": "paperx", "id": "falls", "claim": "claim falls", "source": "000 Table 1",
                          "note": "why this reading", "reason": "s3: no analogue here", "text": False}
    assert d["steady"]["reason"] == "s3: no analogue here" and "note" not in d["steady"]
    # top_s3 names a, which has a text variant in the paper study: a row for each mode
    assert d["top_s3"]["text"] is True and d["steady"]["text"] is False


def test_a_claim_naming_a_method_that_needs_paper_scale_is_deferred(paper):
    entry = {"study": paper(), "scenarios": SHARED, "needs_paper_scale": {"methods": {"c": "VGG-16's layers"}}}
    claims, deferred = borrowed_claims(_ours(labels=("a", "a_text", "b"), **entry))  # c need not be ours
    d = _by_id(deferred)
    assert sorted(d) == ["beats", "c_near_b", "steady", "top_s3"] and sorted(_by_id(claims)) == ["cheap", "falls"]
    assert all(x["reason"] == "c: VGG-16's layers" for x in deferred)
    assert d["beats"]["text"] is True and d["top_s3"]["text"] is True  # they name a
    assert d["c_near_b"]["text"] is False and d["steady"]["text"] is False


def test_methods_are_renamed_on_every_side(paper):
    entry = {"study": paper(), "scenarios": SHARED, "methods": {"a": "alpha", "b": "avg"}}
    claims, deferred = borrowed_claims(_ours(labels=("alpha", "avg", "c"), **entry))
    c = _by_id(claims)
    assert deferred == []
    assert c["beats"]["a"] == [{"method": "alpha"}]
    assert c["beats"]["b"] == [{"method": "avg"}, {"method": "c", "metric": "accuracy"}]
    assert c["cheap"]["a"] == {"method": "avg", "metric": "bytes"} and c["cheap"]["b"] == {"method": "alpha"}
    assert c["falls"]["method"] == {"method": "avg"}
    assert c["top_s3"]["method"] == {"method": "alpha"} and c["top_s3"]["among"] == [{"method": "avg"}, {"method": "c"}]
    assert c["c_near_b"]["a"] == {"method": "c"} and c["c_near_b"]["b"] == {"method": "avg"}


@pytest.mark.parametrize("entry, ours, problem", [
    ({"scenarios": {"s1": "x", "s2": "y"}}, {},
     r"claims_from\[0\] \(.*paper.yaml\): scenario 's3' is neither mapped onto one of ours \(`scenarios`\) nor "
     r"given a reason"),
    ({"scenarios": {**SHARED, "s9": "x"}}, {}, r"no scenario 's9' in that study \(s1, s2, s3\)"),
    ({"scenarios": SHARED, "needs_paper_scale": {"scenarios": {"s8": "why"}}}, {},
     r"no scenario 's8' in that study \(s1, s2, s3\)"),
    ({"scenarios": {**SHARED, "s3": "z"}}, {}, r"maps onto scenario 'z', which this study does not list"),
    ({"scenarios": SHARED}, {"labels": ("a", "a_text", "b")},
     r"claim 'beats' names method 'c', which this study does not list; list it, map it \(`methods`\)"),
    ({"scenarios": SHARED, "methods": {"a": "alpha"}}, {},
     r"claim 'beats' names method 'alpha', which this study does not list"),
    ({"scenarios": SHARED, "needs_paper_scale": {"scenarios": {"s3": "why"}}}, {},
     r"scenario 's3' is both mapped and left to paper scale"),
    ({"scenarios": SHARED, "scenario": {"s1": "x"}}, {}, r"^claims_from\[0\]\.scenario: unknown key$"),
    ({"scenarios": SHARED, "needs_paper_scale": {"method": {"c": "why"}}}, {},
     r"^claims_from\[0\]\.needs_paper_scale\.method: unknown key$"),
])
def test_a_bad_claims_from_entry_is_one_usage_error(paper, entry, ours, problem):
    with pytest.raises(UsageError, match=problem) as err:
        borrowed_claims(_ours(**ours, study=paper(), **entry))
    assert "\n" not in str(err.value)


def test_a_pair_of_their_scenarios_mapped_onto_one_of_ours_is_refused(paper):
    study = paper([_claim("falls", kind="drop", method="b", **{"from": ["s1"]}, to=["s2"])])
    with pytest.raises(UsageError, match=r"claim 'falls' compares two of its scenarios that this study maps onto one "
                                         r"\('x'\); map them onto two"):
        borrowed_claims(_ours(study=study, scenarios=SHARED))


def test_the_other_study_file_must_be_a_study(tmp_path):
    with pytest.raises(UsageError, match=r"cannot read study file .*nowhere.yaml"):
        borrowed_claims(_ours(study=str(tmp_path / "nowhere.yaml"), scenarios={}))
    (tmp_path / "plain.yaml").write_text("scenarios: {s1: {}}\n")
    with pytest.raises(UsageError, match=r"plain.yaml is not a study file \(it names no `study:`\)"):
        borrowed_claims(_ours(study=str(tmp_path / "plain.yaml"), scenarios={}))


def test_borrowed_claims_and_deferred_ones_are_reported_with_their_origin(paper, tmp_path):
    config = _ours(study=paper(), **PARTIAL)
    config["text_variants"] = {"a": "a_text"}
    spec = check_spec(study_spec(config, list(config["scenarios"]), implemented(config, list(config["methods"]))))
    assert [c.id for c in spec.claims] == ["beats", "cheap", "c_near_b"]
    assert [(d.id, d.text) for d in spec.paper_scale_only] == [("falls", False), ("steady", False), ("top_s3", True)]
    out = tmp_path / "claims"
    evaluate_claims(spec, [], out)
    f = pd.read_csv(out / "claims.csv", keep_default_na=False)
    assert set(f["origin"]) == {"paperx"}
    rows = {(r["id"], r["mode"]): r for r in f.to_dict("records")}
    # beats and cheap name a: checked as run and with the text variant; no runs yet
    assert sorted(rows) == [("beats", "as run"), ("beats", "text"), ("c_near_b", ""), ("cheap", "as run"),
                            ("cheap", "text"), ("falls", ""), ("steady", ""), ("top_s3", "as run"),
                            ("top_s3", "text")]
    for key in [("falls", ""), ("steady", ""), ("top_s3", "as run"), ("top_s3", "text")]:
        assert rows[key]["verdict"] == "needs paper scale" and rows[key]["missing"] == "s3: no analogue here"
    assert rows[("falls", "")]["note"] == "why this reading"
    assert {rows[k]["verdict"] for k in rows if k[0] in ("beats", "cheap", "c_near_b")} == {"not run"}
    assert rows[("beats", "as run")]["scale_note"].endswith("paper scale only: s3: no analogue here")
    assert (out / "comparisons.csv").read_text().startswith("origin,id,mode,comparison,")
    md = (out / "claims.md").read_text()
    assert "| paperx.top_s3 | text | **needs paper scale** |" in md
    assert "paper scale only: s3: no analogue here" in md
    assert "At this scale: tested on 2 of the paper study's 3 scenarios" in md


# ------------------------------------------------------------------------- the repository's studies

@pytest.mark.parametrize("path", CPU_STUDIES, ids=lambda p: p.stem)
def test_every_cpu_scale_study_takes_its_claims(path):
    config = read_study_file(path)
    spec = check_spec(study_spec(config, list(config["scenarios"]), implemented(config, list(config["methods"]))))
    assert spec.claims or spec.paper_scale_only
    assert all(c.origin for c in spec.claims)  # the claims are the paper studies'


def test_every_paper_claim_is_tested_or_deferred_at_cpu_scale_exactly_once():
    paper = Counter()
    for path in PAPER_STUDIES:
        config = read_study_file(path)
        paper.update((config["study"], c["id"]) for c in config.get("claims") or [])
    taken = Counter()
    for path in CPU_STUDIES:
        config = read_study_file(path)
        claims, deferred = borrowed_claims(config)
        taken.update((c["origin"], c["id"]) for c in [*claims, *deferred])
    assert len(paper) == PAPER_CLAIMS and sum(paper.values()) == PAPER_CLAIMS
    assert set(taken) == set(paper)
    assert [k for k, n in taken.items() if n > 1] == []

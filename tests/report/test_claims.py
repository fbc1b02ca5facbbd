"""fedfactor claims: every kind of claim, reproduced and not, on hand-built runs with hand-computed numbers."""

import json

import pandas as pd
import pytest

from fedfactor.report.claims import evaluate_claims
from fedfactor.report.spec import SMOKE_COLUMN, SMOKE_TITLE, StudySpec

PROTOCOL = {"test_pool": "client", "model": "received", "report": "best_weighted"}


def _run(root, scenario, label, seed, acc, nbytes=1e9, dataset="cifar10", new_clients=None):
    """A finished run as the workflow files it: runs/<scenario>/<label>/seed<N>/summary.json."""
    d = root / "runs" / scenario / label / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({
        "scenario": scenario, "method": label, "seed": seed, "accuracy": acc, "accuracy_mean": acc,
        "accuracy_best_mean": acc, "accuracy_weighted": acc, "bytes_total": nbytes, "rounds": 2, "clients": 4,
        "protocol": PROTOCOL, "dataset": dataset, "per_client_accuracy": [acc] * 4, "new_clients": new_clients,
    }))


def _study(claims, smoke=False, implemented=("a", "b", "local"), text_variants=None):
    methods = {m: {"name": m, "implemented": m in implemented} for m in ("a", "b", "c", "local")}
    return StudySpec.model_validate({
        "study": "toy", "title": "toy study", "smoke": smoke, "seeds": [0, 1, 2], "scenarios": ["s1", "s2"],
        "methods": methods, "claims": claims, "text_variants": text_variants or {},
    })


def _claim(id, **kw):
    return {"id": id, "claim": f"claim {id}", "source": "000 Table 1", **kw}


@pytest.fixture
def runs(tmp_path):
    # s1: a = 70, 72, 74 (mean 72); b = 60, 75, 62 (mean 65.67): a above b in seeds 0 and 2 only
    for seed, (a, b) in enumerate([(0.70, 0.60), (0.72, 0.75), (0.74, 0.62)]):
        _run(tmp_path, "s1", "a", seed, a, nbytes=1e9)
        _run(tmp_path, "s1", "b", seed, b, nbytes=6e9 + seed * 1e9)  # b's bytes: 6, 7, 8 GB
    # local: 80 in s1, 60 in s2 (seed 2: 85 in s2, a rise)
    for seed, (x, y) in enumerate([(0.80, 0.60), (0.80, 0.60), (0.80, 0.85)]):
        _run(tmp_path, "s1", "local", seed, x)
        _run(tmp_path, "s2", "local", seed, y)
    return tmp_path


def _verdicts(study, runs, out):
    frame = evaluate_claims(study, [runs / "runs"], out)
    return frame.set_index("id")


def test_order_on_the_means_with_per_seed_agreement(runs, tmp_path):
    study = _study([_claim("yes", kind="order", a="a", b="b", scenarios=["s1"]),
                    _claim("margin", kind="order", a="a", b="b", scenarios=["s1"], margin=7.0),
                    _claim("reverse", kind="order", a="b", b="a", scenarios=["s1"])])
    f = _verdicts(study, runs, tmp_path / "out")
    assert f.loc["yes", "verdict"] == "reproduced"
    # 72.00 - 65.67 = +6.33 points; seeds 0 and 2 agree, seed 1 (72 < 75) does not
    assert "a 72.00 vs b 65.67 (+6.33 pp)" in f.loc["yes", "observed"]
    assert f.loc["yes", "seeds_agree"] == "2/3" and f.loc["yes", "seeds"] == 3
    assert f.loc["margin", "verdict"] == "not reproduced"  # 6.33 < 7
    assert f.loc["margin", "seeds_agree"] == "2/3"  # 10 and 12 points clear 7, -3 does not
    assert f.loc["reverse", "verdict"] == "not reproduced" and f.loc["reverse", "seeds_agree"] == "1/3"
    assert "by >= 7.00 pp" in f.loc["margin", "condition"]


def test_not_run_names_the_missing_run_or_method(runs, tmp_path):
    study = _study([_claim("unimpl", kind="order", a="a", b=["b", "c"], scenarios=["s1"]),
                    _claim("norun", kind="order", a="a", b="b", scenarios=["s1", "s2"])])
    f = _verdicts(study, runs, tmp_path / "out")
    assert f.loc["unimpl", "verdict"] == "not run"
    assert f.loc["unimpl", "missing"] == "c: not implemented yet"
    # what could be compared is still shown
    assert "a 72.00 vs b 65.67" in f.loc["unimpl", "observed"]
    assert f.loc["norun", "verdict"] == "not run"
    assert f.loc["norun", "missing"] == "a in s2: no runs; b in s2: no runs"


def test_ratio_of_bytes(runs, tmp_path):
    study = _study([_claim("six", kind="ratio", a="b", b="a", scenarios=["s1"], min=5.5, max=7.5),
                    _claim("tight", kind="ratio", a="b", b="a", scenarios=["s1"], max=6.5),
                    _claim("small", kind="ratio", a="a", b="b", scenarios=["s1"], max=0.2)])
    f = _verdicts(study, runs, tmp_path / "out")
    # b sends 6, 7, 8 GB, a 1 GB: ratio of the means 7.0; per seed 6, 7, 8
    assert f.loc["six", "verdict"] == "reproduced" and f.loc["six", "seeds_agree"] == "2/3"
    assert "= 7" in f.loc["six", "observed"] and "b 7.0000 / a 1.0000" in f.loc["six", "observed"]
    assert f.loc["tight", "verdict"] == "not reproduced" and f.loc["tight", "seeds_agree"] == "1/3"
    assert f.loc["small", "verdict"] == "reproduced"  # 1/7 = 0.143
    assert f.loc["small", "condition"] == "a / b <= 0.2 in every scenario"


def test_drop_from_one_scenario_to_another(runs, tmp_path):
    study = _study([_claim("falls", kind="drop", method="local", **{"from": "s1"}, to="s2", margin=5.0),
                    _claim("far", kind="drop", method="local", **{"from": ["s1"]}, to=["s2"], margin=20.0)])
    f = _verdicts(study, runs, tmp_path / "out")
    # local: 80 -> 68.33 on the means (60, 60, 85 in s2): a fall of 11.67 points; seed 2 rises
    assert f.loc["falls", "verdict"] == "reproduced" and f.loc["falls", "seeds_agree"] == "2/3"
    assert "local: s1 80.00 -> s2 68.33 (+11.67 pp)" in f.loc["falls", "observed"]
    assert f.loc["far", "verdict"] == "not reproduced"


def test_close_within_a_tolerance(runs, tmp_path):
    study = _study([_claim("near", kind="close", a="a", b="b", scenarios=["s1"], tolerance=7.0),
                    _claim("apart", kind="close", a="a", b="b", scenarios=["s1"], tolerance=6.0),
                    _claim("across", kind="close", method="local", **{"from": "s1"}, to="s2", tolerance=1.0)])
    f = _verdicts(study, runs, tmp_path / "out")
    assert f.loc["near", "verdict"] == "reproduced"  # |6.33| <= 7
    assert f.loc["near", "seeds_agree"] == "1/3"  # per seed: 10, -3, 12
    assert f.loc["apart", "verdict"] == "not reproduced"
    assert f.loc["across", "verdict"] == "not reproduced"


def test_best_of_a_set(runs, tmp_path):
    study = _study([_claim("top", kind="best", method="local", among=["a", "b"], scenarios="s1"),
                    _claim("lead", kind="best", method="local", among=["a", "b"], scenarios="s1", margin=9.0),
                    _claim("not_top", kind="best", method="a", among=["b", "local"], scenarios="s1"),
                    _claim("cheapest", kind="best", metric="bytes", method="a", among=["b"], scenarios="s1")])
    f = _verdicts(study, runs, tmp_path / "out")
    # local 80 vs the next best a 72: +8 points
    assert f.loc["top", "verdict"] == "reproduced" and f.loc["top", "seeds_agree"] == "3/3"
    assert "next best a 72.00 (+8.00 pp)" in f.loc["top", "observed"]
    assert f.loc["lead", "verdict"] == "not reproduced"
    assert f.loc["not_top", "verdict"] == "not reproduced"
    assert f.loc["cheapest", "verdict"] == "reproduced"  # for bytes the lowest is best: 1 GB vs 7 GB
    assert "lowest" in f.loc["cheapest", "condition"]


def test_new_client_strategies_and_a_missing_one(tmp_path):
    for seed in range(3):
        nc = {"clients": [9], "strategies": {
            "ensemble": {"accuracy_mean": 0.5, "accuracy_weighted": 0.66, "per_client": [0.5]},
            "localtrain": {"accuracy_mean": 0.7, "accuracy_weighted": 0.60, "per_client": [0.7]}}}
        _run(tmp_path, "s1", "a", seed, 0.7, new_clients=nc)
    study = _study([
        _claim("ens", kind="order", a={"method": "a", "metric": "new_clients.ensemble"},
               b={"method": "a", "metric": "new_clients.localtrain"}, scenarios=["s1"]),
        _claim("ft", kind="close", tolerance=2, a={"method": "a", "metric": "new_clients.ensemble"},
               b={"method": "a", "metric": "new_clients.finetune"}, scenarios=["s1"])])
    f = _verdicts(study, tmp_path, tmp_path / "out")
    # FedFac's protocol (best_weighted) reads the weighted accuracies: 66 vs 60
    assert f.loc["ens", "verdict"] == "reproduced"
    assert "a [new_clients.ensemble] 66.00 vs a [new_clients.localtrain] 60.00" in f.loc["ens", "observed"]
    assert f.loc["ft", "verdict"] == "not run"
    assert "no new-client strategy 'finetune'" in f.loc["ft", "missing"]


def test_files_and_smoke_flags(runs, tmp_path):
    study = _study([_claim("yes", kind="order", a="a", b="b", scenarios=["s1"])])
    out = tmp_path / "out"
    evaluate_claims(study, [runs / "runs"], out)
    md = (out / "claims.md").read_text()
    assert md.startswith("# Claims: toy study") and "SMOKE" not in md
    assert "| yes |  | **reproduced** |" in md and "1 claims: 1 reproduced, 0 not reproduced, 0 not run" in md
    assert "own test split" in md and "best round of the test-size-weighted mean" in md
    html = (out / "claims.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and 'class="reproduced"' in html
    csv = pd.read_csv(out / "claims.csv", keep_default_na=False)
    assert list(csv["verdict"]) == ["reproduced"] and list(csv["smoke_run"]) == [""]

    # a smoke study, or any run on synthetic data, is flagged everywhere
    _run(runs, "s2", "a", 0, 0.5, dataset="synthetic:cifar10")
    for smoke_study in (_study(study.model_dump(by_alias=True)["claims"], smoke=True), study):
        frame = evaluate_claims(smoke_study, [runs / "runs"], out)
        assert (out / "claims.md").read_text().startswith(f"# {SMOKE_TITLE}Claims")
        assert SMOKE_COLUMN in (out / "claims.html").read_text()
        assert list(frame["smoke_run"]) == [SMOKE_COLUMN]
        assert frame["verdict"].iloc[0] == "reproduced"  # verdicts are still computed


def test_a_study_without_claims_and_without_runs(tmp_path):
    frame = evaluate_claims(_study([]), [], tmp_path)
    assert frame.empty and "This study lists no claims." in (tmp_path / "claims.md").read_text()
    frame = evaluate_claims(_study([_claim("x", kind="order", a="a", b="b", scenarios=["s1"])]), [], tmp_path)
    assert frame["verdict"].tolist() == ["not run"] and "no runs yet" in (tmp_path / "claims.md").read_text()


def test_a_claim_about_an_as_run_method_is_checked_again_with_its_text_variant(runs, tmp_path):
    for seed, acc in enumerate([0.50, 0.52, 0.54]):  # c, a's text variant: mean 52, below b's 65.67
        _run(runs, "s1", "c", seed, acc)
    study = _study([_claim("above", kind="order", a="a", b="b", scenarios=["s1"]),
                    _claim("other", kind="order", a="b", b="local", scenarios=["s1"])],
                   implemented=("a", "b", "c", "local"), text_variants={"a": "c"})
    frame = evaluate_claims(study, [runs / "runs"], tmp_path / "out")
    rows = {(r.id, r.mode): r for r in frame.itertuples()}
    assert set(rows) == {("above", "as run"), ("above", "text"), ("other", "")}
    assert rows["above", "as run"].verdict == "reproduced"
    assert rows["above", "text"].verdict == "not reproduced"
    assert "c 52.00 vs b 65.67" in rows["above", "text"].observed
    md = (tmp_path / "out" / "claims.md").read_text()
    assert "| above | text | **not reproduced** |" in md and "'text'" in md


def test_every_kind_of_claim_swaps_its_as_run_labels_for_the_text_variants(runs, tmp_path):
    for seed, acc in enumerate([0.50, 0.52, 0.54]):
        _run(runs, "s1", "c", seed, acc)
        _run(runs, "s2", "a", seed, 0.70)
        _run(runs, "s2", "c", seed, 0.52)
    claims = [_claim("best", kind="best", method="a", among=["b"], scenarios=["s1"]),
              _claim("drop", kind="drop", method="a", **{"from": ["s2"], "to": ["s1"]}),
              _claim("close", kind="close", a="a", b="b", scenarios=["s1"], tolerance=1.0),
              _claim("ratio", kind="ratio", a="a", b="b", scenarios=["s1"], max=1.0)]
    study = _study(claims, implemented=("a", "b", "c", "local"), text_variants={"a": "c"})
    frame = evaluate_claims(study, [runs / "runs"], tmp_path / "out")
    text = frame[frame["mode"] == "text"].set_index("id")
    assert sorted(text.index) == ["best", "close", "drop", "ratio"]
    assert all("a " not in o and " a:" not in o for o in text["observed"])
    assert "c 52.00" in text.loc["best", "observed"] and text.loc["best", "verdict"] == "not reproduced"


def test_text_variants_must_name_listed_methods():
    with pytest.raises(ValueError, match="text_variants names method 'nope'"):
        _study([], text_variants={"a": "nope"})

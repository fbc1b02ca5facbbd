"""fedfactor claims: every kind of claim, reproduced, not reproduced and within noise, on hand-built runs with
hand-computed numbers and intervals."""

import json
import statistics

import pandas as pd
import pytest
from scipy import stats

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


T2 = 4.302653  # Student t's 97.5 % quantile with 2 degrees of freedom: the 95 % interval of 3 seeds


@pytest.fixture
def runs(tmp_path):
    # s1: a = 70, 72, 74 (mean 72); b = 61, 62, 63 (mean 62): a - b = 9, 10, 11 per seed, mean 10, sd 1,
    # 95 % interval 10 -+ T2 / sqrt(3) = [7.52, 12.48]
    for seed, (a, b) in enumerate([(0.70, 0.61), (0.72, 0.62), (0.74, 0.63)]):
        _run(tmp_path, "s1", "a", seed, a, nbytes=1e9)
        _run(tmp_path, "s1", "b", seed, b, nbytes=7e9)  # the same bytes in every seed, as real runs send
    # local: 80 in s1, 60, 62, 64 in s2: a drop of 20, 18, 16 (mean 18, sd 2, interval [13.03, 22.97])
    for seed, (x, y) in enumerate([(0.80, 0.60), (0.80, 0.62), (0.80, 0.64)]):
        _run(tmp_path, "s1", "local", seed, x)
        _run(tmp_path, "s2", "local", seed, y)
    return tmp_path


def _verdicts(study, runs, out):
    frame = evaluate_claims(study, [runs / "runs"], out)
    return frame.set_index("id")


def test_order_is_decided_on_the_interval_of_the_paired_differences(runs, tmp_path):
    study = _study([_claim("yes", kind="order", a="a", b="b", scenarios=["s1"]),
                    _claim("margin", kind="order", a="a", b="b", scenarios=["s1"], margin=9.5),
                    _claim("far", kind="order", a="a", b="b", scenarios=["s1"], margin=13.0),
                    _claim("reverse", kind="order", a="b", b="a", scenarios=["s1"])])
    f = _verdicts(study, runs, tmp_path / "out")
    assert f.loc["yes", "verdict"] == "reproduced"  # [7.52, 12.48] lies above 0
    assert "a 72.00 vs b 62.00 (+10.00 pp)" in f.loc["yes", "observed"]
    assert f.loc["yes", "interval"].startswith("s1: a vs b: +10.00 pp, 95 % CI [+7.52, +12.48], paired t-test p=0.0")
    assert f.loc["yes", "interval"].endswith(", n=3 (reproduced)")
    assert f.loc["yes", "seeds_agree"] == "3/3" and f.loc["yes", "seeds"] == 3
    # a margin inside the interval: within noise, though seeds 1 and 2 (10, 11) clear it on their own
    assert f.loc["margin", "verdict"] == "within noise" and f.loc["margin", "seeds_agree"] == "2/3"
    assert "by >= 9.50 pp" in f.loc["margin", "condition"]
    assert f.loc["far", "verdict"] == "not reproduced"  # 12.48 < 13
    assert f.loc["reverse", "verdict"] == "not reproduced" and f.loc["reverse", "seeds_agree"] == "0/3"


@pytest.mark.parametrize("diffs, sd, verdict", [
    ((-2.7, 3.3, 0.3), 3.0, "within noise"),  # a 0.3-point difference with a 3-point spread
    ((9.5, 10.0, 10.5), 0.5, "reproduced"),  # 10 points, spread 0.5: [8.76, 11.24]
    ((-10.5, -10.0, -9.5), 0.5, "not reproduced"),
])
def test_a_difference_within_the_seeds_spread_is_within_noise(tmp_path, diffs, sd, verdict):
    for seed, d in enumerate(diffs):
        _run(tmp_path, "s1", "a", seed, (60 + d) / 100)
        _run(tmp_path, "s1", "b", seed, 0.60)
    study = _study([_claim("x", kind="order", a="a", b="b", scenarios=["s1"])])
    f = _verdicts(study, tmp_path, tmp_path / "out")
    assert f.loc["x", "verdict"] == verdict
    mean, half = sum(diffs) / 3, T2 * sd / 3 ** 0.5
    assert f"95 % CI [{mean - half:+.2f}, {mean + half:+.2f}]" in f.loc["x", "interval"]


def test_a_claim_is_within_noise_unless_a_comparison_fails(runs, tmp_path):
    for seed, x in enumerate([0.70, 0.80, 0.90]):  # a in s2: 70, 80, 90 against local's 60, 62, 64
        _run(runs, "s2", "a", seed, x)
    study = _study([_claim("mixed", kind="order", a="a", b="local", scenarios=["s2"]),
                    _claim("one_noisy", kind="order", a="local", b="a", scenarios=["s1", "s2"])])
    f = _verdicts(study, runs, tmp_path / "out")
    # s2: a - local = 10, 18, 26: mean 18, sd 8, interval [-1.87, 37.87]
    assert f.loc["mixed", "verdict"] == "within noise" and f.loc["mixed", "seeds_agree"] == "3/3"
    assert "[-1.87, +37.87]" in f.loc["mixed", "interval"]
    # s1 (local - a = 10, 8, 6) reproduces, s2 is within noise on the other side of 0: within noise
    assert f.loc["one_noisy", "verdict"] == "within noise"
    assert "(reproduced); s2: local vs a:" in f.loc["one_noisy", "interval"]
    md, html = (tmp_path / "out" / "claims.md").read_text(), (tmp_path / "out" / "claims.html").read_text()
    assert "2 claims: 0 reproduced, 0 not reproduced, 2 within noise, 0 not run" in md
    assert "| mixed |  | **within noise** |" in md and "95 % CI" in md and 'class="within-noise"' in html
    study = _study([_claim("fails", kind="order", a="a", b="local", scenarios=["s1", "s2"])])
    assert _verdicts(study, runs, tmp_path / "out").loc["fails", "verdict"] == "not reproduced"  # s1: 6 to 10 below


def test_one_seed_has_no_interval_and_only_bytes_are_decided_on_it(tmp_path):
    _run(tmp_path, "s1", "a", 0, 0.90, nbytes=1e9)
    _run(tmp_path, "s1", "b", 0, 0.50, nbytes=3e9)
    study = _study([_claim("acc", kind="order", a="a", b="b", scenarios=["s1"]),
                    _claim("cheap", kind="best", metric="bytes", method="a", among=["b"], scenarios=["s1"])])
    f = _verdicts(study, tmp_path, tmp_path / "out")
    assert f.loc["acc", "verdict"] == "within noise"  # 40 points, but one run says nothing about the next
    assert f.loc["acc", "interval"] == "s1: a vs b: +40.00 pp, n=1, no interval (within noise)"
    assert f.loc["cheap", "verdict"] == "reproduced"
    assert "+2.0000 GB, n=1, no interval, bytes taken as exact (reproduced)" in f.loc["cheap", "interval"]


def test_seeds_not_shared_fall_back_to_welchs_test(tmp_path):
    for seed, x in zip([0, 1, 2], [0.70, 0.72, 0.74]):
        _run(tmp_path, "s1", "a", seed, x)
    for seed, x in zip([3, 4], [0.60, 0.62]):
        _run(tmp_path, "s1", "b", seed, x)
    f = _verdicts(_study([_claim("x", kind="order", a="a", b="b", scenarios=["s1"])]), tmp_path, tmp_path / "out")
    # variances 4 and 2 over 3 and 2 runs: se^2 = 4/3 + 2/2, Welch-Satterthwaite degrees of freedom
    se2, df = 4 / 3 + 1, (4 / 3 + 1) ** 2 / ((4 / 3) ** 2 / 2 + 1 ** 2 / 1)
    half = stats.t.ppf(0.975, df) * se2 ** 0.5
    assert f"+11.00 pp, 95 % CI [{11 - half:+.2f}, {11 + half:+.2f}], Welch t-test (seeds not paired)" \
        in f.loc["x", "interval"]
    assert f.loc["x", "interval"].endswith("n=3 vs 2 (reproduced)") and f.loc["x", "seeds_agree"] == "0/0"


def test_not_run_names_the_missing_run_or_method(runs, tmp_path):
    study = _study([_claim("unimpl", kind="order", a="a", b=["b", "c"], scenarios=["s1"]),
                    _claim("norun", kind="order", a="a", b="b", scenarios=["s1", "s2"])])
    f = _verdicts(study, runs, tmp_path / "out")
    assert f.loc["unimpl", "verdict"] == "not run"
    assert f.loc["unimpl", "missing"] == "c: not implemented yet"
    # what could be compared is still shown
    assert "a 72.00 vs b 62.00" in f.loc["unimpl", "observed"]
    assert f.loc["norun", "verdict"] == "not run"
    assert f.loc["norun", "missing"] == "a in s2: no runs; b in s2: no runs"


def test_ratio_of_bytes_the_same_in_every_seed_and_of_accuracies(runs, tmp_path):
    study = _study([_claim("seven", kind="ratio", a="b", b="a", scenarios=["s1"], min=5.5, max=7.5),
                    _claim("tight", kind="ratio", a="b", b="a", scenarios=["s1"], max=6.5),
                    _claim("small", kind="ratio", a="a", b="b", scenarios=["s1"], max=0.2),
                    _claim("acc", kind="ratio", metric="accuracy", a="a", b="b", scenarios=["s1"], min=1.1),
                    _claim("acc_noise", kind="ratio", metric="accuracy", a="a", b="b", scenarios=["s1"], min=1.15),
                    _claim("acc_no", kind="ratio", metric="accuracy", a="a", b="b", scenarios=["s1"], max=1.1)])
    f = _verdicts(study, runs, tmp_path / "out")
    # b sends 7 GB, a 1 GB in every seed: no noise, the ratio 7 decides
    assert f.loc["seven", "verdict"] == "reproduced" and f.loc["seven", "seeds_agree"] == "3/3"
    assert "b 7.0000 / a 1.0000 = 7" in f.loc["seven", "observed"]
    assert f.loc["seven", "interval"] == "s1: b / a: 7, the same in all 3 seeds (reproduced)"
    assert f.loc["tight", "verdict"] == "not reproduced" and f.loc["tight", "seeds_agree"] == "0/3"
    assert f.loc["small", "verdict"] == "reproduced"  # 1/7 = 0.143
    assert f.loc["small", "condition"] == "a / b <= 0.2 in every scenario"
    # accuracies 70/61, 72/62, 74/63 = 1.148, 1.161, 1.175: interval about [1.13, 1.19]
    ratios = [70 / 61, 72 / 62, 74 / 63]
    mean, half = statistics.mean(ratios), T2 * statistics.stdev(ratios) / 3 ** 0.5
    assert f"95 % CI [{mean - half:.4g}, {mean + half:.4g}]" in f.loc["acc", "interval"]
    assert [f.loc[c, "verdict"] for c in ("acc", "acc_noise", "acc_no")] == [
        "reproduced", "within noise", "not reproduced"]


@pytest.mark.parametrize("seeds_at_zero, says", [([0, 1, 2], "every seed"), ([1], "seed 1")])
def test_a_ratio_to_a_method_that_sends_nothing_is_not_applicable_never_infinite(tmp_path, seeds_at_zero, says):
    for seed in range(3):
        _run(tmp_path, "s1", "a", seed, 0.7, nbytes=9e5)
        _run(tmp_path, "s1", "local", seed, 0.6, nbytes=0 if seed in seeds_at_zero else 1e5)
    study = _study([_claim("cheap", kind="ratio", a="a", b="local", scenarios=["s1"], min=2.0),
                    _claim("acc", kind="ratio", metric="accuracy", a="a", b="local", scenarios=["s1"], min=1.1)])
    f = _verdicts(study, tmp_path, tmp_path / "out")
    assert f.loc["cheap", "verdict"] == "not applicable"
    assert f.loc["cheap", "observed"] == f"s1: a 0.0009 / local {0.0001 * (3 - len(seeds_at_zero)) / 3:.4f}: not " \
                                         f"applicable, local sends nothing ({says})"
    assert f.loc["cheap", "interval"] == f"s1: a / local: local sends nothing in {says} (not applicable)"
    assert "inf" not in " ".join(f.loc["cheap"].astype(str))
    assert f.loc["acc", "verdict"] == "reproduced"  # the accuracies' ratio is unaffected
    assert "2 claims: 1 reproduced, 0 not reproduced, 0 within noise, 1 not applicable, 0 not run" in \
        (tmp_path / "out" / "claims.md").read_text()


def test_drop_from_one_scenario_to_another(runs, tmp_path):
    study = _study([_claim("falls", kind="drop", method="local", **{"from": "s1"}, to="s2", margin=5.0),
                    _claim("about", kind="drop", method="local", **{"from": ["s1"]}, to=["s2"], margin=20.0),
                    _claim("far", kind="drop", method="local", **{"from": ["s1"]}, to=["s2"], margin=25.0)])
    f = _verdicts(study, runs, tmp_path / "out")
    # local: 80 -> 62 on the means; per seed 20, 18, 16: interval [13.03, 22.97]
    assert f.loc["falls", "verdict"] == "reproduced" and f.loc["falls", "seeds_agree"] == "3/3"
    assert "local: s1 80.00 -> s2 62.00 (+18.00 pp)" in f.loc["falls", "observed"]
    assert "local: s1 -> s2: +18.00 pp, 95 % CI [+13.03, +22.97]" in f.loc["falls", "interval"]
    assert f.loc["about", "verdict"] == "within noise" and f.loc["about", "seeds_agree"] == "1/3"
    assert f.loc["far", "verdict"] == "not reproduced"


def test_close_within_a_tolerance(runs, tmp_path):
    study = _study([_claim("near", kind="close", a="a", b="b", scenarios=["s1"], tolerance=13.0),
                    _claim("noisy", kind="close", a="a", b="b", scenarios=["s1"], tolerance=10.0),
                    _claim("apart", kind="close", a="a", b="b", scenarios=["s1"], tolerance=7.0),
                    _claim("across", kind="close", method="local", **{"from": "s1"}, to="s2", tolerance=1.0)])
    f = _verdicts(study, runs, tmp_path / "out")
    assert f.loc["near", "verdict"] == "reproduced"  # [7.52, 12.48] inside [-13, 13]
    assert f.loc["noisy", "verdict"] == "within noise" and f.loc["noisy", "seeds_agree"] == "2/3"  # 9, 10 of 9-11
    assert f.loc["apart", "verdict"] == "not reproduced"  # entirely above 7
    assert f.loc["across", "verdict"] == "not reproduced"


def test_best_of_a_set(runs, tmp_path):
    study = _study([_claim("top", kind="best", method="local", among=["a", "b"], scenarios="s1"),
                    _claim("lead", kind="best", method="local", among=["a", "b"], scenarios="s1", margin=9.0),
                    _claim("not_top", kind="best", method="a", among=["b", "local"], scenarios="s1"),
                    _claim("cheapest", kind="best", metric="bytes", method="a", among=["b"], scenarios="s1")])
    f = _verdicts(study, runs, tmp_path / "out")
    # local 80 vs the best other of each seed (a: 70, 72, 74): leads 10, 8, 6, interval [3.03, 12.97]
    assert f.loc["top", "verdict"] == "reproduced" and f.loc["top", "seeds_agree"] == "3/3"
    assert "next best a 72.00 (+8.00 pp)" in f.loc["top", "observed"]
    assert "s1: local's lead: +8.00 pp, 95 % CI [+3.03, +12.97]" in f.loc["top", "interval"]
    assert f.loc["lead", "verdict"] == "within noise" and f.loc["lead", "seeds_agree"] == "1/3"
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
    assert "| yes |  | **reproduced** |" in md and "1 claims: 1 reproduced, 0 not reproduced, 0 within noise, 0 not run" in md
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
    for seed, acc in enumerate([0.50, 0.52, 0.54]):  # c, a's text variant: mean 52, below b's 62
        _run(runs, "s1", "c", seed, acc)
    study = _study([_claim("above", kind="order", a="a", b="b", scenarios=["s1"], note="Margin ours."),
                    _claim("other", kind="order", a="b", b="local", scenarios=["s1"])],
                   implemented=("a", "b", "c", "local"), text_variants={"a": "c"})
    frame = evaluate_claims(study, [runs / "runs"], tmp_path / "out")
    rows = {(r.id, r.mode): r for r in frame.itertuples()}
    assert set(rows) == {("above", "as run"), ("above", "text"), ("other", "")}
    assert rows["above", "as run"].verdict == "reproduced"
    assert rows["above", "text"].verdict == "not reproduced"
    assert "c 52.00 vs b 62.00" in rows["above", "text"].observed
    md = (tmp_path / "out" / "claims.md").read_text()
    assert "| above | text | **not reproduced** |" in md and "'text'" in md
    assert md.count("- above: Margin ours.") == 1  # the note of both modes, once


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


# -- the statistics behind a verdict, against scipy directly (the survivors of a mutation run) -------


def test_two_shared_seeds_are_enough_for_the_paired_test_and_its_null_is_no_difference():
    from scipy import stats

    from fedfactor.report.cells import Values
    from fedfactor.report.claims import _estimate

    a, b = Values({0: 0.90, 1: 0.86}), Values({0: 0.80, 1: 0.81, 2: 0.5})  # seeds 0 and 1 shared
    est = _estimate([a, b], lambda x, y: x - y, 0.0, False, (a, b))
    diffs = [0.10, 0.05]
    ref = stats.ttest_1samp(diffs, 0.0)
    ci = ref.confidence_interval(0.95)
    assert est.value == pytest.approx(0.075) and (est.lo, est.hi) == pytest.approx((ci.low, ci.high))
    assert est.test == f"paired t-test p={ref.pvalue:.2g}, n=2" and not est.exact


@pytest.mark.filterwarnings("ignore:Precision loss occurred:RuntimeWarning")  # scipy, on the constant side
def test_welchs_test_runs_when_one_side_alone_has_no_spread():
    """Also: a side is constant by its values; three seeds at 0.7 have a std of 1e-16 in floats."""
    from scipy import stats

    from fedfactor.report.cells import Values
    from fedfactor.report.claims import _welch_test

    a, b = Values({0: 0.7, 1: 0.7, 2: 0.7}), Values({3: 0.5, 4: 0.6, 5: 0.55})  # a constant, b not
    est = _welch_test(a, b)
    ref = stats.ttest_ind([0.7] * 3, [0.5, 0.6, 0.55], equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert (est.lo, est.hi) == pytest.approx((ci.low, ci.high)) and est.lo < est.value < est.hi and not est.exact
    both = _welch_test(a, Values({3: 0.5, 4: 0.5}))  # no spread on either side: the difference is exact
    assert (both.value, both.lo, both.hi, both.exact) == (pytest.approx(0.2), pytest.approx(0.2), pytest.approx(0.2), True)
    assert both.test == "the same in all seeds of each side, seeds not paired, n=3 vs 2"


def test_without_shared_seeds_or_welch_there_is_no_interval_and_bytes_alone_are_exact():
    import math

    from fedfactor.report.cells import Values
    from fedfactor.report.claims import _estimate

    a, b = Values({0: 2.0}), Values({0: 1.0})
    acc = _estimate([a, b], lambda x, y: x - y, 0.0, False, (a, b))
    assert acc.value == 1.0 and math.isnan(acc.lo) and math.isnan(acc.hi) and not acc.exact
    assert acc.test == "n=1, no interval"
    gb = _estimate([a, Values({1: 1.0})], lambda x, y: x / y, 1.0, True, None)
    assert gb.exact and gb.test == "seeds not paired, n=1 vs 1, no interval, bytes taken as exact"


def test_a_regions_ends_decide_holds_and_misses_at_the_boundary():
    from fedfactor.report.claims import _above, _Region

    more = _above(0.0)  # "a > b": no margin, so 0 itself is not a lead
    assert not more.holds(0.0) and more.holds(1e-9)
    assert more.misses(-2.0, 0.0) and not more.misses(-2.0, 1e-9)  # an interval ending at 0 never leads
    margin = _above(5.0)  # "by >= 5": 5 itself counts
    assert margin.holds(5.0) and not margin.holds(4.99)
    assert not margin.misses(1.0, 5.0) and margin.misses(1.0, 4.99)
    close = _Region(-1.0, 1.0)  # |difference| <= 1, both ends included
    assert close.holds(1.0) and close.holds(-1.0) and not close.holds(1.01)
    assert not close.misses(1.0, 2.0) and close.misses(1.01, 2.0)


def test_best_by_bytes_names_the_cheapest_other_and_a_missing_scenario_keeps_the_others(runs, tmp_path):
    for seed in range(3):  # c sends 3 GB: the next best of a (1 GB) among b (7 GB) and c
        _run(runs, "s1", "c", seed, 0.5, nbytes=3e9)
    study = _study([_claim("cheapest", kind="best", metric="bytes", method="a", among=["b", "c"],
                           scenarios=["s2", "s1"]),
                    _claim("absent", kind="best", method="a", among=["b", "local"], scenarios=["s1", "s2"]),
                    _claim("gap", kind="best", method="local", among=["a"], scenarios=["s2"])],
                   implemented=("a", "b", "c", "local"))
    f = _verdicts(study, runs, tmp_path / "out")
    # s2 has no run of a: the claim is not run, and s1's check is still made and shown
    assert f.loc["cheapest", "verdict"] == "not run" and "a in s2: no runs" in f.loc["cheapest", "missing"]
    assert "s1: a 1.0000, next best c 3.0000 (+2.0000 GB)" in f.loc["cheapest", "observed"]
    assert f.loc["absent", "verdict"] == "not run" and "s1: a 72.00, next best local 80.00" in f.loc["absent", "observed"]
    # local ran in s2, a did not: the comparison is skipped, not made against nothing
    assert f.loc["gap", "verdict"] == "not run" and f.loc["gap", "observed"] == ""


def test_accuracies_at_100_percent_in_every_seed_decide_nothing(tmp_path):
    """A claim that a beats b, or is the best, cannot be decided where both score 100 % in every seed:
    within noise, saying why. One seed below the ceiling on either side and the usual test decides."""
    for seed in range(3):
        _run(tmp_path, "s1", "a", seed, 1.0)
        _run(tmp_path, "s1", "b", seed, 1.0)
        _run(tmp_path, "s2", "a", seed, 1.0)
        _run(tmp_path, "s2", "b", seed, 0.99)  # a leads by 1 point in every seed
    study = _study([_claim("order", kind="order", a="a", b="b", scenarios="s1"),
                    _claim("top", kind="best", method="a", among=["b"], scenarios="s1"),
                    _claim("below", kind="order", a="a", b="b", scenarios="s2")])
    f = _verdicts(study, tmp_path, tmp_path / "out")
    assert f.loc["order", "verdict"] == "within noise" == f.loc["top", "verdict"]
    assert f.loc["order", "interval"] == ("s1: a vs b: +0.00 pp, both at 100 % in all 3 seeds: the ceiling separates "
                                          "nothing (within noise)")
    assert "both at 100 % in all 3 seeds" in f.loc["top", "interval"]
    assert f.loc["below", "verdict"] == "reproduced"  # one side below the ceiling: decided on its value


def _failed(root, scenario, label, seed, reason):
    """A run that failed, as `train-runs` files it: failed.json in place of its summary."""
    d = root / "runs" / scenario / label / f"seed{seed}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "failed.json").write_text(json.dumps({"scenario": scenario, "method": label, "seed": seed,
                                               "reason": reason}))


def test_a_failed_run_is_named_and_the_claim_is_decided_on_the_seeds_that_finished(runs, tmp_path):
    """Seed 2 of a failed in s1 (a recorded failure): a vs b is paired on seeds 0 and 1 (differences 9 and 10:
    mean 9.5, sd 0.707, interval 9.5 -+ 12.706 * 0.5 = [3.15, 15.85]), and the claim says which run it left
    out and why. A cell whose every run failed is a missing one."""
    (runs / "runs" / "s1" / "a" / "seed2" / "summary.json").unlink()
    _failed(runs, "s1", "a", 2, "round 9 kept no update")
    for seed in range(3):
        _failed(runs, "s2", "b", seed, "round 1, client 0: diverged")
    study = _study([_claim("yes", kind="order", a="a", b="b", scenarios=["s1"]),
                    _claim("gone", kind="order", a="local", b="b", scenarios=["s2"]),
                    _claim("other", kind="drop", method="local", **{"from": ["s1"]}, to=["s2"])])
    f = _verdicts(study, runs, tmp_path / "out")
    assert f.loc["yes", "verdict"] == "reproduced" and f.loc["yes", "seeds"] == 2
    assert "95 % CI [+3.15, +15.85]" in f.loc["yes", "interval"] and f.loc["yes", "seeds_agree"] == "2/2"
    assert f.loc["yes", "failed"] == "a in s1, seed 2: round 9 kept no update"
    assert f.loc["gone", "verdict"] == "not run" and f.loc["gone", "missing"] == "b in s2: no runs finished"
    assert f.loc["gone", "failed"].startswith("b in s2, seed 0: round 1, client 0: diverged; b in s2, seed 1")
    assert pd.isna(f.loc["other", "failed"]) or f.loc["other", "failed"] == ""  # its runs all finished
    md = (tmp_path / "out" / "claims.md").read_text()
    assert ("- yes: Failed, left out (decided on the seeds whose runs all finished): a in s1, seed 2: round 9 kept "
            "no update.") in md

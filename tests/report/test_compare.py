"""fedfactor compare: two sets of hand-built runs (or two methods of one set), cell by cell, with the
differences, intervals and p-values computed here with scipy."""

import json
import os

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fedfactor.cli import main
from fedfactor.report.compare import compare_runs
from fedfactor.report.spec import SMOKE_TITLE

PROTOCOL = {"test_pool": "client", "model": "received", "report": "last"}


def _run(root, scenario, label, seed, acc, nbytes=1e9, method=None, protocol=PROTOCOL, dataset="digits"):
    """A finished run as the workflow files it: <root>/<scenario>/<label>/seed<N>/summary.json."""
    d = root / scenario / label / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({
        "scenario": scenario, "method": method or label, "seed": seed, "accuracy": acc, "accuracy_mean": acc,
        "accuracy_best_mean": acc, "accuracy_weighted": acc, "bytes_total": nbytes, "rounds": 2, "clients": 4,
        "protocol": protocol, "dataset": dataset}))


# per seed 0, 1, 2, accuracy in %: A and B, one cell a verdict
CELLS = {
    ("s1", "up"): ((70, 72, 75), (61, 62, 66)),  # A - B = 9, 10, 9: better
    ("s1", "down"): ((50, 52, 51), (60, 63, 60)),  # -10, -11, -9: worse
    ("s2", "up"): ((60, 70, 65), (62, 64, 66)),  # -2, 6, -1: within noise
}


@pytest.fixture
def sets(tmp_path):
    for (scenario, label), (a, b) in CELLS.items():
        for seed, (x, y) in enumerate(zip(a, b)):
            _run(tmp_path / "A", scenario, label, seed, x / 100)
            _run(tmp_path / "B", scenario, label, seed, y / 100)
    return tmp_path / "A", tmp_path / "B"


def _frame(out):
    return pd.read_csv(out / "compare.csv", keep_default_na=False, na_values=[""]).set_index(["scenario", "method"])


def test_the_paired_difference_its_interval_and_p_are_scipys_one_sample_t_test(sets, tmp_path):
    compare_runs([sets[0]], tmp_path / "out", against=[sets[1]])
    f = _frame(tmp_path / "out")
    assert list(f.index) == [("s1", "down"), ("s1", "up"), ("s2", "up")]
    for key, (a, b) in CELLS.items():
        d = np.array(a, dtype=float) - np.array(b, dtype=float)
        t = stats.ttest_1samp(d, 0.0)
        ci = t.confidence_interval(0.95)
        r = f.loc[key]
        assert r["a_mean"] == pytest.approx(np.mean(a)) and r["b_mean"] == pytest.approx(np.mean(b))
        assert r["diff"] == pytest.approx(d.mean())
        assert (r["low"], r["high"], r["p"]) == pytest.approx((ci.low, ci.high, t.pvalue))
        assert r["n_paired"] == 3 and r["test"] == "paired"
    assert f["verdict"].to_dict() == {("s1", "down"): "worse", ("s1", "up"): "better", ("s2", "up"): "within noise"}
    md = (tmp_path / "out" / "compare.md").read_text()
    assert md.startswith("# Accuracy: A vs B\n") and "Accuracy as reported:" in md
    # s1/up: 9, 10, 9: mean 9.33, sd 0.577, interval 9.33 -+ 4.303 * 0.577 / sqrt(3) = [7.90, 10.77]
    assert "| s1 | up | 72.33 | 63.00 | +9.33 [+7.90, +10.77] | paired t-test p=0.0013, n=3 | 3 paired | **better** |" \
        in md
    assert "3 cells: 1 better, 1 worse, 1 within noise." in md


def test_fewer_than_two_shared_seeds_fall_back_to_welchs_t_test(tmp_path):
    a, b = (0.70, 0.74, 0.72), (0.60, 0.66, 0.61)
    for seed, x in zip((0, 1, 2), a):
        _run(tmp_path / "A", "s1", "m", seed, x)
    for seed, y in zip((2, 3, 4), b):  # one seed shared: no pairing
        _run(tmp_path / "B", "s1", "m", seed, y)
    compare_runs([tmp_path / "A"], tmp_path / "out", against=[tmp_path / "B"])
    r = _frame(tmp_path / "out").loc[("s1", "m")]
    t = stats.ttest_ind([100 * x for x in a], [100 * y for y in b], equal_var=False)
    ci = t.confidence_interval(0.95)
    assert r["test"] == "welch" and r["n_paired"] == 1
    assert (r["diff"], r["low"], r["high"], r["p"]) == pytest.approx((100 * (np.mean(a) - np.mean(b)), ci.low, ci.high,
                                                                       t.pvalue))
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "Welch t-test (seeds not paired)" in md and "3 vs 3, 1 shared" in md


def test_one_run_a_side_has_no_interval_and_is_within_noise_whatever_the_gap(tmp_path):
    _run(tmp_path / "A", "s1", "m", 0, 0.95)
    _run(tmp_path / "B", "s1", "m", 0, 0.35)
    compare_runs([tmp_path / "A"], tmp_path / "out", against=[tmp_path / "B"])
    r = _frame(tmp_path / "out").loc[("s1", "m")]
    assert r["diff"] == pytest.approx(60) and np.isnan(r["low"]) and np.isnan(r["p"])
    assert r["test"] == "none" and r["verdict"] == "within noise"
    assert "+60.00 (no interval)" in (tmp_path / "out" / "compare.md").read_text()


def test_bytes_the_same_in_every_seed_are_decided_on_their_value_and_fewer_is_better(tmp_path, capsys):
    for seed in range(3):
        _run(tmp_path / "A", "s1", "lean", seed, 0.5 + seed / 100, nbytes=1e9)
        _run(tmp_path / "B", "s1", "lean", seed, 0.5, nbytes=3e9)
        _run(tmp_path / "A", "s1", "equal", seed, 0.5, nbytes=2e9)
        _run(tmp_path / "B", "s1", "equal", seed, 0.6, nbytes=2e9)
    _run(tmp_path / "A", "s2", "lean", 0, 0.5, nbytes=5e9)  # one run a side: bytes are still exact
    _run(tmp_path / "B", "s2", "lean", 0, 0.5, nbytes=4e9)
    out = tmp_path / "out"
    assert main(["compare", str(tmp_path / "A"), "--against", str(tmp_path / "B"), "--metric", "bytes",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"3 cells: 1 better, 1 worse, 0 within noise, 1 same -> {out}\n"
    f = _frame(out)
    assert f.loc[("s1", "lean"), ["diff", "low", "high"]].tolist() == pytest.approx([-2, -2, -2])
    assert f.loc[("s1", "lean"), "verdict"] == "better" and f.loc[("s1", "lean"), "test"] == "exact"
    assert f.loc[("s1", "equal"), "verdict"] == "same" and f.loc[("s1", "equal"), "diff"] == 0
    assert f.loc[("s2", "lean"), "verdict"] == "worse" and f.loc[("s2", "lean"), "diff"] == pytest.approx(1)
    md = (out / "compare.md").read_text()
    assert md.startswith("# Bytes sent: A vs B\n") and "| s1 | lean | 1.0000 | 3.0000 | -2.0000 (exact) |" in md


def test_cells_on_one_side_only_are_listed_and_labels_sharing_a_method_are_cells(sets, tmp_path):
    a, b = sets
    for seed in range(3):  # two labels of one registered method, filed under their own folders
        _run(a, "s1", "rank4", seed, 0.80, method="feddecomp")
        _run(a, "s1", "rank8", seed, 0.81, method="feddecomp")
        _run(b, "s3", "up", seed, 0.5)
    compare_runs([a], tmp_path / "out", against=[b], names=["tuned", "untuned"])
    f = _frame(tmp_path / "out")
    assert f.loc[("s1", "rank4"), "verdict"] == "only in A" and f.loc[("s1", "rank8"), "verdict"] == "only in A"
    assert f.loc[("s3", "up"), "verdict"] == "only in B" and np.isnan(f.loc[("s3", "up"), "a_mean"])
    assert f.loc[("s1", "rank4"), "a_mean"] == pytest.approx(80) and np.isnan(f.loc[("s1", "rank4"), "diff"])
    one_sided = f.loc[("s1", "rank4")]  # nothing to compare: no difference, interval, p or pairs
    assert np.isnan(one_sided[["diff", "low", "high", "p", "b_mean"]].astype(float)).all()
    assert one_sided["n_paired"] == 0 and pd.isna(one_sided["test"])
    md = (tmp_path / "out" / "compare.md").read_text()
    assert md.startswith("# Accuracy: tuned vs untuned\n") and "| tuned mean [%] | untuned mean [%] |" in md
    assert "| s3 | up | - | 50.00 | - | - | 0 vs 3 | **only in B** |" in md
    assert "| s1 | rank4 | 80.00 | - | - | - | 3 vs 0 | **only in A** |" in md
    assert "6 cells: 1 better, 1 worse, 1 within noise, 2 only in A, 1 only in B." in md


def test_two_methods_of_one_set(sets, tmp_path, capsys):
    a, _ = sets
    for seed in range(3):
        _run(a, "s3", "down", seed, 0.4)  # only the second method in s3
    out = tmp_path / "out"
    assert main(["compare", str(a), "--methods", "up", "down", "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"3 cells: 1 better, 0 worse, 0 within noise, 1 only in A, 1 only in B -> {out}\n"
    f = _frame(out)
    # s1: up - down = 70-50, 72-52, 75-51 = 20, 20, 24
    t = stats.ttest_1samp([20.0, 20.0, 24.0], 0.0)
    r = f.loc[("s1", "up vs down")]
    assert r["diff"] == pytest.approx(64 / 3) and (r["low"], r["high"]) == pytest.approx(t.confidence_interval(0.95))
    assert r["verdict"] == "better"
    assert f.loc[("s2", "up vs down"), "verdict"] == "only in A"
    assert f.loc[("s3", "up vs down"), "verdict"] == "only in B"
    md = (out / "compare.md").read_text()
    assert md.startswith("# Accuracy: up vs down\n\nA: up; B: down; each scenario of the runs in")
    assert "| up mean [%] | down mean [%] |" in md


def test_the_outputs_are_the_three_files_and_the_figure_is_a_png(sets, tmp_path):
    compare_runs([sets[0]], tmp_path / "out", against=[sets[1]])
    assert sorted(os.listdir(tmp_path / "out")) == ["compare.csv", "compare.md", "compare.png"]  # no temporaries
    assert (tmp_path / "out" / "compare.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    # the sides as given; the workflow's summary.json of every run, as their count and folder
    assert f"A: {sets[0]}; B: {sets[1]}." in (tmp_path / "out" / "compare.md").read_text()
    compare_runs(sorted(sets[0].rglob("summary.json")), tmp_path / "listed", against=[sets[1]])
    assert f"A: 9 runs under {sets[0]}; B: {sets[1]}." in (tmp_path / "listed" / "compare.md").read_text()
    # a relative path among absolute ones (as a user may type them) still names one folder
    mixed = sorted(sets[0].rglob("summary.json"))
    mixed[0] = os.path.relpath(mixed[0])
    compare_runs(mixed, tmp_path / "mixed", against=[sets[1]])
    assert f"A: 9 runs under {sets[0]}; B: {sets[1]}." in (tmp_path / "mixed" / "compare.md").read_text()


def test_runs_on_synthetic_data_are_flagged(tmp_path):
    """Catches: a set flagged by its last run alone (one synthetic run among real ones forgotten)."""
    _run(tmp_path / "A", "s1", "m", 0, 0.5, dataset="synthetic:tiny")
    _run(tmp_path / "A", "s2", "m", 0, 0.5)  # read after the synthetic one: the set stays flagged
    _run(tmp_path / "B", "s1", "m", 0, 0.5)
    compare_runs([tmp_path / "A"], tmp_path / "out", against=[tmp_path / "B"])
    assert (tmp_path / "out" / "compare.md").read_text().startswith(f"# {SMOKE_TITLE}Accuracy: A vs B")


@pytest.mark.parametrize("argv, words", [
    (["{A}", "--against", "{empty}"], "no summary.json found in"),
    (["{A}", "--against", "{other}"], "no (scenario, method) cell is in both sets"),
    (["{A}", "--methods", "up", "nobody"], "--methods: no run of method nobody (the runs have: down, up)"),
    (["{A}", "--methods", "up", "up"], "names up twice"),
    (["{other}", "--methods", "up", "down"], "no scenario has runs of both up and down"),
    (["{A}"], "give --against B_RUNS... (two sets of runs) or --methods M1 M2"),
    (["{A}", "--against", "{B}", "--methods", "up", "down"], "one of the two"),
    (["{A}", "--against", "{B}", "--names", "x", "x"], "two different, non-empty names"),
    (["{A}", "--against", "{best}"], "A's runs were scored under client/received/last, B's under"),
    (["{A}", "--against", "{twice}"], "B: two runs of scenario s1, method up, seed 0"),
    (["{A}", "--against", "{null}"], "B: s1/up: the reported accuracy is null"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(sets, tmp_path, capsys, argv, words):
    (tmp_path / "empty").mkdir()
    _run(tmp_path / "other", "s9", "up", 0, 0.5)
    _run(tmp_path / "other", "s8", "down", 0, 0.5)
    _run(tmp_path / "best", "s1", "up", 0, 0.5, protocol={**PROTOCOL, "report": "best_weighted"})
    _run(tmp_path / "twice" / "x", "s1", "up", 0, 0.5)
    _run(tmp_path / "twice" / "y", "s1", "up", 0, 0.5)
    _run(tmp_path / "null", "s1", "up", 0, 0.5)
    null = tmp_path / "null" / "s1" / "up" / "seed0" / "summary.json"  # eval.report best_val without validation data
    null.write_text(json.dumps({**json.loads(null.read_text()), "accuracy": None}))
    paths = {"A": sets[0], "B": sets[1], "empty": tmp_path / "empty", "other": tmp_path / "other",
             "best": tmp_path / "best", "twice": tmp_path / "twice", "null": tmp_path / "null"}
    out = tmp_path / "out"
    assert main(["compare", *(a.format(**paths) for a in argv), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedfactor: error: ") and err.count("\n") == 1 and words in err, err
    assert not out.exists()


def test_bytes_compare_across_protocols(tmp_path):
    _run(tmp_path / "A", "s1", "m", 0, 0.5, nbytes=2e9)
    _run(tmp_path / "B", "s1", "m", 0, 0.5, nbytes=2e9, protocol={**PROTOCOL, "report": "best_weighted"})
    frame = compare_runs([tmp_path / "A"], tmp_path / "out", against=[tmp_path / "B"], metric="bytes")
    assert frame["verdict"].tolist() == ["same"]


@pytest.mark.parametrize("value, lo, hi, exact, fewer_is_better, verdict", [
    (0.5, 0.0, 1.0, False, False, "within noise"),  # an interval reaching 0 is no difference
    (0.5, 0.25, 0.75, False, False, "better"),  # the whole interval above 0, inside (0, 1)
    (-0.5, -1.0, 0.0, False, False, "within noise"),
    (-0.25, -0.5, -0.1, False, False, "worse"),
    (0.25, -0.5, 0.5, False, False, "within noise"),  # straddles 0, its high end inside (0, 1)
    (0.5, 0.25, 0.75, False, True, "worse"),  # bytes: more is worse
    (-0.5, -0.75, -0.25, False, True, "better"),
    (0.5, float("nan"), float("nan"), False, False, "within noise"),  # one run a side
    (0.5, 0.5, 0.5, True, False, "better"),  # exact: decided on the value, here inside (0, 1)
    (-0.5, -0.5, -0.5, True, False, "worse"),
    (0.0, 0.0, 0.0, True, False, "same"),
    (2.0, 2.0, 2.0, True, True, "worse"),
    (-2.0, -2.0, -2.0, True, True, "better"),
])
def test_a_verdict_needs_its_whole_interval_on_one_side_of_zero(value, lo, hi, exact, fewer_is_better, verdict):
    """Catches: an interval that touches 0 called a difference (>= for >), a threshold other than 0,
    bytes judged as accuracy (more called better), and an exact difference judged on its interval."""
    from fedfactor.report.compare import _verdict

    assert _verdict(value, lo, hi, exact, fewer_is_better) == verdict


def test_the_page_says_which_side_is_better_and_how_many_seeds_each_cell_pairs(tmp_path):
    """Catches: the reading guide calling more bytes (or lower accuracy) better, and the seeds column
    hiding that a cell paired two seeds of three and four runs (or pairing fewer than two)."""
    for seed in range(3):
        _run(tmp_path / "A", "s1", "m", seed, 0.5 + seed / 100, nbytes=1e9 * (1 + seed / 10))
    for seed in (1, 2, 3, 4):
        _run(tmp_path / "B", "s1", "m", seed, 0.4 + seed / 50, nbytes=2e9)
    for metric, good, what in (("accuracy", "higher accuracy", "the reported accuracy (%"),
                               ("bytes", "fewer bytes", "bytes sent (GB)")):
        out = tmp_path / metric
        compare_runs([tmp_path / "A"], out, against=[tmp_path / "B"], metric=metric)
        md = (out / "compare.md").read_text()
        assert f"the whole interval on A's side ({good})" in md and f"the difference A - B of {what}" in md
        assert "| 2 paired (3 vs 4 runs) |" in md

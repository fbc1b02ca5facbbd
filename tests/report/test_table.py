import json

import pandas as pd
import pytest

from fedfactor.errors import UsageError
from fedfactor.report.table import collect, failed_note, write_tables

PROTOCOL = {"test_pool": "shared", "model": "trained", "report": "best"}


def _summary(path, scenario, method, seed, acc, nbytes=1000, protocol=PROTOCOL, dataset="digits"):
    path.mkdir(parents=True)
    # the reported number (here the best round) differs from the last round's, so a table that
    # showed the wrong one would fail
    (path / "summary.json").write_text(json.dumps({
        "scenario": scenario, "method": method, "seed": seed, "accuracy": acc, "accuracy_mean": acc - 0.1,
        "accuracy_best_mean": acc, "accuracy_weighted": acc, "bytes_total": nbytes, "rounds": 2, "clients": 4,
        "protocol": protocol, "dataset": dataset,
    }))


T2 = 4.302653  # Student t's 97.5 % quantile with 2 degrees of freedom: the 95 % interval of 3 seeds


def test_mean_spread_and_interval_over_seeds_of_the_reported_accuracy(tmp_path):
    for seed, acc in enumerate([0.5, 0.7, 0.6]):
        _summary(tmp_path / f"a/fedavg/{seed}", "a", "fedavg", seed, acc, 2e9)
    _summary(tmp_path / "b/fedavg/0", "b", "fedavg", 0, 0.9, 1.5e9)
    _summary(tmp_path / "a/local/0", "a", "local", 0, 0.4, 0)
    _summary(tmp_path / "a/local/1", "a", "local", 1, 0.4, 0)
    md = write_tables(collect([tmp_path]), tmp_path / "t.md", tmp_path / "t.csv")
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    # seeds 50, 70, 60: mean 60.00, sample std 10.00, interval 60 -+ T2 * 10 / sqrt(3) = [35.2, 84.8]
    assert "| 60.00 +- 10.00 [35.2, 84.8] (n=3) |" in rows["fedavg"]
    assert "| 90.00 (n=1, no interval) |" in rows["fedavg"]  # one seed: neither a spread nor an interval
    # no spread: the interval is the mean; two seeds are marked as few
    assert "| 40.00 +- 0.00 [40.0, 40.0] (n=2, few seeds) |" in rows["local"]
    assert rows["local"].count("| - |") == 1  # no run of local in scenario b
    assert rows["fedavg"].endswith("| 1.5000 - 2.0000 |")
    assert rows["local"].endswith("| 0.0000 |")
    # the table says which protocol its numbers follow, and what its spread and interval are
    assert "pooled test split" in md and "after its local training" in md and "best round" in md
    assert "sample standard deviation (ddof 1)" in md and "95 % confidence interval of the mean, Student t" in md
    csv = pd.read_csv(tmp_path / "t.csv")
    r = csv[(csv.scenario == "a") & (csv.method == "fedavg")].iloc[0]
    assert r.seeds == 3 and r.accuracy == pytest.approx(0.6) and r.accuracy_mean == pytest.approx(0.5)
    assert r.accuracy_sd == pytest.approx(0.1)
    assert (r.accuracy_ci_low, r.accuracy_ci_high) == pytest.approx((0.6 - T2 * 0.1 / 3 ** 0.5,
                                                                     0.6 + T2 * 0.1 / 3 ** 0.5))
    assert (r.test_pool, r.eval_model, r.report) == ("shared", "trained", "best")
    one = csv[(csv.scenario == "b")].iloc[0]
    assert one.seeds == 1 and pd.isna(one.accuracy_sd) and pd.isna(one.accuracy_ci_low) and pd.isna(one.accuracy_ci_high)


def test_a_cost_range_equal_as_shown_is_one_number(tmp_path):
    _summary(tmp_path / "a/f/0", "a", "f", 0, 0.5, 1_800_010)
    _summary(tmp_path / "b/f/0", "b", "f", 0, 0.5, 1_800_020)  # 0.0018 GB both, as the table shows them
    _summary(tmp_path / "c/f/0", "c", "f", 0, 0.5, 1_900_000)
    md = write_tables(collect([tmp_path / "a", tmp_path / "b"]), tmp_path / "t.md", tmp_path / "t.csv")
    assert md.rstrip().endswith("| 0.0018 |")
    md = write_tables(collect([tmp_path]), tmp_path / "t.md", tmp_path / "t.csv")
    assert md.rstrip().endswith("| 0.0018 - 0.0019 |")


def test_runs_of_different_protocols_are_never_mixed(tmp_path):
    _summary(tmp_path / "a/fedavg/0", "a", "fedavg", 0, 0.5)
    _summary(tmp_path / "a/local/0", "a", "local", 0, 0.4, protocol={**PROTOCOL, "test_pool": "client"})
    with pytest.raises(UsageError, match="different evaluation protocols"):
        collect([tmp_path])


def test_no_runs_and_old_summaries_are_usage_errors(tmp_path):
    with pytest.raises(UsageError):
        collect([tmp_path])
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "summary.json").write_text(json.dumps({"scenario": "a", "method": "m", "seed": 0}))
    with pytest.raises(UsageError, match="old"):
        collect([tmp_path / "old"])


def _edit(**changes):
    """A change to a valid summary's fields; a value of ... deletes the key."""
    def change(doc):
        for key, value in changes.items():
            if value is ...:
                del doc[key]
            else:
                doc[key] = value
        return json.dumps(doc)
    return change


BAD_SUMMARIES = [  # (change of a valid summary's document to the file's text, what the message says)
    (lambda doc: "", r"cannot read run summary .*Expecting value"),
    (lambda doc: json.dumps(doc)[:40], "cannot read run summary"),
    (lambda doc: "[1, 2]", "holds an array, not a JSON object"),
    (lambda doc: "0.5", "holds a number, not a JSON object"),
    (_edit(accuracy=...), "lacks 'accuracy'"),
    (_edit(protocol=...), "lacks 'protocol'"),
    (_edit(accuracy="0.5"), r"accuracy: input should be a valid number \(got '0.5'\)"),
    (_edit(accuracy_mean=True), "accuracy_mean: input should be a valid number"),
    (_edit(accuracy_best_mean=float("nan")), "accuracy_best_mean: input should be a finite number"),
    (_edit(accuracy_weighted=None), "accuracy_weighted: input should be a valid number"),
    (_edit(accuracy=1.5), "accuracy: input should be less than or equal to 1"),
    (_edit(seed=[0]), r"seed: input should be a valid integer \(got \[0\]\)"),
    (_edit(seed="0"), "seed: input should be a valid integer"),
    (_edit(scenario=3), "scenario: input should be a valid string"),
    (_edit(bytes_total=-1), "bytes_total: input should be greater than or equal to 0"),
    (_edit(rounds=2.5), "rounds: input should be a valid integer"),
    (_edit(protocol="shared"), "protocol: input should be a valid dictionary"),
    (_edit(protocol={"test_pool": "shared", "model": "trained"}), "protocol: lacks report"),
    (_edit(protocol={**PROTOCOL, "report": "median"}), "protocol.report: input should be 'last'"),
]


@pytest.mark.parametrize("change, pattern", BAD_SUMMARIES)
def test_damaged_summaries_are_one_line_usage_errors_naming_the_file(tmp_path, change, pattern):
    _summary(tmp_path / "a/fedavg/0", "a", "fedavg", 0, 0.5)
    _summary(tmp_path / "a/fedavg/1", "a", "fedavg", 1, 0.7)
    bad = tmp_path / "a/fedavg/1/summary.json"
    bad.write_text(change(json.loads(bad.read_text())))
    collect([tmp_path / "a/fedavg/0"])  # the good run alone is fine
    with pytest.raises(UsageError, match=pattern) as err:
        collect([tmp_path])
    message = str(err.value)
    assert str(bad) in message and "\n" not in message


@pytest.mark.parametrize("missing", [None, float("nan")])
def test_a_run_without_a_reported_accuracy_is_a_nan_cell(tmp_path, missing):
    # eval.report best_val without validation data leaves accuracy null (JSON NaN reads the same)
    _summary(tmp_path / "a/fedavg/0", "a", "fedavg", 0, 0.5)
    f = tmp_path / "a/fedavg/0/summary.json"
    f.write_text(_edit(accuracy=missing)(json.loads(f.read_text())))
    runs = collect([f])
    assert runs["accuracy"].dtype == float and runs["accuracy"].isna().all()
    write_tables(runs, tmp_path / "t.md", tmp_path / "t.csv")
    assert pd.read_csv(tmp_path / "t.csv")["accuracy"].isna().all()


def test_paths_must_exist_and_folders_named_summary_json_are_searched(tmp_path):
    _summary(tmp_path / "summary.json/fedavg/0", "a", "fedavg", 0, 0.5)
    assert collect([tmp_path / "summary.json"])["seed"].tolist() == [0]
    with pytest.raises(UsageError, match=f"^{tmp_path / 'nope'} does not exist") as err:
        collect([tmp_path / "summary.json", tmp_path / "nope"])
    assert "\n" not in str(err.value)


def test_runs_on_synthetic_data_are_flagged_in_every_output_and_skipped_methods_are_named(tmp_path):
    _summary(tmp_path / "a" / "fedavg" / "0", "a", "fedavg", 0, 0.5, dataset="synthetic:cifar10")
    md = write_tables(collect([tmp_path]), tmp_path / "t.md", tmp_path / "t.csv", title="T",
                      out_html=tmp_path / "t.html", skipped={"fedper": "fedper"})
    assert md.startswith("# SMOKE RUN on synthetic data — not results: T")
    assert "Not implemented yet, skipped: fedper (fedper)." in md
    assert pd.read_csv(tmp_path / "t.csv")["smoke_run_synthetic_data"].all()
    page = (tmp_path / "t.html").read_text()
    assert "SMOKE RUN on synthetic data" in page and "<td>fedavg</td>" in page and "fedper" in page


def test_an_interval_beyond_0_100_percent_is_shown_at_the_bound_and_marked(tmp_path):
    """Two seeds at 20 % and 99 %: the t interval of the mean runs from about -442 % to 561 %; a mean of
    accuracies cannot lie there, so the table shows 0.0 and 100.0, each marked, and says n is few."""
    for seed, acc in enumerate([0.2, 0.99]):
        _summary(tmp_path / f"a/f/{seed}", "a", "f", seed, acc)
    for seed, acc in enumerate([0.5, 0.6, 0.7]):
        _summary(tmp_path / f"a/g/{seed}", "a", "g", seed, acc)
    md = write_tables(collect([tmp_path]), tmp_path / "t.md", tmp_path / "t.csv")
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    assert "| 59.50 +- 55.86 [0.0*, 100.0*] (n=2, few seeds) |" in rows["f"]
    assert "| 60.00 +- 10.00 [35.2, 84.8] (n=3) |" in rows["g"]  # inside the range: as it is, no mark
    assert "marked *" in md
    low = pd.read_csv(tmp_path / "t.csv").set_index("method").loc["f", "accuracy_ci_low"]
    assert low < -4  # the csv keeps the interval as computed


def test_a_tuned_study_shows_the_values_its_runs_used_beside_its_numbers(tmp_path):
    """The chosen-values file names the keys tuned per method; the table shows the values the runs'
    config.yaml files hold for them, per scenario, and seeds that used different values both."""
    import yaml

    used = {("a", "f", 0): 0.1, ("a", "f", 1): 0.1, ("b", "f", 0): 0.03, ("a", "g", 0): 0.3, ("b", "g", 0): 0.3}
    for (scenario, method, seed), lr in used.items():
        folder = tmp_path / scenario / method / str(seed)
        _summary(folder, scenario, method, seed, 0.5)
        tau = 0.5 if (scenario, seed) != ("b", 0) else 0.9
        (folder / "config.yaml").write_text(yaml.safe_dump({"fl": {"lr": lr}, "method": {"name": method, "tau": tau}}))
    folder = tmp_path / "b" / "g" / "1"
    _summary(folder, "b", "g", 1, 0.5)
    (folder / "config.yaml").write_text(yaml.safe_dump({"fl": {"lr": 0.1}, "method": {"name": "g", "tau": 0.5}}))
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text(yaml.safe_dump({"grid": {"f": {"fl.lr": [0.03, 0.1]}, "g": {"fl.lr": [0.1, 0.3], "tau": [0.5, 0.9]}}}))
    md = write_tables(collect([tmp_path / "a", tmp_path / "b"]), tmp_path / "t.md", tmp_path / "t.csv", tuned=tuned,
                      out_tex=tmp_path / "t.tex")
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    assert rows["method"].rstrip().endswith("| chosen on validation (a; b) |")
    tex = {line.split(" & ")[0]: line for line in (tmp_path / "t.tex").read_text().splitlines() if " & " in line}
    assert tex["method"].endswith(r"& chosen on validation (a; b) \\")
    assert tex["g"].endswith(r"& lr 0.3, tau 0.5; lr 0.3, tau 0.9 / lr 0.1, tau 0.5 \\")
    assert rows["f"].rstrip().endswith("| lr 0.1; lr 0.03 |")
    assert rows["g"].rstrip().endswith("| lr 0.3, tau 0.5; lr 0.3, tau 0.9 / lr 0.1, tau 0.5 |")
    csv = pd.read_csv(tmp_path / "t.csv").set_index(["scenario", "method"])
    assert csv.loc[("b", "f"), "chosen"] == "lr 0.03"
    plain = write_tables(collect([tmp_path / "a"]), tmp_path / "u.md", tmp_path / "u.csv")
    assert "chosen on validation" not in plain and "chosen" not in pd.read_csv(tmp_path / "u.csv")
    with pytest.raises(UsageError, match="cannot read the chosen values"):
        write_tables(collect([tmp_path / "a"]), tmp_path / "v.md", tmp_path / "v.csv", tuned=tmp_path / "none.yaml")
    assert not (tmp_path / "v.md").exists()


def test_a_failed_run_is_named_under_the_table_and_left_out_of_its_cell(tmp_path):
    """A study that records failed runs (failed_runs: record) lists each run's summary.json; one that
    failed has failed.json instead. The cell is over the seeds that finished, its n says so, and a note
    names the run and why; a listed summary.json with neither is still an error."""
    for seed, acc in enumerate([0.5, 0.7, 0.6]):
        _summary(tmp_path / f"a/f/seed{seed}", "a", "f", seed, acc)
    failed = tmp_path / "a/f/seed3"
    failed.mkdir()
    (failed / "failed.json").write_text(json.dumps({"scenario": "a", "method": "f", "seed": 3,
                                                    "reason": "round 9 kept no update"}))
    listed = [tmp_path / f"a/f/seed{seed}/summary.json" for seed in range(4)]
    from fedfactor.cli import main

    main(["table", *map(str, listed), "--out-md", str(tmp_path / "t.md"), "--out-csv", str(tmp_path / "t.csv")])
    md = (tmp_path / "t.md").read_text()
    assert "60.00 +- 10.00" in md and "(n=3)" in md
    assert "Failed, not in the numbers (each cell is over the seeds that finished): a/f seed 3: round 9 kept no " \
           "update." in md
    assert failed_note([tmp_path / "a"]) == failed_note(listed)  # a folder searched finds the same
    (failed / "failed.json").unlink()
    with pytest.raises(UsageError, match="seed3/summary.json does not exist"):
        collect(listed)


def test_aggregate_gives_each_metrics_mean_and_sample_std_over_seeds_in_the_runs_order():
    """Catches: a metric's mean or std dropped from table.csv or taken from another column, the
    population std for the sample one, and the cells sorted instead of kept in the study's order."""
    import numpy as np
    import pandas as pd

    from fedfactor.report.table import aggregate

    acc, mean, best = [0.9, 0.8, 0.7], [0.85, 0.75, 0.6], [0.95, 0.9, 0.92]
    runs = pd.DataFrame({
        "scenario": ["zeta"] * 3 + ["alpha"] * 3, "method": ["m"] * 6, "test_pool": "client",
        "eval_model": "received", "report": "last", "seed": [0, 1, 2] * 2,
        "accuracy": acc * 2, "accuracy_mean": mean * 2, "accuracy_best_mean": best * 2, "bytes_total": [1e9] * 6})
    out = aggregate(runs)
    assert out["scenario"].tolist() == ["zeta", "alpha"]  # the study's order, not sorted
    row = out.iloc[0]
    assert row["seeds"] == 3 and row["accuracy"] == pytest.approx(np.mean(acc))
    assert row["accuracy_sd"] == pytest.approx(np.std(acc, ddof=1))
    assert row["accuracy_mean"] == pytest.approx(np.mean(mean))
    assert row["accuracy_std"] == pytest.approx(np.std(mean, ddof=1))
    assert row["accuracy_best_mean"] == pytest.approx(np.mean(best))
    assert row["accuracy_best_std"] == pytest.approx(np.std(best, ddof=1))

import json

import pandas as pd
import pytest

from fedfactor.errors import UsageError
from fedfactor.report.table import collect, write_tables

PROTOCOL = {"test_pool": "shared", "model": "trained", "report": "best"}


def _summary(path, scenario, method, seed, acc, nbytes=1000, protocol=PROTOCOL):
    path.mkdir(parents=True)
    # the reported number (here the best round) differs from the last round's, so a table that
    # showed the wrong one would fail
    (path / "summary.json").write_text(json.dumps({
        "scenario": scenario, "method": method, "seed": seed, "accuracy": acc, "accuracy_mean": acc - 0.1,
        "accuracy_best_mean": acc, "accuracy_weighted": acc, "bytes_total": nbytes, "rounds": 2, "clients": 4,
        "protocol": protocol,
    }))


def test_mean_and_std_over_seeds_of_the_reported_accuracy(tmp_path):
    _summary(tmp_path / "a/fedavg/0", "a", "fedavg", 0, 0.5, 2e9)
    _summary(tmp_path / "a/fedavg/1", "a", "fedavg", 1, 0.7, 2e9)
    _summary(tmp_path / "b/fedavg/0", "b", "fedavg", 0, 0.9, 1.5e9)
    _summary(tmp_path / "a/local/0", "a", "local", 0, 0.4, 0)
    md = write_tables(collect([tmp_path]), tmp_path / "t.md", tmp_path / "t.csv")
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    # seeds 0.5 and 0.7: mean 60.00, population std 10.00
    assert "60.00 +- 10.00 (2)" in rows["fedavg"]
    assert "90.00 +- 0.00 (1)" in rows["fedavg"]
    assert rows["local"].count("| - |") == 1  # no run of local in scenario b
    assert rows["fedavg"].endswith("| 1.5000 - 2.0000 |")
    assert rows["local"].endswith("| 0.0000 |")
    # the table says which protocol its numbers follow
    assert "pooled test split" in md and "after its local training" in md and "best round" in md
    csv = pd.read_csv(tmp_path / "t.csv")
    r = csv[(csv.scenario == "a") & (csv.method == "fedavg")].iloc[0]
    assert r.seeds == 2 and r.accuracy == pytest.approx(0.6) and r.accuracy_mean == pytest.approx(0.5)
    assert (r.test_pool, r.eval_model, r.report) == ("shared", "trained", "best")


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

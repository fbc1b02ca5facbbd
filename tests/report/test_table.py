import json

import pandas as pd
import pytest

from fedfactor.errors import UsageError
from fedfactor.report.table import collect, write_tables


def _summary(path, scenario, method, seed, acc, nbytes=1000):
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({
        "scenario": scenario, "method": method, "seed": seed, "accuracy_mean": acc, "accuracy_best_mean": acc + 0.1,
        "accuracy_weighted": acc, "bytes_total": nbytes, "rounds": 2, "clients": 4,
    }))


def test_mean_and_std_over_seeds(tmp_path):
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
    csv = pd.read_csv(tmp_path / "t.csv")
    r = csv[(csv.scenario == "a") & (csv.method == "fedavg")].iloc[0]
    assert r.seeds == 2 and r.accuracy_mean == pytest.approx(0.6) and r.accuracy_best_mean == pytest.approx(0.7)


def test_no_runs_is_usage_error(tmp_path):
    with pytest.raises(UsageError):
        collect([tmp_path])

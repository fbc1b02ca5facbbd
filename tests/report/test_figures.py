import json

import pandas as pd
import pytest

from fedfactor.errors import UsageError
from fedfactor.report.figures import accuracy_curves, load_curves


def _run(path, scenario, method, seed, accs):
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"scenario": scenario, "method": method, "seed": seed}))
    pd.DataFrame({"round": range(1, len(accs) + 1), "accuracy_mean": accs}).to_csv(path / "metrics.csv", index=False)


def test_curves_tag_runs_and_draw_one_panel_per_scenario(tmp_path):
    _run(tmp_path / "b/fedavg/0", "b", "fedavg", 0, [0.1, 0.2])
    _run(tmp_path / "b/fedavg/1", "b", "fedavg", 1, [0.3, 0.4])
    _run(tmp_path / "a/local/0", "a", "local", 0, [0.5, 0.6, 0.7])
    curves = load_curves([tmp_path / "b", tmp_path / "a"])
    assert len(curves) == 7
    assert set(curves[curves.scenario == "b"].seed) == {0, 1}
    assert curves[(curves.method == "local")].accuracy_mean.tolist() == [0.5, 0.6, 0.7]
    out = tmp_path / "fig" / "curves.png"
    assert accuracy_curves(curves, out, title="t") == ["b", "a"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_runs_is_usage_error(tmp_path):
    with pytest.raises(UsageError):
        load_curves([tmp_path])

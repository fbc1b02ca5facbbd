"""`mlflow-import` of a run's files: an unfinished run completed, bad paths and damaged files named
before anything is written, two folders of one run refused."""

import json
import shutil

import pytest

from fedfactor.errors import UsageError
from fedfactor.tracking import Tracker, import_runs

from ..conftest import write_content
from .conftest import _make_run_dir, _runs, _steps


@pytest.mark.slow
def test_import_completes_an_unfinished_run(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    from fedfactor.config import load_config
    from fedfactor.tracking import run_identity

    run_dir = _make_run_dir(tmp_path / "run", rounds=4)
    cfg = load_config(run_dir / "config.yaml")
    cfg.tracking = cfg.tracking.model_copy(update={"enabled": True, "uri": uri, "experiment": "imp"})
    tracker = Tracker(cfg.tracking, run_dir, *run_identity(cfg, run_dir))  # training killed at round 2
    for r in (1, 2):
        tracker.log_metrics({"bytes_up": r * 100, "accuracy_mean": r / 10}, step=r)
    tracker.end("KILLED")
    assert import_runs([run_dir], uri, "imp") == [(run_dir, "completed")]
    (run,) = _runs(uri, "imp")
    assert run.info.status == "FINISHED" and _steps(uri, run.info.run_id) == [1, 2, 3, 4]


@pytest.mark.slow
def test_import_rejects_bad_paths_and_partial_runs(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(UsageError, match="missing_dir.*does not exist"):
        import_runs([tmp_path / "missing_dir"], uri, "e")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="empty holds no run"):
        import_runs([tmp_path / "empty"], uri, "e")
    good = _make_run_dir(tmp_path / "runs" / "good")
    bad = _make_run_dir(tmp_path / "runs" / "bad")
    (bad / "summary.json").write_text('{"accuracy": 0.3,')
    with pytest.raises(UsageError, match="bad/summary.json"):
        import_runs([tmp_path / "runs"], uri, "e")
    (bad / "summary.json").write_text("{}")
    (bad / "config.yaml").unlink()
    with pytest.raises(UsageError, match="bad/config.yaml"):
        import_runs([good, bad], uri, "e")
    assert not (tmp_path / "mlflow.db").exists()  # every directory is checked before any write


JUNK = bytes(range(256)) * 4
DAMAGE = {  # file -> (what it holds, None: a folder; what the error says)
    "summary truncated": ("summary.json", '{"accuracy": 0.3,', "not readable JSON"),
    "summary empty": ("summary.json", "", "not readable JSON"),
    "summary junk": ("summary.json", JUNK, "not readable JSON"),
    "summary not an object": ("summary.json", "[0.3]", "must hold a JSON object"),
    "summary a folder": ("summary.json", None, "is not a file"),
    "summary text for a number": ("summary.json", '{"accuracy": "high"}', 'accuracy is "high", not a number'),
    "metrics empty": ("metrics.csv", "", "not a readable CSV"),
    "metrics junk": ("metrics.csv", JUNK, "not a readable CSV"),
    "metrics a folder": ("metrics.csv", None, "not a readable CSV"),
    "metrics header only": ("metrics.csv", "round,bytes_up\n", "holds no round"),
    "metrics without round": ("metrics.csv", "bytes_up\n1\n", "has no 'round' column"),
    "metrics round not a number": ("metrics.csv", "round,bytes_up\none,1\n", "round column holds something other"),
    "metrics round a fraction": ("metrics.csv", "round,bytes_up\n1.5,1\n", "round column holds something other"),
    "metrics round negative": ("metrics.csv", "round,bytes_up\n-1,1\n", "round column holds something other"),
    "metrics round past int64": ("metrics.csv", "round,bytes_up\n1e30,1\n", "round column holds something other"),
    "metrics round twice": ("metrics.csv", "round,bytes_up\n1,1\n1,2\n", "holds round 1 twice"),
    "metrics row too long": ("metrics.csv", "round,bytes_up\n1,1,5,6\n", "more fields than the header"),
    "metrics column twice": ("metrics.csv", "round,loss,loss\n1,1,2\n", "'loss' as a column name twice"),
    "metrics text for a number": ("metrics.csv", "round,bytes_up\n1,many\n", "'bytes_up' holds something other"),
    "metrics bad metric name": ("metrics.csv", "round,../up\n1,1\n", "no MLflow metric name"),
    "config empty": ("config.yaml", "", "is empty"),
    "config junk": ("config.yaml", JUNK, "config.yaml"),
    "config a folder": ("config.yaml", None, "is not a file"),
    "config not a mapping": ("config.yaml", "[1, 2]", "config.yaml"),
    "mlflow.json junk": ("mlflow.json", JUNK, "not readable JSON"),
    "mlflow.json empty": ("mlflow.json", "", "not readable JSON"),
    "mlflow.json without key": ("mlflow.json", '{"run_key": "x"}', "holds no run key"),
    "mlflow.json a folder": ("mlflow.json", None, "not readable JSON"),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_import_of_a_damaged_run_names_the_file_and_imports_nothing(tmp_path, case):
    name, content, message = DAMAGE[case]
    _make_run_dir(tmp_path / "runs" / "a_good")
    bad = _make_run_dir(tmp_path / "runs" / "bad")
    target = bad / name
    if content is None:  # a folder where the file goes
        target.unlink(missing_ok=True)
        target.mkdir()
    else:
        write_content(target, content)
    with pytest.raises(UsageError) as e:
        import_runs([tmp_path / "runs"], f"sqlite:///{tmp_path}/mlflow.db", "e")
    assert str(target) in str(e.value) and message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "mlflow.db").exists()  # every folder is checked before anything is written
    assert name == "mlflow.json" or not (bad / "mlflow.json").exists()


def test_import_refuses_two_folders_of_one_run(tmp_path):
    a = _make_run_dir(tmp_path / "runs" / "a")
    (a / "mlflow.json").write_text(json.dumps({"run_key": "0" * 32, "run_ids": {}}))
    shutil.copytree(a, tmp_path / "runs" / "copy")
    with pytest.raises(UsageError, match="runs/a and .*runs/copy hold the same run key"):
        import_runs([tmp_path / "runs"], f"sqlite:///{tmp_path}/mlflow.db", "e")
    assert not (tmp_path / "mlflow.db").exists()

"""MLflow store under parallel writers: nothing lost."""

import multiprocessing as mp

from fedfactor.config import TrackingConfig
from fedfactor.tracking import Tracker, init_store

STEPS = 15


def _one_run(uri: str, exp_id: str, i: int) -> None:
    cfg = TrackingConfig(uri=uri, experiment_id=exp_id)
    tracker = Tracker(cfg, {"index": i, "nested.key": "x" * 10}, {"worker": str(i)}, f"run{i}")
    for step in range(1, STEPS + 1):
        tracker.log_metrics({"accuracy_mean": i + step / 100, "bytes_up": step * 10}, step=step)
    tracker.finish({"accuracy_mean": i + STEPS / 100}, [])


def test_parallel_runs_all_present_with_every_step(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    exp_id = init_store(uri, "parallel")
    assert init_store(uri, "parallel") == exp_id  # idempotent: the workflow may run it again
    n = 6
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_one_run, args=(uri, exp_id, i)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * n

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([exp_id], max_results=100)
    assert sorted(r.data.params["index"] for r in runs) == [str(i) for i in range(n)]
    for r in runs:
        assert r.info.status == "FINISHED"
        i = int(r.data.params["index"])
        history = client.get_metric_history(r.info.run_id, "accuracy_mean")
        assert sorted(m.step for m in history) == list(range(1, STEPS + 1))
        assert r.data.metrics["final_accuracy_mean"] == i + STEPS / 100

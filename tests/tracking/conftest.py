"""What the tests of fedfactor.tracking share: a client on a store, a run directory's files, and
the warnings and no-ops of a tracker that gave up."""

import json
import logging

import yaml

STEPS = 10


def _client(uri):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _runs(uri, experiment):
    from mlflow.entities import ViewType

    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL, max_results=100)


def _steps(uri, run_id, key="bytes_up"):
    return sorted(m.step for m in _client(uri).get_metric_history(run_id, key))


# a summary's "versions": the machine a run trained on, which is not the one that imports it
VERSIONS = {"torch": "2.0.0", "cpu": "Some CPU @ 1 GHz", "torch_threads": 4}
VERSION_TAGS = {"fedfactor.version.torch": "2.0.0", "fedfactor.version.cpu": "Some CPU @ 1 GHz",
                "fedfactor.version.torch_threads": "4"}


def _make_run_dir(path, rounds=3, method="fedavg", seed=0):
    from fedfactor.config import load_config

    cfg = load_config(None, [f"method.name={method}", f"seed={seed}", "scenario=imp", "tracking.enabled=false"])
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    rows = ["round,bytes_up,accuracy_mean"] + [f"{r},{r * 100},{r / 10}" for r in range(1, rounds + 1)]
    (path / "metrics.csv").write_text("\n".join(rows) + "\n")
    summary = {"scenario": "imp", "method": method, "seed": seed, "dataset": cfg.data.name,
               "accuracy": 0.3, "accuracy_mean": 0.3, "accuracy_std": 0.01, "accuracy_weighted": 0.31,
               "accuracy_best_mean": 0.3, "accuracy_best_weighted": 0.31, "accuracy_at_best_val": None,
               "bytes_up": rounds * 100, "bytes_down": 50, "wall_seconds": 1.5, "versions": VERSIONS}
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "diagnostics" / "x").mkdir(parents=True)
    (path / "diagnostics" / "x" / "round_0001.npy").write_bytes(b"not really npy")
    return path


def _warnings(caplog):
    return [r for r in caplog.records if r.name == "fedfactor" and r.levelno == logging.WARNING]


def _no_ops(tracker):
    assert not tracker.active and tracker.run_id is None
    tracker.log_metrics({"bytes_up": 1.0}, step=1)
    tracker.finish({"accuracy": 0.5}, [])
    tracker.end("KILLED")

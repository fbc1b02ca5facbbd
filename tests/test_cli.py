import json

import pandas as pd
import pytest

from fedfactor.cli import main
from fedfactor.models import build_model

SUMMARY_KEYS = {"method", "dataset", "scenario", "seed", "rounds", "clients", "accuracy_mean", "accuracy_std",
                "accuracy_weighted", "accuracy_best_mean", "per_client_accuracy", "bytes_up", "bytes_down",
                "params_total", "wall_seconds", "config"}


def _sets(items):
    return [a for s in items for a in ("--set", s)]


def test_train_two_rounds_end_to_end(tmp_path, tiny, capsys):
    out = tmp_path / "run"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sets = [s for s in tiny if not s.startswith("tracking")] + [f"tracking.uri={uri}", "scenario=smoke"]
    assert main(["train", *_sets(sets), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["rounds"] == 2 and summary["clients"] == 4 and summary["scenario"] == "smoke"
    assert len(summary["per_client_accuracy"]) == 4
    assert 0 <= summary["accuracy_mean"] <= 1 and summary["accuracy_best_mean"] >= summary["accuracy_mean"]
    metrics = pd.read_csv(out / "metrics.csv")
    assert list(metrics["round"]) == [1, 2]
    assert metrics["bytes_up"].iloc[-1] == summary["bytes_up"] > 0
    # The same config's projected cost equals what the run measured.
    capsys.readouterr()
    assert main(["cost", *_sets(tiny), "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert (cost["bytes_up"], cost["bytes_down"]) == (summary["bytes_up"], summary["bytes_down"])

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("fedfactor")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "accuracy_mean")] == [1, 2]
    assert run.data.params["fl.rounds"] == "2"


def test_same_seed_gives_identical_metrics(tmp_path, tiny):
    frames = []
    for name in ("a", "b"):
        assert main(["train", *_sets(tiny + ["partition.kind=dirichlet"]), "--out", str(tmp_path / name)]) == 0
        frames.append(pd.read_csv(tmp_path / name / "metrics.csv").drop(columns="elapsed_seconds"))
    pd.testing.assert_frame_equal(frames[0], frames[1])
    assert main(["train", *_sets(tiny + ["partition.kind=dirichlet", "seed=1"]), "--out", str(tmp_path / "c")]) == 0
    other = pd.read_csv(tmp_path / "c" / "metrics.csv").drop(columns="elapsed_seconds")
    assert not other.equals(frames[0])


def _resnet9_float_state(num_classes=10, head=True):
    model = build_model("resnet9", 3, 32, 32, num_classes)
    return sum(v.numel() for k, v in model.state_dict().items()
               if v.is_floating_point() and (head or not k.startswith("head.")))


@pytest.mark.parametrize("extra, head", [([], True), (["partition.permute_labels=true"], False)])
def test_cost_fedavg_resnet9_is_exact(capsys, extra, head):
    sets = ["data.name=cifar10", "model.name=resnet9", "fl.clients=20", "fl.rounds=50", *extra]
    assert main(["cost", *_sets(sets), "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    sent = _resnet9_float_state(head=head)
    assert cost["bytes_up"] == cost["bytes_down"] == 20 * 50 * 4 * sent
    assert cost["bytes_total"] == 2 * 20 * 50 * 4 * sent


def test_cost_local_is_zero_and_sampling_scales(capsys):
    assert main(["cost", "--set", "method.name=local", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes_total"] == 0
    assert main(["cost", "--set", "fl.fraction=0.25", "--set", "fl.clients=20", "--json"]) == 0
    quarter = json.loads(capsys.readouterr().out)
    assert main(["cost", "--set", "fl.clients=20", "--json"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert full["bytes_total"] == 4 * quarter["bytes_total"]


@pytest.mark.parametrize(
    "sets, words",
    [
        (["method.name=nope"], ["fedavg", "local", "fedprox"]),
        (["data.name=nope"], ["digits", "cifar10"]),
        (["model.name=nope"], ["cnn", "resnet9"]),
        (["partition.kind=nope"], ["iid", "dirichlet"]),
        (["partition.kind=dirichlet", "partition.alpha=0"], ["alpha"]),
        (["fl.clients=5000"], ["clients"]),
        (["partition.kind=class_groups", "partition.groups=[[0, 1], [2, 42]]", "partition.clients_per_group=2"],
         ["42"]),
        (["method.name=fedprox", "method.lr=3"], ["mu"]),
        (["data.augment=rotate"], ["crop_flip"]),
        (["fl.device=tpu"], ["cpu"]),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_output(tmp_path, tiny, capsys, sets, words):
    out = tmp_path / "run"
    assert main(["train", *_sets(tiny + sets), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedfactor: error:")
    for w in words:
        assert w in err
    assert not out.exists()


def test_lists_name_one_entry_per_line(capsys):
    assert main(["methods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert {line.split("\t")[0] for line in lines} >= {"local", "fedavg", "fedprox"}
    assert all(len(line.split("\t")) == 2 and line.split("\t")[1] for line in lines)
    assert main(["datasets"]) == 0
    names = {line.split("\t")[0] for line in capsys.readouterr().out.splitlines()}
    assert {"digits", "mnist", "cifar10", "cifar100", "svhn"} <= names


def test_partition_file_is_used_and_checked(tmp_path, tiny, capsys):
    part = tmp_path / "part.json"
    assert main(["partition", *_sets(tiny + ["partition.kind=shards"]), "--out", str(part)]) == 0
    doc = json.loads(part.read_text())
    out = tmp_path / "run"
    assert main(["train", *_sets(tiny + [f"partition.file={part}"]), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["partition"]["file"] == str(part)
    assert len(doc["clients"]) == 4
    capsys.readouterr()
    assert main(["train", *_sets(tiny + [f"partition.file={part}", "fl.clients=5"]), "--out", str(tmp_path / "x")]) == 2
    assert "4 clients" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_killed_run_leaves_no_summary(tmp_path, tiny):
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    sets = [s for s in tiny if not s.startswith("fl.rounds")] + ["fl.rounds=10000"]
    proc = subprocess.Popen([sys.executable, "-m", "fedfactor.cli", "train", *_sets(sets), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (out / "metrics.csv").exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert (out / "metrics.csv").exists(), "the run never evaluated a round"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (out / "summary.json").exists()
    pd.read_csv(out / "metrics.csv")  # whatever was written is a whole file

import contextlib
import io
import json
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedfactor.cli import main

SUMMARY_KEYS = {"method", "dataset", "scenario", "seed", "rounds", "clients", "accuracy_mean", "accuracy_std",
                "accuracy_weighted", "accuracy_best_mean", "per_client_accuracy", "bytes_up", "bytes_down",
                "params_total", "wall_seconds", "config"}


def _sets(items):
    return [a for s in items for a in ("--set", s)]


@pytest.mark.slow
def test_help_says_what_the_tool_is_and_where_a_newcomer_goes_next(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert done.value.code == 0
    assert "Personalized federated learning" in out and "entry point" not in out
    assert "snakemake --cores all" in out and "docs/cli.md" in out


def test_train_two_rounds_end_to_end(tmp_path, tiny, capsys):
    out = tmp_path / "run"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sets = [s for s in tiny if not s.startswith("tracking")] + [f"tracking.uri={uri}", "scenario=smoke"]
    assert main(["train", *_sets(sets), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    # the one line, in % as the workflow's lines and tables show accuracy
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed.startswith(f"smoke/fedavg/seed0: accuracy {100 * summary['accuracy']:.2f}% (last, round 2; ")
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


@pytest.mark.slow
def test_train_runs_trains_each_run_with_its_own_sets_and_marks_the_job_done(tmp_path, tiny, capsys):
    runs = [{"out": str(tmp_path / "a"), "set": ["method.name=local"], "log": str(tmp_path / "a.log")},
            {"out": str(tmp_path / "b"), "set": ["seed=3"]}]
    done = tmp_path / "job.json"
    assert main(["train-runs", *_sets(tiny), "--runs", json.dumps(runs), "--done", str(done)]) == 0
    a, b = (json.loads((tmp_path / n / "summary.json").read_text()) for n in "ab")
    assert (a["method_name"], a["seed"], b["method_name"], b["seed"]) == ("local", 0, "fedavg", 3)
    assert json.loads(done.read_text()) == {"runs": [r["out"] for r in runs]}
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["custom/local/seed0", "custom/fedavg/seed3"]


@pytest.mark.slow
def test_train_runs_names_its_failed_run_and_writes_no_marker(tmp_path, tiny, capsys):
    runs = [{"out": str(tmp_path / "bad"), "set": ["fl.lr=1e6", "fl.momentum=0"]}, {"out": str(tmp_path / "good")}]
    done = tmp_path / "job.json"
    assert main(["train-runs", *_sets(tiny), "--runs", json.dumps(runs), "--done", str(done)]) == 1
    err = capsys.readouterr().err
    assert "fedfactor: run failed: 1 of 2 runs failed" in err and f"{tmp_path / 'bad'}: round 1, client 0" in err
    assert (tmp_path / "good" / "summary.json").exists() and not done.exists()


@pytest.mark.parametrize("runs, words", [
    ("[{", "is not JSON"),
    ("[]", "non-empty JSON list"),
    ('[{"out": "x", "sets": []}]', "non-empty JSON list"),
    ('[{"out": "x"}, {"out": "./x"}]', "names a folder twice"),
    ('[{"out": "x", "set": ["fl.rounds=0"]}]', "fl.rounds"),
])
def test_train_runs_bad_runs_are_one_line_exit_2_before_any_run(tmp_path, tiny, capsys, monkeypatch, runs, words):
    monkeypatch.chdir(tmp_path)
    assert main(["train-runs", *_sets(tiny), "--runs", runs, "--done", "job.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedfactor: error: ") and words in err[0], err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_same_seed_gives_identical_metrics(tmp_path, tiny):
    frames = []
    for name in ("a", "b"):
        assert main(["train", *_sets(tiny + ["partition.kind=dirichlet"]), "--out", str(tmp_path / name)]) == 0
        frames.append(pd.read_csv(tmp_path / name / "metrics.csv").drop(columns="elapsed_seconds"))
    pd.testing.assert_frame_equal(frames[0], frames[1])
    assert main(["train", *_sets(tiny + ["partition.kind=dirichlet", "seed=1"]), "--out", str(tmp_path / "c")]) == 0
    other = pd.read_csv(tmp_path / "c" / "metrics.csv").drop(columns="elapsed_seconds")
    assert not other.equals(frames[0])


@pytest.mark.parametrize("extra, floats", [
    ([], 64 * 200 + 200 + 200 * 10 + 10),  # mlp on 8x8 digits: Linear(64, 200) + head Linear(200, 10)
    (["partition.permute_labels=true"], 64 * 200 + 200),  # permuted labels: the head stays home
])
def test_cost_of_a_tiny_model_is_hand_counted(capsys, extra, floats):
    sets = ["model.name=mlp", "fl.clients=4", "fl.rounds=3", *extra]
    assert main(["cost", *_sets(sets), "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert cost["bytes_up"] == cost["bytes_down"] == 4 * 3 * floats * 4  # clients x rounds x floats x 4 B


def test_cost_fedavg_resnet9_matches_the_supplement_weight_count(capsys):
    sets = ["data.name=cifar10", "model.name=resnet9", "fl.clients=20", "fl.rounds=50"]
    assert main(["cost", *_sets(sets), "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    # 2,568,384 conv + FC weights (supplement Table 4), the FC bias (10), and 4 BatchNorm entries
    # (weight, bias, running mean and variance) per channel of 64 + 3 x 128 + 4 x 256 channels
    floats = 2_568_384 + 10 + 4 * (64 + 3 * 128 + 4 * 256)
    assert floats == 2_574_282
    assert cost["bytes_up"] == cost["bytes_down"] == 20 * 50 * 4 * floats


def test_cost_reads_heads_from_a_partition_file(tmp_path, tiny, capsys):
    part = tmp_path / "perm.json"
    assert main(["partition", *_sets(tiny + ["partition.permute_labels=true"]), "--out", str(part)]) == 0
    capsys.readouterr()
    assert main(["cost", *_sets(tiny + ["partition.permute_labels=true"]), "--json"]) == 0
    permuted = json.loads(capsys.readouterr().out)
    assert main(["cost", *_sets(tiny + [f"partition.file={part}"]), "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert main(["cost", *_sets(tiny), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert from_file["bytes_total"] == permuted["bytes_total"] < plain["bytes_total"]


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
        (["method.name=fedprox", "method.mu=abc"], ["method.mu"]),
        (["fl.lr=-1e-3"], ["fl.lr"]),
        (["fl.epochs=true"], ["fl.epochs"]),
        (["data.split=[0.5, 0.6, 0.1]"], ["data.split"]),
        (["eval.test_pool=everyone"], ["client", "shared"]),
        (["eval.report=best_val", "data.split=[0.9, 0.0, 0.1]"], ["val"]),
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


def test_train_sets_torch_threads_before_any_work(tmp_path, tiny, monkeypatch, capsys):
    import torch

    from fedfactor.errors import UsageError

    seen = []

    def train(cfg, out, hold_signals=False):  # the job's first step: record the threads it would train with
        seen.append(torch.get_num_threads())
        raise UsageError("stopped before training")

    monkeypatch.setattr("fedfactor.run.job.train", train)
    before = torch.get_num_threads()
    try:
        for extra in (["--threads", "2"], [], ["--threads", "0"]):
            torch.set_num_threads(3)
            assert main(["train", *_sets(tiny), "--out", str(tmp_path / "run"), *extra]) == 2
        assert seen == [2, 1, 3]  # 2 as asked, 1 by default, and 0 leaves torch's count as it is
        capsys.readouterr()
        assert main(["train", *_sets(tiny), "--out", str(tmp_path / "run"), "--threads", "-1"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--threads" in err and len(seen) == 3
    finally:
        torch.set_num_threads(before)


def test_a_job_with_fewer_threads_than_the_cpus_slurm_gave_it_says_what_to_set(tmp_path, tiny, monkeypatch, caplog):
    """Catches: a profile whose cpus_per_task and set-threads differ, leaving CPUs idle, unnoticed."""
    import torch

    from fedfactor.errors import UsageError

    def train(cfg, out, hold_signals=False):
        raise UsageError("stopped before training")

    monkeypatch.setattr("fedfactor.run.job.train", train)
    before = torch.get_num_threads()
    try:
        for cpus, warned in (("2", True), ("1", False)):
            monkeypatch.setenv("SLURM_CPUS_PER_TASK", cpus)
            caplog.clear()
            main(["train", *_sets(tiny), "--out", str(tmp_path / "run"), "--threads", "1"])
            said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
            assert said == (["torch runs 1 threads on the 2 CPUs SLURM gave this task: set the rule's threads to "
                             "its cpus_per_task (--set-threads train=2)"] if warned else []), said
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_train_threads_reach_both_of_torchs_pools_in_a_fresh_process(tmp_path, tiny):
    import os
    import subprocess
    import sys

    # The job replaced by a report of torch's threads, in a process where nothing has run yet.
    code = ("import sys, torch; import fedfactor.run.job as job; from fedfactor.cli import main\n"
            "def train(cfg, out, hold_signals=False):\n"
            "    print(torch.get_num_threads(), torch.get_num_interop_threads()); sys.exit(0)\n"
            "job.train = train\n"
            "main(sys.argv[1:])\n")
    args = ["train", *_sets(tiny), "--out", str(tmp_path / "run"), "--threads", "2"]
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "2"]


def test_lists_name_one_entry_per_line(capsys):
    assert main(["methods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert {line.split("\t")[0] for line in lines} >= {"local", "fedavg", "fedprox"}
    assert all(len(line.split("\t")) == 2 and line.split("\t")[1] for line in lines)
    assert main(["datasets"]) == 0
    names = {line.split("\t")[0] for line in capsys.readouterr().out.splitlines()}
    assert {"digits", "mnist", "cifar10", "cifar100", "svhn", "femnist", "shakespeare"} <= names
    assert main(["partitions"]) == 0
    assert "natural" in {line.split("\t")[0] for line in capsys.readouterr().out.splitlines()}


def test_natural_partition_file_of_a_stand_in_round_trips(tmp_path, capsys):
    from fedfactor.data import load_dataset
    from fedfactor.data.partition import Partition

    sets = ["data.name=synthetic:shakespeare", "partition.kind=natural", "fl.clients=7", "data.split=[0.8, 0.0, 0.2]",
            "seed=3"]
    out = tmp_path / "part.json"
    assert main(["partition", *_sets(sets), "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("natural: 7 clients")
    ds = load_dataset("synthetic:shakespeare")
    part = Partition.load(out)
    part.validate(ds.y.numpy(), str(out))
    assert [set(ds.owners[c["train"]]) for c in part.clients] == [{w} for w in part.meta["natural_clients"]]
    again = tmp_path / "again.json"
    assert main(["partition", *_sets(sets), "--out", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()
    assert main(["prepare-data", "--dataset", "synthetic:shakespeare", "--root", str(tmp_path / "data")]) == 0
    assert "100 classes, 10 natural clients" in capsys.readouterr().out


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_typed_values_that_once_crashed_now_run(tmp_path, tiny):
    # YAML reads 1e-3 as a string; the typed config makes it a float before anything runs
    out = tmp_path / "run"
    sets = tiny + ["fl.lr=1e-3", "method.name=fedprox", "method.mu=1e-3"]
    assert main(["train", *_sets(sets), "--out", str(out)]) == 0
    cfg = json.loads((out / "summary.json").read_text())["config"]
    assert cfg["fl"]["lr"] == 0.001 and cfg["method"] == {"name": "fedprox", "mu": 0.001}


def test_dirichlet_fixed_feddecomp_setting_partitions_cifar100_shaped_data(tmp_path, capsys):
    # CIFAR-100's shape of labels (500 train and 100 test images per class) with 1x1 images: the
    # paper's alpha = 0.1, 40 clients x 500 train / 100 test, test drawn from the official test part
    rng = np.random.default_rng(0)
    y, y_test = np.repeat(np.arange(100), 500), np.repeat(np.arange(100), 100)
    data = tmp_path / "c100.npz"
    np.savez(data, x=rng.random((len(y), 1, 1, 1), dtype=np.float32), y=y,
             x_test=rng.random((len(y_test), 1, 1, 1), dtype=np.float32), y_test=y_test)
    out = tmp_path / "part.json"
    sets = [f"data.name=npz:{data}", "data.split_mode=official", "data.split=[0.9, 0.1, 0.0]", "fl.clients=40",
            "partition.kind=dirichlet_fixed", "partition.alpha=0.1"]
    assert main(["partition", *_sets(sets), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(len(c["train"]), len(c["test"])) for c in doc["clients"]] == [(500, 100)] * 40
    assert all(min(c["test"]) >= len(y) for c in doc["clients"])  # from the official test part
    train_sets = [set(c["train"]) for c in doc["clients"]]
    assert any(a & b for i, a in enumerate(train_sets) for b in train_sets[i + 1:])  # overlap allowed


# Each strategy draws a value the typed config must refuse for that key.
_text = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6).map(lambda s: "x" + s)
_BAD_VALUES = {
    "fl.rounds": st.one_of(st.integers(max_value=0), _text, st.just(1.5), st.just(True)),
    "fl.clients": st.one_of(st.integers(max_value=0), _text, st.just("null")),
    "fl.batch_size": st.one_of(st.integers(max_value=0), _text),
    "fl.epochs": st.one_of(st.integers(max_value=0), st.just("false")),
    "fl.fraction": st.one_of(st.floats(max_value=0), st.floats(min_value=1.0001, max_value=1e9), _text,
                             st.just(".nan"), st.just(".inf")),
    "fl.lr": st.one_of(st.floats(max_value=0), _text, st.just(".inf")),
    "fl.momentum": st.one_of(st.floats(min_value=1, max_value=1e6), st.floats(max_value=-1e-9)),
    "fl.eval_every": st.integers(max_value=0),
    "fl.optimizer": _text,
    "fl.head": _text,
    "data.split": st.one_of(
        st.lists(st.floats(0, 1), min_size=3, max_size=3).filter(lambda v: abs(sum(v) - 1) > 1e-3),
        st.lists(st.floats(0, 1), min_size=0, max_size=2), _text),
    "data.split_mode": _text,
    "partition.alpha": st.one_of(st.floats(max_value=0), _text, st.just(".nan")),
    "partition.classes_per_client": st.integers(max_value=0),
    "partition.min_train_samples": st.integers(max_value=0),
    "partition.permutation_seed": st.integers(max_value=-1),
    "partition.kind": _text,
    "partition.groups": st.one_of(st.integers(), st.just("[[0, 1.5]]")),
    "eval.test_pool": _text,
    "eval.model": _text,
    "eval.report": _text,
    "seed": st.one_of(st.integers(max_value=-1), _text),
    "method.mu": st.one_of(st.floats(max_value=-1e-9), _text),
    "method.name": _text,
}
_UNKNOWN = st.tuples(st.sampled_from(["fl", "data", "partition", "eval", "method", "model"]),
                     _text).map(lambda t: f"{t[0]}.{t[1]}")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["train", "cost", "partition"]),
       item=st.one_of(st.sampled_from(sorted(_BAD_VALUES)).flatmap(
           lambda key: _BAD_VALUES[key].map(lambda v: (key, v))), _UNKNOWN.map(lambda k: (k, 1))))
@pytest.mark.slow
def test_invalid_settings_are_one_line_exit_2_and_nothing_written(tmp_path_factory, command, item):
    key, value = item
    text = value if isinstance(value, str) else json.dumps(value)
    base = ["data.name=digits", "fl.clients=4", "fl.rounds=1", "tracking.enabled=false", "fl.device=cpu"]
    sets = base + (["method.name=fedprox"] if key == "method.mu" else []) + [f"{key}={text}"]
    out = tmp_path_factory.mktemp("bad") / "out"
    argv = [command, *_sets(sets)] + (["--out", str(out)] if command != "cost" else ["--json"])
    err, std = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        code = main(argv)
    message = err.getvalue()
    assert code == 2, (argv, message)
    assert message.startswith("fedfactor: error:") and message.count("\n") == 1, message
    assert "Traceback" not in message and std.getvalue() == ""
    assert not out.exists()


@pytest.mark.parametrize("where", ["a file", "under a file", "a config folder"])
def test_bad_output_and_config_paths_are_one_line_exit_2_before_anything_runs(tmp_path, tiny, capsys, where):
    (tmp_path / "file").write_text("keep me")
    out = {"a file": tmp_path / "file", "under a file": tmp_path / "file" / "run"}.get(where, tmp_path / "run")
    config = ["--config", str(tmp_path)] if where == "a config folder" else []
    assert main(["train", *config, *_sets(tiny), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedfactor: error:") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and (tmp_path / "file").read_text() == "keep me"


def test_study_spec_checks_what_the_workflow_passes_and_writes_it(tmp_path, capsys):
    spec = {"study": "s", "title": "S", "smoke": False, "seeds": [0], "scenarios": ["a"],
            "methods": {"fedavg": {"name": "fedavg", "implemented": True}, "fedper": {"name": "fedper", "implemented": False}},
            "paper": None, "claims": []}
    assert main(["study-spec", "--json", json.dumps(spec), "--out", str(tmp_path / "study.json")]) == 0
    assert json.loads((tmp_path / "study.json").read_text())["methods"]["fedper"]["implemented"] is False
    assert "not implemented yet: 1" in capsys.readouterr().out
    for bad in ("[1]", "{", json.dumps({**spec, "seeds": "0"})):
        assert main(["study-spec", "--json", bad, "--out", str(tmp_path / "bad.json")]) == 2
        assert not (tmp_path / "bad.json").exists()
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_claims_on_a_study_without_claims_says_so_in_one_line(tmp_path, capsys):
    spec = {"study": "s", "title": "S", "smoke": False, "seeds": [0], "scenarios": ["a"],
            "methods": {"fedavg": {"name": "fedavg", "implemented": True}}, "paper": None, "claims": []}
    (tmp_path / "study.json").write_text(json.dumps(spec))
    (tmp_path / "runs").mkdir()
    argv = ["claims", str(tmp_path / "runs"), "--study", str(tmp_path / "study.json"), "--out", str(tmp_path / "claims")]
    assert main(argv) == 0
    assert capsys.readouterr().out == "study s lists no claims: nothing to evaluate, nothing written\n"
    assert not (tmp_path / "claims").exists()


@pytest.mark.parametrize("command, out, pattern", [
    ("partition", "{tmp}", "is a folder; name a file"),
    ("partition", "{tmp}/file/p.json", "lies under"),
    ("partition", "", "--out is empty"),
    ("train", "", "--out is empty"),
    ("curves", "{tmp}", "is a folder; name a file"),
    ("claims", "{tmp}/file", "is a file, not a folder"),
])
def test_every_commands_output_path_is_checked_before_it_runs(tmp_path, tiny, capsys, command, out, pattern):
    (tmp_path / "file").write_text("keep me")
    argv = {"partition": ["partition", *_sets(tiny)], "train": ["train", *_sets(tiny)],
            "curves": ["curves", str(tmp_path)], "claims": ["claims", str(tmp_path), "--study", "s.json"]}[command]
    assert main([*argv, "--out", out.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedfactor: error:") and err.count("\n") == 1 and pattern in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and (tmp_path / "file").read_text() == "keep me"


def test_cost_refuses_more_rounds_than_it_replays_with_the_limit(capsys):
    assert main(["cost", *_sets(["fl.clients=20", "fl.rounds=100000"])]) == 2
    err = capsys.readouterr().err
    assert "2,000,000 updates, over the 500,000 it replays" in err and err.count("\n") == 1


@pytest.mark.slow
def test_a_stop_signal_after_the_summary_is_complete_exits_0(tmp_path, tiny):
    # Snakemake and SLURM read 143 as a failed job: a finished one must not become that.
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "fedfactor.cli", "-q", "train", *_sets(tiny), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (out / "summary.json").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert f"-> {out}" in stdout


@pytest.mark.slow
def test_an_in_process_train_gives_the_callers_signal_handlers_back(tmp_path, tiny):
    import signal

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    assert main(["train", *_sets(tiny), "--out", str(tmp_path / "run")]) == 0
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


class _Exited(Exception):
    pass


def test_a_refused_command_exits_at_once_and_an_in_process_call_returns(monkeypatch, capsys):
    """As a program, a refusal ends the process right after its line (no seconds of torch teardown);
    called in-process (tests, the probe) main returns the status instead."""
    import fedfactor.cli as cli

    def exit_now(code):
        raise _Exited(code)

    monkeypatch.setattr(cli.os, "_exit", exit_now)
    refused = ["train", "--set", "fl.rounds=-1", "--out", "out"]
    monkeypatch.setattr("sys.argv", ["fedfactor", *refused])
    with pytest.raises(_Exited) as e:
        main()
    assert e.value.args == (2,)
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("fedfactor: error: fl.rounds")
    assert main(refused) == 2  # in-process: returned, not exited


def test_a_full_disk_under_any_command_is_one_line_and_exit_1(tmp_path, tiny, monkeypatch, capsys):
    import errno
    import os

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("fedfactor.io.os.fsync", full)  # every atomic write syncs its file before the rename
    part = tmp_path / "part.json"
    assert main(["partition", *_sets(tiny), "--out", str(part)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"fedfactor: run failed: no space left to write {part} (") and "Traceback" not in err
    assert os.listdir(tmp_path) == []  # no temporary left


def test_docs_cli_lists_every_command():
    """docs/cli.md opens with one line a command: a command missing there is one a newcomer never finds."""
    from pathlib import Path

    from fedfactor.cli import build_parser

    page = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    # a line's command, and each command after " | " (`fedfactor methods | datasets | models | partitions`)
    listed = set(re.findall(r"(?:^fedfactor| \|) ([a-z][a-z-]*)", page.split("```")[1], re.M))
    commands = set(next(a for a in build_parser()._actions if a.dest == "command").choices)
    assert commands == listed

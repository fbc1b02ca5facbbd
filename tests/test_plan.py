"""`fedfactor plan`: runs, steps and memory measured on the meta device, the fit check, and the table
docs/plan.md holds."""

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from fedfactor import plan
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.models import build_model

REPO = Path(__file__).resolve().parents[1]
DIGITS = str(REPO / "config" / "runs" / "digits.yaml")


def _cfg(*sets):
    return load_config(DIGITS, ["model.name=mlp", "fl.clients=3", "eval.model=received", *sets])


def _study(tmp_path, clients=4, **extra):
    doc = {"study": "tiny_plan", "run_config": DIGITS, "results": str(tmp_path / "results"), "seeds": [0, 1],
           "runs_per_job": 2,
           "scenarios": {"iid": {"partition": {"kind": "iid"}, "fl": {"clients": clients, "rounds": 2}},
                         "dir": {"partition": {"kind": "dirichlet", "alpha": 0.5}, "fl": {"clients": clients}}},
           "methods": {"fedavg": {"name": "fedavg"}, "local": {"name": "local"}, "fedper": {"name": "fedper"}},
           **extra}
    path = tmp_path / f"tiny{clients}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def test_tensor_bytes_counts_a_shared_tensor_once():
    a, b = torch.zeros(10), torch.zeros(3, dtype=torch.float64)
    assert plan.tensor_bytes([{"x": a, "y": a}, [a, (b,)]]) == 40 + 24


def test_states_of_local_are_the_model_bytes_times_the_clients():
    # Stand-Alone keeps a whole model per client and the server nothing: K distinct copies
    mlp = sum(p.numel() * 4 for p in build_model("mlp", 1, 8, 8, 10).parameters())
    for clients in (3, 12):
        m = plan.measure(_cfg("method.name=local", f"fl.clients={clients}"))
        assert m.how == "measured" and m.model == mlp
        assert m.states == clients * mlp


def test_more_clients_need_more_memory_and_a_shared_model_less():
    few, many = (plan.measure(_cfg("method.name=fedper", f"fl.clients={k}")) for k in (3, 30))
    assert many.states > few.states and many.checkpoint > few.checkpoint
    # FedAvg's trained clients keep no entry of their own: 30 clients hold less than 30 whole models
    fedavg = plan.measure(_cfg("method.name=fedavg", "fl.clients=30"))
    assert fedavg.states < 30 * fedavg.model


def test_training_memory_grows_with_the_batch():
    small, large = (plan.measure(_cfg("method.name=fedavg", "model.name=cnn", f"fl.batch_size={b}"))
                    for b in (8, 512))
    assert large.training > small.training


def test_local_steps_follow_rounds_clients_epochs_and_batches():
    facts = plan.DATASET_FACTS["digits"]
    cfg = _cfg("fl.clients=20", "fl.rounds=20", "fl.epochs=2", "fl.batch_size=16", "fl.fraction=0.5")
    # 1,797 x 0.8 / 20 = 71.9 samples a client: 5 batches of 16, 10 clients a round
    assert plan.local_steps(cfg, facts) == 20 * 10 * 2 * 5


def test_study_runs_groups_and_flags_what_cannot_fit(tmp_path):
    path = _study(tmp_path)
    p = plan.plan_study([path], lambda config: plan.Node(100 * 10**6, 0, "test"))
    s = plan.summary(p)
    assert s["runs"] == 2 * 3 * 2 and s["tuning_runs"] == 0
    assert sum(g.runs for g in p.groups) == 12
    # every run needs more than 100 MB (the process alone is 541 MiB): every group flagged, by name
    assert p.flagged and all(g.fits for g in p.groups)
    assert "tiny_plan: final iid/fedavg" in p.flagged[0]
    roomy = plan.plan_study([path], lambda config: plan.Node(64 * 2**30, 0, "test"))
    assert not roomy.flagged
    # the same study with more clients holds more
    bigger = plan.summary(plan.plan_study([_study(tmp_path, clients=40)]))
    assert bigger["host_bytes_cpu_run"] > s["host_bytes_cpu_run"]


def test_check_run_memory_refuses_a_run_that_cannot_fit(tmp_path):
    config = {"study": "tiny_plan", "gpus_per_job": 0}
    runs = [("scenario 'iid', method 'fedavg'", ["model.name=mlp", "fl.clients=3", "method.name=fedavg"])]
    settings = lambda **train: SimpleNamespace(overwrite_resources={"train": train}, default_resources=None)  # noqa: E731
    with pytest.raises(UsageError, match=r"study tiny_plan: scenario 'iid', method 'fedavg' needs 0\.\d+ GiB .* "
                                         r"requests 95\.4 MiB \(mem_mb=100"):
        plan.check_run_memory(config, DIGITS, runs, settings(mem_mb=100))
    plan.check_run_memory(config, DIGITS, runs, settings(mem_mb=8000))  # fits
    plan.check_run_memory(config, DIGITS, runs, settings())  # nothing requested: nothing to check


def test_profile_node_reads_the_train_rule():
    node = plan.profile_node(REPO / "profiles" / "slurm", 0)
    slurm = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())["set-resources"]["train"]
    assert node.memory == slurm["mem_mb"] * 10**6 and node.gpus == slurm["gpu"]
    assert plan.profile_node(None, 1).memory is None


@pytest.mark.slow
def test_run_count_equals_the_train_runs_snakemake_plans(tmp_path):
    path = _study(tmp_path)
    r = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-n", "-p",
                        "--configfile", path], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr + r.stdout
    commands = re.findall(r"^.*fedfactor train-runs .*$", r.stdout, re.M)
    planned = sum(len(json.loads(re.search(r"--runs '(\[.*?\])'", c)[1])) for c in commands)
    assert planned == plan.summary(plan.plan_study([path]))["runs"] == 12


# Studies whose rows in docs/plan.md are checked against the command's (seconds each); the paper
# studies take minutes together (`fedfactor plan --all`)
CHEAP = ["config/config.yaml", "config/studies/feddecomp_elora_digits.yaml", "config/studies/fedfac_simulation.yaml"]


def test_docs_table_matches_the_command():
    text = (REPO / "docs" / "plan.md").read_text()
    node = lambda config: plan.profile_node(REPO / "profiles" / "slurm", config.get("gpus_per_job", 0))  # noqa: E731
    for path in CHEAP:
        p = plan.plan_study([str(REPO / path)], node)
        row = plan.summary_table([p]).splitlines()[2]
        cells = [c.strip() for c in row.strip("|").split("|")]
        documented = [line for line in text.splitlines() if line.startswith(f"| {p.study} ")]
        assert documented, f"docs/plan.md has no row for {p.study}"
        assert [c.strip() for c in documented[0].strip("|").split("|")] == cells, p.study


# The largest run of each image model family in the paper studies, rehearsed at its full client count
# and full model for one round, on random data of its dataset's shape (docs/plan.md, rehearsal).
REHEARSALS = [
    ("fedfac_table2", "cifar100_S5/fedfac"),  # VGG-16, 100 clients: the largest run of any study
    ("fedfac_table2", "cifar10_pi0.1/fedfac"),  # ResNet-18, 100 clients
]


def _rehearsal_config(study: str, name: str):
    config = plan.read_study([REPO / "config" / "studies" / f"{study}.yaml"])
    spec = next(s for s in plan.study_runs(config) if s.kind == "final" and s.name == name)
    return str(REPO / config["run_config"]), spec.sets


@pytest.mark.slow
@pytest.mark.parametrize("study, name", REHEARSALS)
def test_a_paper_scale_round_stays_within_its_plan(tmp_path, study, name):
    """One round of the run in a process of its own: its peak memory and its checkpoint stay within
    what `plan` measured on shapes for a run whose every client has trained, and a trained client
    keeps its own part alone (the checkpoint after a round grows by that, not by whole models)."""
    from fedfactor.data import dataset_info

    run_config, sets = _rehearsal_config(study, name)
    cfg = plan._run_config(run_config, sets)
    info = dataset_info(cfg.data.name, cfg.data.root)
    K = cfg.fl.clients
    rng = torch.Generator().manual_seed(0)
    y = torch.arange(30 * K) % info.num_classes  # 30 images a client, its test share among them
    x = torch.rand((len(y), info.channels, info.height, info.width), generator=rng)
    data = tmp_path / "data.npz"
    np.savez(data, x=x.numpy(), y=y.numpy(), x_test=x[:10].numpy(), y_test=y[:10].numpy())
    tiny = [f"data.name=npz:{data}", "partition.kind=shards", "partition.classes_per_client=2",
            "model.pretrained=false", "fl.rounds=1",
            # the peak is reached in a client's first step (weights, gradients, optimizer state); the
            # paper's other local epochs repeat it, at 20 epochs most of this test's minutes. Two of
            # the 100 clients train, not the paper's 10: what each keeps is what the next would, and
            # every one costs VGG-16's Adam steps and its share of the average (a minute for 8 more).
            "fl.epochs=1", "fl.fraction=0.02",
            "checkpoint.keep=true", "tracking.enabled=false"]
    real = plan._run_config(run_config, [*sets, *tiny])
    measured = plan.measure(real)
    out, rss = tmp_path / "run", tmp_path / "maxrss"
    # VmHWM, the peak of this process's own memory since exec: ru_maxrss would keep the high-water
    # mark of the pytest worker it was forked from
    code = ("import re, sys; from fedfactor.cli import main; code = main(sys.argv[1:]); "
            "peak = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read())[1]; "
            f"open({str(rss)!r}, 'w').write(peak); sys.exit(code)")
    argv = ["train", "--config", run_config, *[a for s in [*sets, *tiny] for a in ("--set", s)], "--out", str(out)]
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    peak = int(rss.read_text()) * 1024
    checkpoint = (out / "checkpoint.pt").stat().st_size
    planned_host = plan.PROCESS_BYTES + measured.states + measured.round_extra + measured.training_cpu
    assert peak <= planned_host, (peak / 2**30, planned_host / 2**30)
    assert checkpoint <= measured.checkpoint
    # after one round: the server's model, the initial one the untrained clients share, and each of
    # the round's clients' own part, as plan measured it; were a trained client to keep its whole
    # model, the checkpoint would hold a whole model more for each
    own = (measured.checkpoint - measured.model) / K
    trained = round(real.fl.fraction * K)
    assert checkpoint <= 2 * measured.model + trained * own * 1.05 + 2**20, (checkpoint, measured.model, own)
    # and independently of what plan counts: FedFac's Lambda (the layer before the classifier) is a
    # small part of the model (VGG-16's 15th layer 13 %, ResNet-18's 17th 21 %), so a trained client
    # that kept its whole model would take the checkpoint past this
    assert checkpoint < (2 + trained / 2) * measured.model, (checkpoint, measured.model)


def _bad_study(tmp_path, **change):
    doc = {"study": "bad", "run_config": str(REPO / "config" / "runs" / "digits.yaml"), "results": str(tmp_path),
           "seeds": [0], "scenarios": {"a": {"partition": {"kind": "iid"}}}, "methods": {"fedavg": {"name": "fedavg"}}}
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({**doc, **change}))
    return path


@pytest.mark.parametrize("change, says", [
    ({"methods": {"fedavg": {"name": "fedavgg"}}}, "methods.fedavg: no method is named 'fedavgg'; did you mean"),
    ({"tuning": {"file": "t.yaml", "seeds": [1], "points": 2.0, "common": {"fl.lr": [0.1, 0.2]}}},
     r"tuning.points must be a whole number \(got 2.0\)"),
    ({"methods": {"x": {"name": "fedavg"}}, "select": {"methods": ["y"]}}, "select.methods names 'y'"),
    ({"runs_per_job": 2.0}, r"runs_per_job must be a whole number \(got 2.0\)"),
], ids=["unknown method", "points 2.0", "select", "runs_per_job 2.0"])
def test_plan_refuses_a_study_in_one_line_naming_its_file(tmp_path, change, says):
    # the DAG build gives the same line: tests/test_workflow.py compares the two
    path = _bad_study(tmp_path, **change)
    with pytest.raises(UsageError, match=rf"^{re.escape(str(path))}: .*{says}") as refused:
        plan.read_study([path])
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "[1, 2]\n"])
def test_plan_refuses_an_empty_or_listed_study_file_in_one_line(tmp_path, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=rf"^{re.escape(str(path))}: (is empty|holds a list, not a mapping of keys);"):
        plan.read_study([path])

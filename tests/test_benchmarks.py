"""The benchmark runner and the light parts of its benchmarks. Nothing here asserts a timing: the
numbers depend on the machine; only the rows' shape and the runner's behaviour are checked."""

import json
import math
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from fedfactor.config import load_config
from fedfactor.run.simulator import Simulator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `benchmarks` is a top-level folder, not part of the installed package

from benchmarks import __main__ as runner  # noqa: E402
from benchmarks import clients, gpu, memory  # noqa: E402

KEYS = {"case", "value", "unit", "ratio", "target", "inputs"}


def check_rows(rows):
    assert rows
    for r in rows:
        assert set(r) == KEYS
        assert isinstance(r["case"], str) and r["case"]
        assert isinstance(r["value"], float) and isinstance(r["unit"], str) and isinstance(r["inputs"], str)
        assert r["ratio"] is None or isinstance(r["ratio"], float)
        assert r["target"] is None or r["target"].split()[0] in ("<=", ">=", "<", ">")


def test_unknown_name_exits_2_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "clients", "no_such_bench"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no_such_bench" in lines[0] and "clients" in lines[0]


def test_a_missing_module_is_skipped_but_a_broken_one_raises(tmp_path, monkeypatch):
    assert runner.load("no_such_module_here") is None
    # an import error inside an existing module is the module's bug: it must surface
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "broken_bench.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.setattr(sys.modules["benchmarks"], "__path__", [*sys.modules["benchmarks"].__path__,
                                                                str(tmp_path / "benchmarks")])
    with pytest.raises(ModuleNotFoundError):
        runner.load("broken_bench")


def test_targets():
    assert runner.met(1.1, "<= 1.15") == "ok"
    assert runner.met(1.2, "<= 1.15") == "MISSED"
    assert runner.met(0.96, ">= 0.95") == "ok"
    assert runner.met(1.2, None) == ""
    assert runner.met(None, "<= 1.15") == ""
    assert runner.met(float("nan"), "<= 1.15") == ""


def test_runner_writes_json_with_machine_info(tmp_path, monkeypatch, capsys):
    fake = types.SimpleNamespace(
        DESCRIPTION="a fake benchmark",
        run=lambda quick, device: [clients.row("a case", 12.5, "ms", 1.2, "<= 1.15", "--set fl.lr=0.1"),
                                   clients.row("failed case", float("nan"), "ms", None, None, "cannot run: why")])
    broken = types.SimpleNamespace(DESCRIPTION="raises", run=lambda quick, device: 1 / 0)
    modules = {"methods": fake, "clients": broken}
    monkeypatch.setattr(runner, "load", lambda name: modules.get(name))
    out = tmp_path / "deep" / "bench.json"
    threads = torch.get_num_threads()
    try:
        code = runner.main(["methods", "clients", "overhead", "--quick", "--out", str(out)])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)  # the runner sets it for its process; give the test session its own back
    assert code == 1  # a benchmark failed; the others' rows are still written
    printed = capsys.readouterr().out
    assert "a fake benchmark" in printed and "MISSED" in printed and "--set fl.lr=0.1" in printed
    assert "overhead: skipped" in printed and "ZeroDivisionError" in printed

    def no_constants(name):
        raise AssertionError(f"{name} in the JSON: not valid JSON")

    report = json.loads(out.read_text(), parse_constant=no_constants)
    machine = report["machine"]
    for key in ("date", "hostname", "cpu", "cores", "torch", "cuda_device", "threads", "command"):
        assert machine[key] not in (None, "")
    assert machine["threads"] == 1
    assert machine["command"] == shlex.join(["python", "-m", "benchmarks", "methods", "clients", "overhead", "--quick",
                                             "--out", str(out)])
    assert report["quick"] is True and report["device"] == "cpu"
    assert report["skipped"] == {"overhead": "module does not exist yet"}
    assert "ZeroDivisionError" in report["failed"]["clients"]
    (bench,) = report["benchmarks"]
    assert bench["name"] == "methods" and bench["description"] == "a fake benchmark"
    assert bench["rows"][0] == {"case": "a case", "value": 12.5, "unit": "ms", "ratio": 1.2, "target": "<= 1.15",
                                "inputs": "--set fl.lr=0.1"}
    assert bench["rows"][1]["value"] is None  # NaN written as null


@pytest.mark.slow
def test_clients_quick_rows():
    rows = clients.run(quick=True, device="cpu")
    check_rows(rows)
    cases = [r["case"] for r in rows]
    assert "100 clients x 10 samples: round" in cases and "1 client x 1000 samples: round" in cases
    assert {f"100 clients x 10 samples: {h}" for h in clients.HOOKS} <= set(cases)
    many = rows[cases.index("100 clients x 10 samples: round")]
    assert many["target"] == "<= 1.5" and many["ratio"] > 0
    assert "fl.clients=100" in many["inputs"] and "samples_per_client" in many["inputs"]
    assert all(math.isfinite(r["value"]) for r in rows)


def test_client_sets_give_each_client_exactly_its_samples(tmp_path):
    from fedfactor.config import load_config
    from fedfactor.run.simulator import Simulator

    npz = clients.write_npz(tmp_path / "d.npz", n_train=60, n_test=6)
    sim = Simulator(load_config(None, [*clients.client_sets(npz, 6, 10, 1, "cpu"), "method.name=fedavg"]))
    assert [len(c["train"]) for c in sim.clients] == [10] * 6
    assert len(torch.cat([c["train"].idx for c in sim.clients]).unique()) == 60  # disjoint: every sample once


def test_memory_child_and_rows(tmp_path, monkeypatch):
    from fedfactor.study.workflow import method_sets

    npz = clients.write_npz(tmp_path / "d.npz", n_train=40, n_test=4)
    sets = clients.client_sets(npz, 4, 10, 1, "cpu", epochs=2) + method_sets(memory.method_entry("fedper"), "fedper")
    sets += ["diagnostics.keep_weights=false"]  # else the diagnosed clients also keep the layer before the head
    threads = torch.get_num_threads()
    try:
        r = memory.child({"sets": sets, "threads": 1})
    finally:
        torch.set_num_threads(threads)
    assert r["peak_rss_mb"] > 0 and r["per_client_bytes"] == r["states_bytes"] / 4
    # every client trained, and a trained FedPer client keeps its own head only: the body comes from the server
    sim = Simulator(load_config(None, sets))
    assert sim.cfg.fl.fraction == 1 and sim.cfg.eval.model == "received"
    personal = set(sim.init) - set(sim.server["global"])
    assert personal == set(sim.ctx.head_keys)
    assert r["per_client_bytes"] == sum(sim.init[key].nbytes for key in personal)
    assert r["model_bytes"] == sum(t.nbytes for t in sim.init.values())

    # the row layout, without starting a process per setting
    fake = {"peak_rss_mb": 500.0, "states_bytes": 4096, "per_client_bytes": 1024.0, "model_bytes": 1024,
            "server_bytes": 1000}
    monkeypatch.setattr(memory, "measure", lambda spec: fake if "sets" in spec else {"peak_rss_mb": 400.0})
    rows = memory.run(quick=True, device="cpu")
    check_rows(rows)
    per_client = [r for r in rows if "state per client" in r["case"]]
    assert len(per_client) == 2 * len(memory.METHODS) and all(r["ratio"] == 1.0 for r in per_client)


@pytest.mark.slow
def test_startup_marks_each_phase_of_a_fresh_job_once(tmp_path, tiny):
    import os

    from benchmarks import startup

    sets = [a for s in tiny + ["fl.rounds=1", f"data.root={tmp_path}"] for a in ("--set", s)]
    cost = startup.job_cost([*sets, "--out", str(tmp_path / "run")], {**os.environ, "OMP_NUM_THREADS": "1"}, tmp_path)
    assert (tmp_path / "run" / "summary.json").exists()  # the job ran on to its end
    assert all(cost[k] >= 0 for k in (*startup.PHASES, "to_round1", "round1_and_end", "exit", "total"))
    assert sum(cost[k] for k in startup.PHASES) == pytest.approx(cost["to_round1"])
    assert cost["to_round1"] + cost["round1_and_end"] + cost["exit"] == pytest.approx(cost["total"])
    assert cost["dynamo_before_round1"] == 0  # the module docstring's claim: torch imports it in round 1


def test_memory_counts_a_shared_storage_once():
    t = torch.zeros(10)
    assert memory.held_bytes([{"a": t, "b": t[:5]}, {"c": t}]) == 40
    assert memory.held_bytes([{"a": t}, {"nested": [torch.zeros(2), {"x": torch.zeros(3)}]}]) == 60


@pytest.mark.slow
def test_memory_child_process_reports_errors(tmp_path):
    r = memory.measure({"sets": ["fl.clients=0"], "threads": 1})
    assert "error" in r and "fl.clients" in r["error"]


def test_gpu_is_skipped_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rows = gpu.run(quick=True, device="cpu")
    check_rows(rows)
    assert len(rows) == 1 and rows[0]["case"] == "skipped" and math.isnan(rows[0]["value"])
    assert rows[0]["inputs"] == "no CUDA device"

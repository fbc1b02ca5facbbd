"""The Snakemake DAG: a dry run of the default study and a real run of a tiny one."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]


def _snakemake(*args, cwd=REPO):
    return subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def _job_counts(stdout: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stdout, re.M)}


def test_default_study_dry_run(tmp_path):
    r = _snakemake("-n", "--config", f"results={tmp_path}/results")
    assert r.returncode == 0, r.stderr + r.stdout
    jobs = _job_counts(r.stdout)
    # 5 scenarios x 10 methods x 2 seeds; one partition per scenario and seed; one dataset
    assert jobs["train"] == 100 and jobs["partition"] == 10 and jobs["prepare_data"] == 1
    assert jobs["table"] == 1 and jobs["curves"] == 1 and jobs["mlflow_init"] == 1 and jobs["diagnose"] == 1


def test_tiny_study_runs_end_to_end_and_a_rerun_does_nothing(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("data: {name: digits}\nmodel: {name: mlp}\nfl: {clients: 4, rounds: 2, epochs: 1, batch_size: 32}\n")
    study = tmp_path / "study.yaml"
    study.write_text(json.dumps({
        "study": "tiny", "run_config": str(run), "results": str(tmp_path / "results"), "seeds": [0, 1],
        "scenarios": {"perm": {"partition": {"kind": "iid", "permute_labels": True}}},
        "methods": {"local": {"name": "local"}, "fedavg": {"name": "fedavg"}},
    }))
    r = _snakemake("--cores", "2", "--configfile", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    out = tmp_path / "results" / "tiny"
    table = pd.read_csv(out / "table.csv")
    assert sorted(table["method"]) == ["fedavg", "local"] and set(table["seeds"]) == {2}
    assert "| fedavg |" in (out / "table.md").read_text()
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "diagnostics" / "diagnostics.md").exists() and (out / "logs" / "diagnose.log").exists()
    for method in ("local", "fedavg"):
        for seed in (0, 1):
            summary = json.loads((out / "runs" / "perm" / method / f"seed{seed}" / "summary.json").read_text())
            assert summary["scenario"] == "perm" and summary["seed"] == seed and summary["head_local"]
            assert (out / "logs" / "train" / "perm" / method / f"seed{seed}.log").exists()
    # every run is in the one MLflow store, under the study's experiment
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/results/mlflow.db")
    exp = client.get_experiment_by_name("fedfactor-tiny")
    assert len(client.search_runs([exp.experiment_id])) == 4

    again = _snakemake("-n", "--configfile", str(study), cwd=tmp_path)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr

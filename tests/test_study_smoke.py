"""Every study file dry-runs in full, and runs end to end scaled down on synthetic data.

The paper studies need CIFAR, SVHN, MNIST and Tiny-ImageNet, which these machines cannot download:
each runs here as a smoke study (config/scale/smoke.yaml: `smoke: true` swaps every dataset for
synthetic data of its shape and classes), one seed, one round (the scale file's two would double the
training, the most of this file's time; every rule runs either way), its first scenario and a few of its
methods (one implemented method and, where it lists one, a method not implemented yet, which must be
skipped with a note), with fewer clients and samples where the paper's setting would take minutes, and
every model at 1/8 of its width (config/scale/smoke.yaml's `smoke_scale`, which the workflow applies).
Every rule of the DAG runs: data, partition, train, diagnostics, tables, paper tables, claims,
figures. The outputs must say they are a smoke run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fedfactor.methods import METHODS


pytestmark = pytest.mark.slow  # every study dry-run in full and smoke-run end to end

REPO = Path(__file__).resolve().parents[1]
# the paper studies, then the CPU-scale ones (config/studies/cpu/, whose claims are the paper studies')
STUDIES = sorted((REPO / "config" / "studies").glob("*.yaml")) + sorted((REPO / "config" / "studies" / "cpu").glob("*.yaml"))


def _id(path: Path) -> str:
    """`factorized_fl_label`, `cpu/factorized_fl`: unique, where two files share a name."""
    return str(path.relative_to(REPO / "config" / "studies").with_suffix(""))
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
SMOKE_TITLE = "SMOKE RUN on synthetic data — not results"


def _snakemake(*args, timeout=900, env=None):
    """Snakemake in a process of its own; with `env`, the fork server's (tests/forkserver.py)."""
    cmd = SNAKEMAKE if env is None else ["snakemake", *SNAKEMAKE[3:]]
    return subprocess.run([*cmd, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def _jobs(stdout: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stdout, re.M)}


def _dry_run(configfiles: list[Path], config: dict) -> str:
    """Snakemake's dry run in this process (a subprocess would spend seconds importing torch each time);
    returns what it printed."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    out, cwd = io.StringIO(), os.getcwd()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), SnakemakeApi(OutputSettings()) as api:
            workflow = api.workflow(resource_settings=ResourceSettings(cores=1), snakefile=REPO / "Snakefile",
                                    config_settings=ConfigSettings(configfiles=configfiles, config=config), workdir=REPO)
            workflow.dag(DAGSettings()).execute_workflow(executor="dryrun")
    finally:
        os.chdir(cwd)
    return out.getvalue()


@pytest.mark.parametrize("path", STUDIES, ids=_id)
def test_every_study_dry_runs_in_full(path, tmp_path):
    study = yaml.safe_load(path.read_text())
    config: dict = {"results": str(tmp_path)}
    tuning = study.get("tuning")
    if tuning and not (REPO / tuning["file"]).exists():  # a study not tuned yet: its runs at the defaults
        config["tuning"] = {**tuning, "use": False}
    jobs = _jobs(_dry_run([path], config))
    if "simulation" in study:
        assert jobs == {"simulate": 1, "all": 1, "total": 2}
        return
    implemented = [m for m, e in study["methods"].items() if e["name"] in METHODS]
    per_job = study.get("runs_per_job", 1)  # runs of a scenario and seed, methods in the study's order
    assert jobs["train"] == len(study["scenarios"]) * -(-len(implemented) // per_job) * len(study["seeds"])
    assert jobs["partition"] == len(study["scenarios"]) * len(study["seeds"])
    for rule in ("table", "figures", "diagnose", "study_spec", "mlflow_init"):
        assert jobs[rule] == 1, rule
    assert jobs.get("paper_tables") == (1 if study.get("paper") else None)
    assert jobs.get("claims") == (1 if study.get("claims") or study.get("claims_from") else None)


# FedFac's simulation study is synthetic by nature: it runs as it is, smaller
SIMULATION = {"seeds": [0], "data": {"clients": 10, "train_samples": 20, "test_samples": 20},
              "train": {"rounds": 2}, "grid": {"p": [0.5], "alpha": [0.4]}}


def _smoke_file(path: Path, root: Path) -> tuple[Path, dict]:
    study = yaml.safe_load(path.read_text())
    if "simulation" in study:
        extra = {"results": str(root / "results"), "overrides": SIMULATION}
        out = root / f"{_id(path).replace('/', '-')}.yaml"
        out.write_text(json.dumps(extra))
        return out, {**study, **extra}
    done = [m for m, e in study["methods"].items() if e["name"] in METHODS]
    missing = [m for m, e in study["methods"].items() if e["name"] not in METHODS]
    select = {"scenarios": [next(iter(study["scenarios"]))], "methods": done[:1] + missing[:1]}
    scale = yaml.safe_load((REPO / "config" / "scale" / "smoke.yaml").read_text())
    # the scale file's `smoke_scale` (each run config's smaller models, clients and epochs) the workflow applies
    overrides = {**scale["overrides"], "fl": {**scale["overrides"]["fl"], "rounds": 1}}
    # one torch thread a job: the fixture runs two studies at once beside another test worker, and the
    # paper studies' two threads a job would oversubscribe 2 cores (4 studies: 62 s with two, 43 s with one)
    extra = {"results": str(root / "results"), "data_root": str(root / "data"), "select": select,
             "overrides": overrides, "threads_per_job": 1}
    if "tuning" in study:  # a tuned study's chosen values hold for its own budget, not a smoke run's
        extra["tuning"] = {"use": False}
    out = root / f"{_id(path).replace('/', '-')}.yaml"
    out.write_text(json.dumps(extra))
    return out, {**study, **extra, "done": done[:1], "missing": missing}


def _labels(claim: dict) -> list[str]:
    """The method labels a claim of a study YAML names (a side is a label or {method: label, ...})."""
    sides = [s for key in ("a", "b", "method", "among") for s in
             (claim[key] if isinstance(claim.get(key), list) else [claim[key]] if key in claim else [])]
    return [s["method"] if isinstance(s, dict) else s for s in sides]


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory, fedfactor_env):
    """Every study's smoke run, two Snakemake processes at a time (most of a small study's time is
    a chain of short jobs, which leaves cores idle), into one results folder as for a user's studies:
    one MLflow store, created first (a fresh SQLite store opened by several processes at once can
    fail its schema migration), and each synthetic dataset prepared where it is first needed."""
    root = tmp_path_factory.mktemp("smoke")
    subprocess.run(["fedfactor", "mlflow-init", "--uri", f"sqlite:///{root}/results/mlflow.db",
                    "--experiment", "fedfactor-smoke-store", "--out", str(root / "store.id")], check=True,
                   capture_output=True, timeout=300, env=fedfactor_env)
    scale = REPO / "config" / "scale" / "smoke.yaml"

    def run(path):
        extra, study = _smoke_file(path, root)
        files = [path, extra] if "simulation" in study else [path, scale, extra]
        # --nolock: the studies share results/data and the store; each writes its files atomically
        r = _snakemake("--cores", "2", "--nolock", "--configfile", *map(str, files), timeout=1800, env=fedfactor_env)
        return _id(path), (r, study, root)

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(run, STUDIES))


@pytest.mark.parametrize("path", STUDIES, ids=_id)
def test_every_study_runs_end_to_end_as_a_smoke_run(path, smoke_runs):
    r, study, root = smoke_runs[_id(path)]
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    out = root / "results" / study["study"]
    if "simulation" in study:
        assert {"true", "dynamic", "random"} <= set(pd.read_csv(out / "simulation.csv")["decomposition"])
        assert all((out / f"figure{n}.{ext}").exists() for n in (6, 7) for ext in ("png", "pdf"))
        return
    spec = json.loads((out / "study.json").read_text())
    listed = {m: e["name"] in METHODS for m, e in yaml.safe_load(path.read_text())["methods"].items()}
    assert spec["smoke"] and {m: e["implemented"] for m, e in spec["methods"].items()} == listed
    scenario = study["select"]["scenarios"][0]
    for method in study["done"]:
        summary = json.loads((out / "runs" / scenario / method / "seed0" / "summary.json").read_text())
        assert summary["dataset"].startswith("synthetic:") and summary["rounds"] == 1
        assert summary["method"] == method and summary["method_name"] == study["methods"][method]["name"]
    table = (out / "tables" / "table.md").read_text()
    assert table.startswith(f"# {SMOKE_TITLE}")
    for method in study["missing"]:
        assert f"{method} (" in table and "Not implemented yet" in table
    assert pd.read_csv(out / "tables" / "table.csv")["smoke_run_synthetic_data"].all()
    if study.get("paper"):
        assert SMOKE_TITLE in (out / "tables" / "paper.md").read_text()
        assert (out / "tables" / "paper.tex").exists() and (out / "tables" / "paper.html").exists()
    if study.get("claims") or study.get("claims_from"):
        claims = pd.read_csv(out / "claims" / "claims.csv", keep_default_na=False)
        # a claim naming an as-run seed method is also checked with its text variant; a CPU-scale
        # study's claims are its paper studies' (claims_from), each tested or left to paper scale
        variants = study.get("text_variants") or {}
        both = sum(any(label in variants for label in _labels(c)) for c in spec["claims"])
        far = spec.get("paper_scale_only") or []
        assert len(claims) == len(spec["claims"]) + both + sum(2 if d["text"] else 1 for d in far)
        assert (claims["mode"] == "text").sum() == both + sum(d["text"] for d in far)
        assert (claims["verdict"] == "needs paper scale").sum() == sum(2 if d["text"] else 1 for d in far)
        origins = {doc["study"] for doc in (yaml.safe_load((REPO / e["study"]).read_text())
                                            for e in study.get("claims_from") or [])} or {study["study"]}
        assert set(claims["origin"]) == origins
        assert SMOKE_TITLE in (out / "claims" / "claims.md").read_text()
        assert (out / "claims" / "comparisons.csv").exists()
    pngs = sorted(p.stem for p in (out / "figures").glob("*.png"))
    assert {"accuracy_rounds", "accuracy_bytes", "accuracy_time", "per_client"} <= set(pngs)
    assert (out / "diagnostics" / "diagnostics.md").exists()
    # a smoke run's figures, the diagnostics' too, are watermarked and for no paper: PNG only
    for folder in (out / "figures", out / "diagnostics" / "figures"):
        assert list(folder.glob("*.png")) and not list(folder.glob("*.pdf")), folder
    for log in ("table", "figures", "diagnose", "study_spec"):
        assert (out / "logs" / f"{log}.log").exists() and (out / "benchmarks" / f"{log}.tsv").exists()


def test_fedfac_table2_leaf_rows_run_as_smoke_runs_with_the_paper_numbers_beside(tmp_path, fedfactor_env):
    """FedFac Table 2's FEMNIST and Shakespeare rows, every Table 2 method, on the synthetic stand-ins
    (same shapes and classes, natural clients): partitions by writer and role, each method set apart
    per scenario as the study says, the paper's numbers beside ours, the claims evaluated."""
    path = REPO / "config" / "studies" / "fedfac_table2.yaml"
    study = yaml.safe_load(path.read_text())
    methods = ["fedavg", "fedprox", "fedper", "lg_fedavg", "fedem", "fedrep", "fedfac", "fedfac_static"]
    extra = tmp_path / "leaf.yaml"
    overrides = {"fl": {"rounds": 1}}  # and smoke.yaml's smoke_scale for fedfac.yaml, which the workflow applies
    extra.write_text(json.dumps({"results": str(tmp_path / "results"), "data_root": str(tmp_path / "data"),
                                 "select": {"scenarios": ["femnist", "shakespeare"], "methods": methods},
                                 "overrides": overrides, "runs_per_job": len(methods), "threads_per_job": 1}))
    r = _snakemake("--cores", "2", "--configfile", str(path), str(REPO / "config" / "scale" / "smoke.yaml"),
                   str(extra), timeout=1800, env=fedfactor_env)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    out = tmp_path / "results" / study["study"]
    for scenario, dataset, model in (("femnist", "synthetic:femnist", "femnist_cnn_softmax"),
                                     ("shakespeare", "synthetic:shakespeare", "char_lstm")):
        part = json.loads((out / "partitions" / scenario / "seed0.json").read_text())
        assert part["meta"]["kind"] == "natural"
        for method in methods:
            summary = json.loads((out / "runs" / scenario / method / "seed0" / "summary.json").read_text())
            assert (summary["dataset"], summary["model"], summary["rounds"]) == (dataset, model, 1)
    # the scenario's own settings reached its runs: FedFac splits FEMNIST's conv2 but Shakespeare's fc1
    femnist = yaml.safe_load((out / "runs" / "femnist" / "fedfac" / "seed0" / "config.yaml").read_text())
    shakespeare = yaml.safe_load((out / "runs" / "shakespeare" / "fedfac" / "seed0" / "config.yaml").read_text())
    assert (femnist["method"]["layers"], femnist["method"]["tau"], femnist["method"]["kappa"]) == ([2], "90%", 0.75)
    assert (shakespeare["method"]["layers"], shakespeare["method"]["tau"]) == ([3], "mean")
    paper = pd.read_csv(out / "tables" / "paper.csv")
    leaf = paper[paper["dataset"].isin(["FEMNIST", "Shakespeare"])]
    assert set(leaf["dataset"]) == {"FEMNIST", "Shakespeare"}
    claims = pd.read_csv(out / "claims" / "claims.csv")
    assert len(claims) and SMOKE_TITLE in (out / "claims" / "claims.md").read_text()


def test_the_verdict_page_lists_every_claim_and_takes_no_verdict_from_a_smoke_run(smoke_runs, tmp_path):
    """Through the CPU-scale studies' smoke runs to the verdict page: every claim of every paper study
    has its row, and none takes a verdict from synthetic data."""
    root = next(iter(smoke_runs.values()))[2]
    out = tmp_path / "verdicts.md"
    r = subprocess.run(["fedfactor", "verdicts", "--results", str(root / "results"), "--out", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    claims = {f"{d['study']}.{c['id']}" for d in (yaml.safe_load(p.read_text()) for p in STUDIES
                                                 if p.parent.name == "studies") for c in d.get("claims") or []}
    listed = re.findall(r"^\| \*\*([^*]+)\*\*: ", out.read_text(), re.M)
    assert sorted(listed) == sorted(claims) and len(claims) == 92
    assert (root / "results" / "cpu_factorized_fl" / "claims" / "claims.csv").exists()  # the smoke run's
    assert "92 claims of 4 papers at CPU scale: 0 reproduced, 0 not reproduced, 0 within noise" in r.stdout

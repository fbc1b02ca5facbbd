"""The Snakemake DAG: a dry run of the default study and a real run of a tiny one."""

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fedfactor.study import tuning
from fedfactor.study.workflow import study_runs

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]


def _snakemake(*args, cwd=REPO, env=None):
    """Snakemake in a process of its own; with `env`, the fork server's (tests/forkserver.py)."""
    cmd = SNAKEMAKE if env is None else ["snakemake", *SNAKEMAKE[3:]]
    return subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


def _job_counts(stdout: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stdout, re.M)}


def _default_dry_run(tmp_path, *args):
    """The default study's dry run (results under tmp_path), checked to pass; its output and job counts."""
    r = _snakemake("-n", *args, "--config", f"results={tmp_path}/results")
    assert r.returncode == 0, r.stderr + r.stdout
    return r, _job_counts(r.stdout)


@pytest.mark.slow
def test_default_study_dry_run(tmp_path):
    r, jobs = _default_dry_run(tmp_path, "-p")
    # 2 scenarios x 8 methods x 5 seeds = 80 runs, 4 a job; one partition per scenario and seed; one dataset;
    # no tuning (its own target)
    assert jobs["train"] == 20 and jobs["partition"] == 10 and jobs["prepare_data"] == 1
    assert not {"tune_train", "tune_select", "mlflow_init_tuning"} & set(jobs)
    assert jobs["table"] == 1 and jobs["figures"] == 1 and jobs["mlflow_init"] == 1 and jobs["diagnose"] == 1
    assert jobs["study_spec"] == 1 and "paper_tables" not in jobs and "claims" not in jobs  # no paper behind it

    # The train rule's commands give each run the `--set`s of the study's expansion (study_runs, which
    # the DAG build's checks load too): the scenario's, the four the workflow sets for a seed, then
    # the method's at the values chosen on validation.
    study = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    chosen = tuning.read_chosen({**study["tuning"], "file": REPO / study["tuning"]["file"]}, list(study["scenarios"]),
                                list(study["methods"]))
    runs = {(r.scenario, r.method): r for r in study_runs(study, chosen) if r.kind == "final"}
    commands = re.findall(r"^Shell command: .*fedfactor train-runs .*$", r.stdout, re.M)
    assert len(commands) == 20
    trained = []
    for command in commands:
        argv = shlex.split(command)
        sets = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--set"]
        scenario = json.loads(next(s for s in sets if s.startswith("scenario=")).split("=", 1)[1])
        seed = json.loads(next(s for s in sets if s.startswith("seed=")).split("=", 1)[1])
        assert [s.split("=", 1)[0] for s in sets[-4:]] == [
            "seed", "partition.file", "tracking.uri", "tracking.experiment_id"], command
        for run in json.loads(argv[argv.index("--runs") + 1]):
            expected = runs[scenario, run["out"].split("/")[-2]]
            assert sets[:-4] == expected.scenario_sets and run["set"] == expected.method_sets, command
            assert seed in expected.seeds and chosen[scenario][expected.method]  # tuned values in the entry
            trained.append((expected.name, seed))
    assert sorted(trained) == sorted((r.name, s) for r in runs.values() for s in r.seeds)  # each run once


@pytest.mark.slow
def test_default_study_tuning_dry_run(tmp_path):
    """`snakemake tune`: every method's grid on the tuning seed, one selection into tuning.file."""
    r, jobs = _default_dry_run(tmp_path, "tune")
    # 2 scenarios x 8 methods x 6 points x 1 seed = 96 runs, 4 a job
    assert jobs["tune_train"] == 24 and jobs["tune_select"] == 1 and jobs["mlflow_init_tuning"] == 1
    assert "train" not in jobs and "table" not in jobs
    # the committed file and the record in the results folder, which makes a fresh clone tune
    assert "config/tuned/default.yaml" in r.stdout and f"{tmp_path}/results/default/tuning/chosen.yaml" in r.stdout


# One line naming the study file, the run and the key, before any job: a fedprox hyperparameter out of
# range (checked as the train job checks it), and a file without `study:` (it would be merged into the
# default study). tests/study/test_workflow_checks.py has every other class of bad study, called directly.
@pytest.mark.parametrize("change, message", [
    ({"methods": {"prox": {"name": "fedprox", "mu": -1}}},
     "{study}: scenario 'a', method 'prox': method.mu: input should be greater than or equal to 0 (got -1)"),
    ({"study": None}, "{study}: holds no `study:`, so it is no study file. Give a study first and this file after it "
                      "to override the study's keys, e.g. --configfile config/config.yaml {study}"),
])
@pytest.mark.slow
def test_a_bad_study_ends_the_dry_run_with_one_clear_line(tmp_path, change, message):
    doc = {"study": "bad", "run_config": str(REPO / "config" / "runs" / "digits.yaml"), "results": str(tmp_path),
           "seeds": [0], "scenarios": {"a": {"partition": {"kind": "iid"}}}, "methods": {"fedavg": {"name": "fedavg"}}}
    doc.update(change)
    study = tmp_path / "bad.yaml"
    study.write_text(json.dumps({k: v for k, v in doc.items() if v is not None}))
    r = _snakemake("-n", "--configfile", str(study), cwd=REPO)
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line and not line.startswith("Using workflow")]
    assert r.returncode == 1 and lines == [message.format(study=study)], r.stdout + r.stderr


@pytest.mark.parametrize("change", [
    {"methods": {"fedavg": {"name": "fedavgg"}}},
    {"tuning": {"file": "t.yaml", "seeds": [1], "points": 2.0, "common": {"fl.lr": [0.1, 0.2]}}},
    {"claims": [{"id": "c", "kind": "order", "a": "fedavg", "b": "nobody", "scenarios": ["a"], "claim": "x",
                 "source": "y"}]},
], ids=["unknown method", "points 2.0", "a claim naming no method"])
@pytest.mark.slow
def test_plan_and_the_dry_run_refuse_a_bad_study_with_the_same_line(tmp_path, change):
    doc = {"study": "bad", "run_config": str(REPO / "config" / "runs" / "digits.yaml"), "results": str(tmp_path),
           "seeds": [0], "scenarios": {"a": {"partition": {"kind": "iid"}}}, "methods": {"fedavg": {"name": "fedavg"}},
           **change}
    study = tmp_path / "bad.yaml"
    study.write_text(json.dumps(doc))
    dry = _snakemake("-n", "--configfile", str(study), cwd=REPO)
    planned = subprocess.run([sys.executable, "-m", "fedfactor", "plan", "--study", str(study), "--profile", "none"],
                             capture_output=True, text=True, cwd=REPO)
    dry_lines = [line for line in (dry.stdout + dry.stderr).splitlines() if line and not line.startswith("Using ")]
    assert dry.returncode == 1 and len(dry_lines) == 1, dry.stdout + dry.stderr
    assert planned.returncode == 2 and planned.stderr == f"fedfactor: error: {dry_lines[0]}\n"


@pytest.mark.slow
def test_lint_is_clean(tmp_path):
    r = _snakemake("--lint", "--config", f"results={tmp_path}/results")
    assert r.returncode == 0 and "Congratulations" in r.stdout + r.stderr, r.stdout + r.stderr


def _study_file(tmp_path, run_config: str, **study) -> Path:
    """A study file in `tmp_path` on a run config of its own, its results under tmp_path/results."""
    run = tmp_path / "run.yaml"
    run.write_text(run_config)
    path = tmp_path / "study.yaml"
    path.write_text(json.dumps({"run_config": str(run), "results": str(tmp_path / "results"), **study}))
    return path


@pytest.mark.slow
def test_tiny_study_runs_end_to_end_and_a_rerun_does_nothing(tmp_path, fedfactor_env):
    study = _study_file(
        tmp_path, "data: {name: digits}\nmodel: {name: mlp}\nfl: {clients: 4, rounds: 2, epochs: 1, batch_size: 32}\n",
        study="tiny", seeds=[0, 1], scenarios={"perm": {"partition": {"kind": "iid", "permute_labels": True}}},
        methods={"local": {"name": "local"}, "fedavg": {"name": "fedavg"}, "fedper": {"name": "fedper"}},
        runs_per_job=2)  # jobs of local + fedavg, and of fedper alone
    r = _snakemake("--cores", "2", "--configfile", str(study), cwd=tmp_path, env=fedfactor_env)
    assert r.returncode == 0, r.stderr + r.stdout
    out = tmp_path / "results" / "tiny"
    table = pd.read_csv(out / "tables" / "table.csv")
    assert sorted(table["method"]) == ["fedavg", "fedper", "local"] and set(table["seeds"]) == {2}
    assert not table["smoke_run_synthetic_data"].any()
    assert "| fedavg |" in (out / "tables" / "table.md").read_text()
    assert (out / "figures" / "accuracy_rounds.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "diagnostics" / "diagnostics.md").exists() and (out / "logs" / "diagnose.log").exists()
    assert sorted(p.name for p in (out / "jobs" / "train" / "perm").iterdir()) == [
        "seed0-1.json", "seed0-2.json", "seed1-1.json", "seed1-2.json"]
    for method in ("local", "fedavg", "fedper"):
        for seed in (0, 1):
            summary = json.loads((out / "runs" / "perm" / method / f"seed{seed}" / "summary.json").read_text())
            assert summary["scenario"] == "perm" and summary["seed"] == seed and summary["head_local"]
            log = (out / "logs" / "train" / "perm" / method / f"seed{seed}.log").read_text()
            assert "alembic" not in log  # the store's set-up chatter is not what a failure's log shows first
    # every run is in the one MLflow store, under the study's experiment
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/results/mlflow.db")
    exp = client.get_experiment_by_name("fedfactor-tiny")
    assert len(client.search_runs([exp.experiment_id])) == 6

    again = _snakemake("-n", "--configfile", str(study), cwd=tmp_path, env=fedfactor_env)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr

    # a changed hyperparameter of one method re-runs that method's jobs (and the reports), nothing else,
    # and inside them only its runs: the finished runs of the other methods are skipped
    shutil.copytree(out / "runs", tmp_path / "results" / "tiny_before" / "runs")  # compared with below
    spec = json.loads(study.read_text())
    spec["methods"]["fedavg"] = {"name": "fedprox", "mu": 0.0}
    study.write_text(json.dumps(spec))
    changed = _snakemake("-n", "--configfile", str(study), cwd=tmp_path, env=fedfactor_env)
    assert changed.returncode == 0, changed.stderr + changed.stdout
    jobs = _job_counts(changed.stdout)
    assert jobs["train"] == 2 and "partition" not in jobs and "mlflow_init" not in jobs
    assert re.findall(r"wildcards: scenario=perm, seed=\d, job=(\d)", changed.stdout) == ["1", "1"]
    runs = out / "runs" / "perm"
    stamps = {m: (runs / m / "seed0" / "summary.json").stat().st_mtime_ns for m in ("local", "fedavg", "fedper")}
    rerun = _snakemake("--cores", "2", "--configfile", str(study), cwd=tmp_path, env=fedfactor_env)
    assert rerun.returncode == 0, rerun.stderr + rerun.stdout
    now = {m: (runs / m / "seed0" / "summary.json").stat().st_mtime_ns for m in stamps}
    assert now["local"] == stamps["local"] and now["fedper"] == stamps["fedper"] and now["fedavg"] != stamps["fedavg"]
    assert json.loads((runs / "fedavg" / "seed0" / "summary.json").read_text())["method_name"] == "fedprox"
    assert "holds this run, finished: skipped" in (out / "logs" / "train" / "perm" / "local" / "seed0.log").read_text()
    assert len(client.search_runs([exp.experiment_id])) == 8  # fedprox's two runs are new MLflow runs

    # `snakemake compare`: the study against its runs before the change, cell by cell; FedProx at mu 0
    # is FedAvg step for step, so every cell is the same in every seed
    compared = _snakemake("--cores", "1", "compare", "--configfile", str(study), "--config", "compare_with=tiny_before",
                          cwd=tmp_path, env=fedfactor_env)
    assert compared.returncode == 0, compared.stderr + compared.stdout
    frame = pd.read_csv(out / "compare" / "tiny_before" / "compare.csv")
    assert sorted(frame["method"]) == ["fedavg", "fedper", "local"] and set(frame["verdict"]) == {"same"}
    assert (out / "compare" / "tiny_before" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    unnamed = _snakemake("-n", "compare", "--configfile", str(study), cwd=tmp_path, env=fedfactor_env)
    said = (unnamed.stdout + unnamed.stderr).splitlines()
    assert unnamed.returncode == 1 and "Traceback" not in unnamed.stderr, said
    assert said[-1] == (f"{study}: `snakemake compare` compares this study with another one's runs: name its folder "
                        f"under {tmp_path}/results/ with --config compare_with=FOLDER (e.g. compare_with=default+untuned)")


@pytest.mark.slow
def test_a_study_that_records_failed_runs_finishes_and_names_them(tmp_path, fedfactor_env):
    """failed_runs: record: a run that diverges is a result. The study finishes, the job's marker and the
    run's folder say why, and the table is over the seeds that finished and names the one that did not.
    Without it (the default) the same study stops at the failed job."""
    study = _study_file(
        tmp_path, "data: {name: digits}\nmodel: {name: mlp}\nfl: {clients: 4, rounds: 2, epochs: 1, batch_size: 32}\n",
        study="tiny", seeds=[0, 1], scenarios={"iid": {"partition": {"kind": "iid"}}},
        methods={"fedavg": {"name": "fedavg"}, "wild": {"name": "fedavg", "run": {"fl": {"lr": 1e12}}}},
        failed_runs="stop")
    stopped = _snakemake("--cores", "2", "--configfile", str(study), cwd=tmp_path, env=fedfactor_env)
    assert stopped.returncode != 0 and not (tmp_path / "results" / "tiny" / "tables").exists()
    spec = json.loads(study.read_text())
    study.write_text(json.dumps({**spec, "failed_runs": "record"}))
    r = _snakemake("--cores", "2", "--configfile", str(study), cwd=tmp_path, env=fedfactor_env)
    assert r.returncode == 0, r.stderr + r.stdout
    out = tmp_path / "results" / "tiny"
    failed = json.loads((out / "runs" / "iid" / "wild" / "seed1" / "failed.json").read_text())
    assert failed["seed"] == 1 and failed["reason"].startswith("round 1, client ")
    marker = json.loads((out / "jobs" / "train" / "iid" / "seed1-2.json").read_text())  # wild: the 2nd job
    assert [f["run"] for f in marker["failed"]] == [str(out / "runs" / "iid" / "wild" / "seed1")]
    md = (out / "tables" / "table.md").read_text()
    assert "Failed, not in the numbers (each cell is over the seeds that finished): iid/wild seed 0: round 1, " in md
    assert "| wild |" not in md and "| fedavg |" in md  # no seed of wild finished: no row of numbers


# ---------------------------------------------------------------------------------------------
# fedfactor.study.workflow: what the Snakefile asks of the package

from fedfactor.errors import UsageError  # noqa: E402
from fedfactor.study.workflow import (check_overrides, deep_merge, implemented, method_entry, method_sets,  # noqa: E402
                                scenario_overrides, selected)


def _study(**extra):
    return {"study": "s", "run_config": str(REPO / "config" / "runs" / "digits.yaml"),
            "scenarios": {"a": {"partition": {"kind": "iid"}, "fl": {"rounds": 50, "epochs": 5}},
                          "b": {"data": {"name": "cifar10"}, "partition": {"kind": "dirichlet"}}},
            "methods": {"fedavg": {"name": "fedavg"}, "fedper": {"name": "fedper_not_yet"}}, **extra}


def test_study_overrides_win_over_the_scenarios_own_values_key_by_key():
    assert deep_merge({"fl": {"rounds": 50, "epochs": 5}, "x": 1}, {"fl": {"rounds": 2}}) == {
        "fl": {"rounds": 2, "epochs": 5}, "x": 1}
    study = _study(overrides={"fl": {"rounds": 2}})
    assert scenario_overrides(study, "a") == {"partition": {"kind": "iid"}, "fl": {"rounds": 2, "epochs": 5}}


def test_a_smoke_study_swaps_each_dataset_for_its_synthetic_stand_in():
    study = _study(smoke=True)
    assert scenario_overrides(study, "a")["data"] == {"name": "synthetic:digits"}  # the run config's dataset
    assert scenario_overrides(study, "b")["data"] == {"name": "synthetic:cifar10"}
    assert "data" not in scenario_overrides(_study(), "a")


def test_a_smoke_study_takes_its_run_configs_smoke_scale_on_top_of_the_overrides():
    scale = {"digits.yaml": {"fl": {"epochs": 1}, "model": {"width_multiplier": 0.5}}, "other.yaml": {"seed": 3}}
    study = _study(smoke=True, smoke_scale=scale, overrides={"fl": {"rounds": 2, "epochs": 3}})
    assert scenario_overrides(study, "a") == {"partition": {"kind": "iid"}, "fl": {"rounds": 2, "epochs": 1},
                                              "model": {"width_multiplier": 0.5}, "data": {"name": "synthetic:digits"}}
    assert scenario_overrides({**study, "smoke": False}, "a")["fl"] == {"rounds": 2, "epochs": 3}  # not smoke: none


def test_every_run_config_a_study_uses_has_its_smoke_scale():
    scale = yaml.safe_load((REPO / "config" / "scale" / "smoke.yaml").read_text())["smoke_scale"]
    studies = [yaml.safe_load(p.read_text()) for p in (REPO / "config").glob("**/*.yaml") if "studies" in p.parts
               or p.name == "config.yaml"]
    used = {Path(s["run_config"]).name for s in studies if "run_config" in s}
    assert used and used <= set(scale), sorted(used - set(scale))


def test_select_narrows_a_study_in_its_own_order_and_names_unknown_entries():
    assert selected(_study(select={"scenarios": ["b", "a"]}), "scenarios") == ["a", "b"]
    assert selected(_study(select={"methods": ["fedavg"]}), "methods") == ["fedavg"]
    with pytest.raises(UsageError, match="select.methods names 'fedprox', which the study does not list"):
        selected(_study(select={"methods": ["fedprox"]}), "methods")


def test_methods_not_implemented_yet_are_told_apart():
    assert implemented(_study(), ["fedavg", "fedper"]) == {"fedavg": True, "fedper": False}


def test_a_method_entry_is_the_method_section_and_its_run_overrides_apply_to_its_jobs_alone():
    entry = {"name": "pfedpara", "init": "scaled", "run": {"fl": {"on_divergence": "skip", "lr": 0.01}}}
    sets = method_sets(entry, "pf")
    assert sorted(sets) == sorted(['fl.on_divergence="skip"', "fl.lr=0.01", 'method.name="pfedpara"',
                                   'method.init="scaled"', 'label="pf"'])
    assert method_sets({"name": "fedavg"}, "f") == ['method.name="fedavg"', 'label="f"']


def test_a_scenario_may_set_a_method_apart_and_only_that_scenario_runs_it_so():
    study = _study()
    study["scenarios"]["b"]["methods"] = {"fedavg": {"lr_scale": 2}}
    assert method_entry(study, "b", "fedavg") == {"name": "fedavg", "lr_scale": 2}
    assert method_entry(study, "a", "fedavg") == {"name": "fedavg"}
    assert "methods" not in scenario_overrides(study, "b")  # not a run-config section


@pytest.mark.parametrize("own, problem", [
    ({"fedprox": {"mu": 1}}, "scenarios.b.methods.fedprox: the study lists no method 'fedprox'"),
    ({"fedavg": {"name": "fedprox"}}, "scenarios.b.methods.fedavg: give a mapping of the method's hyperparameters"),
    ({"fedavg": {"run": {"fl": {"lr": 1}}}}, "scenarios.b.methods.fedavg: give a mapping"),
])
def test_a_scenarios_method_settings_name_a_listed_method_and_only_its_hyperparameters(own, problem):
    study = _study()
    study["scenarios"]["b"]["methods"] = own
    with pytest.raises(UsageError, match=problem):
        check_overrides(study)


@pytest.mark.slow
def test_a_download_that_fails_stops_the_study_with_the_file_to_place_not_resume(tmp_path, fedfactor_env):
    study = _study_file(tmp_path, "data: {name: cifar10}\nmodel: {name: cnn}\nfl: {clients: 2, rounds: 1, epochs: 1}\n",
                        study="offline", data_root=str(tmp_path / "data"), seeds=[0],
                        scenarios={"iid": {"partition": {"kind": "iid"}}}, methods={"fedavg": {"name": "fedavg"}})
    refused = "http://127.0.0.1:9"  # the discard port: every download is refused at once
    env = {**fedfactor_env, **{k: refused for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}}
    r = _snakemake("--cores", "1", "--configfile", str(study), cwd=tmp_path, env=env)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-2:]
    assert last[0].startswith("A dataset could not be prepared: could not download cifar10:"), r.stderr[-2000:]
    assert f"or place cifar-10-python.tar.gz under {tmp_path / 'data'} yourself" in last[0]
    assert last[1].startswith("Do what that says, then run the same command to go on: snakemake "), last

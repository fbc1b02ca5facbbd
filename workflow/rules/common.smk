import re
import shlex

from fedfactor.workflow import dataset_name, run_sets, slug

RESULTS = config["results"]
STUDY_DIR = f"{RESULTS}/{config['study']}"
RUN_CONFIG = config["run_config"]
# One SQLite store per results folder unless the study names another (an `mlflow server` on a cluster).
MLFLOW_URI = config["mlflow"].get("uri") or f"sqlite:///{RESULTS}/mlflow.db"
MLFLOW_EXPERIMENT = config["mlflow"].get("experiment", f"fedfactor-{config['study']}")
SCENARIOS = list(config["scenarios"])
METHODS = list(config["methods"])
SEEDS = [int(s) for s in config["seeds"]]
# Validates every scenario's run config while the DAG is built, and names the files of each dataset.
DATASETS = {s: dataset_name(RUN_CONFIG, config["scenarios"][s]) for s in SCENARIOS}
DATASET_NAMES = {slug(name): name for name in DATASETS.values()}


wildcard_constraints:
    scenario="|".join(map(re.escape, SCENARIOS)),
    method="|".join(map(re.escape, METHODS)),
    seed=r"\d+",


def _quoted(sets):
    return " ".join(f"--set {shlex.quote(s)}" for s in sets)


def scenario_sets(wildcards):
    overrides = config["scenarios"][wildcards.scenario]
    return _quoted(run_sets(overrides, scenario=wildcards.scenario, data={"root": config["data_root"]}))


def train_sets(wildcards):
    method = run_sets({"method": config["methods"][wildcards.method]})
    return f"{scenario_sets(wildcards)} {_quoted(method)}"

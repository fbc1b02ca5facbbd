# A study's scenarios, methods and seeds, what its jobs are told, and what `all` builds. Not included
# for a simulation study (`simulation:` in its config).
# A scale or override file given after the study writes to a folder of its own (study_folder).
STUDY_DIR = f"{RESULTS}/{study_folder(config, workflow.configfiles)}"
RUN_CONFIG = config["run_config"]
# One SQLite store per results folder unless the study names another (an `mlflow server` on a cluster).
MLFLOW_URI = config["mlflow"].get("uri") or f"sqlite:///{RESULTS}/mlflow.db"
MLFLOW_EXPERIMENT = config["mlflow"].get("experiment", f"fedfactor-{config['study']}")
SEEDS = [int(s) for s in config["seeds"]]
try:
    SCENARIOS = selected(config, "scenarios")
    # Methods a study lists before they are implemented (a paper's baselines) are skipped, and the
    # tables, claims and report name them; they never fail the DAG.
    LISTED = implemented(config, list(config["methods"]))
    IMPLEMENTED = {m: LISTED[m] for m in selected(config, "methods")}
    METHODS = [m for m, ok in IMPLEMENTED.items() if ok]
    NOT_IMPLEMENTED = [m for m, ok in IMPLEMENTED.items() if not ok]
    OVERRIDES = {s: scenario_overrides(config, s) for s in SCENARIOS}
    # Validates every scenario's run config while the DAG is built, and names the files of each dataset.
    DATASETS = {s: dataset_name(RUN_CONFIG, OVERRIDES[s]) for s in SCENARIOS}
    # The report steps see every scenario and method the study lists: those `select` left out show
    # as "not run" in the paper tables and claims.
    SPEC = study_spec(config, list(config["scenarios"]), LISTED)
    # a bad paper mapping (down to its CSV rows) or claim fails now, not after training
    check_spec(SPEC)
    check_study_sections(config)
except UsageError as e:
    raise WorkflowError(f"{', '.join(map(str, workflow.configfiles)) or 'config/config.yaml'}: {e}") from None
if not METHODS:
    raise WorkflowError(f"study {config['study']!r}: none of its methods is implemented yet "
                        f"({', '.join(IMPLEMENTED)})")
DATASET_NAMES = {slug(name): name for name in DATASETS.values()}
SMOKE = bool(config["smoke"]) or any(n.startswith("synthetic:") for n in DATASETS.values())
TITLE = (SMOKE_TITLE if SMOKE else "") + SPEC["title"]


def _quoted(sets):
    return " ".join(f"--set {shlex.quote(s)}" for s in sets)


def scenario_sets(wildcards):
    return _quoted(run_sets(OVERRIDES[wildcards.scenario], scenario=wildcards.scenario, data={"root": config["data_root"]}))


# The methods each training job of a scenario and seed runs, in the study's order (`runs_per_job`).
PER_JOB = config["runs_per_job"]
JOB_METHODS = [METHODS[i : i + PER_JOB] for i in range(0, len(METHODS), PER_JOB)]


def job_runs(wildcards):
    """The runs of one training job, as `fedfactor train-runs --runs` takes them (JSON)."""
    return json.dumps([
        {"out": f"{STUDY_DIR}/runs/{wildcards.scenario}/{m}/seed{wildcards.seed}",
         "log": f"{STUDY_DIR}/logs/train/{wildcards.scenario}/{m}/seed{wildcards.seed}.log",
         "set": method_sets(config["methods"][m], m)}
        for m in JOB_METHODS[int(wildcards.job) - 1]
    ])


def train_jobs():
    """The marker of every training job: written once all of its runs have finished."""
    return expand(f"{STUDY_DIR}/jobs/train/{{scenario}}/seed{{seed}}-{{job}}.json", scenario=SCENARIOS, seed=SEEDS,
                  job=range(1, len(JOB_METHODS) + 1))


def runs(name):
    """One file of every training run of the study."""
    return expand(f"{STUDY_DIR}/runs/{{scenario}}/{{method}}/seed{{seed}}/{name}", scenario=SCENARIOS, method=METHODS, seed=SEEDS)


def study_targets():
    """What `all` builds: tables, the paper's tables and claims where the study has them, figures and
    diagnostics (called from the Snakefile once every rule is defined)."""
    targets = rules.table.output + rules.figures.output + rules.diagnose.output
    if config.get("paper"):
        targets += rules.paper_tables.output
    if config.get("claims"):
        targets += rules.claims.output
    return targets

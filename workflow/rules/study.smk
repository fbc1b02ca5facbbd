# A study's scenarios, methods and seeds, what its jobs are told, and what `all` builds. Not included
# for a simulation study (`simulation:` in its config).
RUN_CONFIG = config["run_config"]
# One SQLite store per results folder unless the study names another (an `mlflow server` on a cluster).
MLFLOW_URI = config["mlflow"].get("uri") or f"sqlite:///{RESULTS}/mlflow.db"
MLFLOW_EXPERIMENT = config["mlflow"].get("experiment", f"fedfactor-{config['study']}")
SEEDS = [int(s) for s in config["seeds"]]


def _quoted(sets):
    return " ".join(f"--set {shlex.quote(s)}" for s in sets)


def scenario_run_sets(scenario):
    return scenario_sets(config, scenario)


def scenario_set_options(wildcards):
    return _quoted(scenario_run_sets(wildcards.scenario))


def study_entry(scenario, method):
    """A method's entry as the study's final runs take it (workflow.final_entry)."""
    return final_entry(config, scenario, method, TUNED)


def tuned_or_stop(wildcards):
    """The train rule's check that the chosen values can be read: a study whose tuning.file is
    missing or stale can still be tuned (`snakemake tune`), but its final runs stop the DAG build
    with the one line saying why."""
    if UNTUNED is not None:
        stop(f"{STUDY_FILES}: {UNTUNED}")
    return []


def tuned_rounds():
    """Each scenario's rounds, the budget its chosen values must have been tuned under."""
    return {s: load_config(RUN_CONFIG, scenario_run_sets(s)).fl.rounds for s in SCENARIOS}


def tuning_asked():
    """`snakemake tune`: the plan, live table and closing lines of the Snakefile are the final runs',
    not the tuning's (known once the DAG is built: onstart and after)."""
    return TUNING and {"tune", "tune_select"} & set(workflow.dag_settings.targets or ())


def train_sets(scenario, method, seed, entry=None, label=None):
    """One run's `--set`s in the order the train rule's command gives them to `fedfactor train-runs`
    (train.smk; tune.smk's tuning runs give their `entry` and `label`), its MLflow experiment id (known
    once mlflow_init has run) a stand-in."""
    entry = study_entry(scenario, method) if entry is None else entry
    return seed_sets(scenario, scenario_run_sets(scenario), seed, method_sets(entry, label or method), STUDY_DIR,
                     MLFLOW_URI)


# Every problem of the study ends the DAG build here, as one line naming the study file, before
# any job runs.
try:
    # A scale or override file given after the study writes to a folder of its own (study_folder).
    STUDY_FOLDER = study_folder(config, workflow.configfiles)
    STUDY_DIR = f"{RESULTS}/{STUDY_FOLDER}"
    # A variant's runs go to an experiment of their own (<experiment>+<variant>), so MLflow never shows
    # two runs of one name from a study and its variant.
    MLFLOW_EXPERIMENT += STUDY_FOLDER[len(config["study"]):]
    # The study's own keys, checked as `fedfactor plan` checks them: a bad paper mapping (down to its
    # CSV rows) or claim fails now, not after training.
    check_study(config)
    SCENARIOS = selected(config, "scenarios")
    # Methods a study lists before they are implemented (a paper's baselines, marked `implemented:
    # false`) are skipped, and the tables, claims and report name them; they never fail the DAG unless
    # no method is left (check_study). Any other name must be registered: a typo is refused, not skipped.
    LISTED = implemented(config, list(config["methods"]))
    IMPLEMENTED = {m: LISTED[m] for m in selected(config, "methods")}
    METHODS = [m for m, ok in IMPLEMENTED.items() if ok]
    NOT_IMPLEMENTED = [m for m, ok in IMPLEMENTED.items() if not ok]
    OVERRIDES = {s: scenario_overrides(config, s) for s in SCENARIOS}
    # Hyperparameters chosen on validation (tuning.file), which the final runs take. Without that
    # file, or with a stale one, only the tuning itself can be built (`snakemake tune`).
    TUNING = config["tuning"] if tuning_file(config) else None
    TUNED, UNTUNED = None, None  # the chosen values, or why there are none
    if TUNING:
        try:
            TUNED = tuning.read_chosen(TUNING, SCENARIOS, METHODS, tuned_rounds())
        except UsageError as e:
            UNTUNED = e
    if TUNED:  # the report's "What this study runs" names them per method (its template sees config alone)
        config["_chosen_on_validation"] = {
            m: "; ".join(f"{s}: " + ", ".join(f"{k.removeprefix('fl.')} {v}" for k, v in TUNED[s][m].items())
                         for s in SCENARIOS if TUNED[s].get(m)) for m in METHODS}
    # The report steps see every scenario and method the study lists: those `select` left out show
    # as "not run" in the paper tables and claims.
    SPEC = study_spec(config, list(config["scenarios"]), LISTED)
    # A job step (SLURM) parses this file again: the main process has checked the runs.
    if workflow.is_main_process:
        CHECKED = checked_runs(config, TUNED, STUDY_DIR, MLFLOW_URI)
        check_runs(RUN_CONFIG, CHECKED)
        # a run that cannot fit the memory, disk or time the train rule requests is refused before any
        # job is queued
        check_run_memory(config, RUN_CONFIG, CHECKED, workflow.resource_settings,
                         snakemake_retries(sys.argv, Path(workflow.basedir)))
    # the dataset of each scenario, whose prepare_data job the partitions wait for
    DATASETS = {s: dataset_name(RUN_CONFIG, OVERRIDES[s]) for s in SCENARIOS}
except UsageError as e:
    stop(f"{STUDY_FILES}: {e}")
DATASET_NAMES = {slug(name): name for name in DATASETS.values()}
SMOKE = bool(config["smoke"]) or any(n.startswith("synthetic:") for n in DATASETS.values())
TITLE = (SMOKE_TITLE if SMOKE else "") + SPEC["title"]
# The methods each training job of a scenario and seed runs, in the study's order (`runs_per_job`).
PER_JOB = config["runs_per_job"]
JOB_METHODS = [METHODS[i : i + PER_JOB] for i in range(0, len(METHODS), PER_JOB)]


def job_runs(wildcards):
    """The runs of one training job, as `fedfactor train-runs --runs` takes them (JSON)."""
    return json.dumps([
        {"out": f"{STUDY_DIR}/runs/{wildcards.scenario}/{m}/seed{wildcards.seed}",
         "log": f"{STUDY_DIR}/logs/train/{wildcards.scenario}/{m}/seed{wildcards.seed}.log",
         "set": method_sets(study_entry(wildcards.scenario, m), m)}
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
    if config.get("claims") or config.get("claims_from"):
        targets += rules.claims.output
    return targets


# `snakemake compare --config compare_with=<folder>`: this study against another's finished runs under
# the same results folder (default+untuned: the untuned variant of the default study).
COMPARE_WITH = config.get("compare_with")
COMPARE_DIR = f"{STUDY_DIR}/compare/{COMPARE_WITH or 'none'}"


def compare_with_or_stop(wildcards):
    """The other study's runs, or the one line saying what `compare` needs."""
    if not COMPARE_WITH:
        stop(f"{STUDY_FILES}: `snakemake compare` compares this study with another one's runs: name its "
             f"folder under {RESULTS}/ with --config compare_with=FOLDER (e.g. compare_with=default+untuned)")
    other = os.path.join(RESULTS, COMPARE_WITH, "runs")
    if not os.path.isdir(other):
        stop(f"{STUDY_FILES}: compare_with={COMPARE_WITH}: {other} holds no runs; run that study first")
    return []

# What the tuning rules (tune.smk) need: its runs, jobs and checks. Included only for a study with a
# `tuning` section (docs/tuning.md).
import sys

from fedfactor.config import load_config

TUNE_DIR = f"{STUDY_DIR}/tuning"
TUNE_SEEDS = [int(s) for s in TUNING["seeds"]]
# (method, point) pairs, `runs_per_job` of them to a job, like the training jobs
TUNE_PAIRS = [(m, i) for m in METHODS for i in range(TUNING["points"])]
TUNE_JOBS = [TUNE_PAIRS[i : i + PER_JOB] for i in range(0, len(TUNE_PAIRS), PER_JOB)]
# "tuning-" first: the MLflow UI's list cuts long names, and the study's own and its tuning's would
# read the same there if they differed only at the end
TUNING_EXPERIMENT = f"tuning-{MLFLOW_EXPERIMENT}"


if workflow.is_main_process:
    try:
        # every point of every method, each loaded as its run will be
        for _s in SCENARIOS:
            tuning.check_runs_alike({f"{m}@{tuning.point_name(i)} in {_s}": load_config(RUN_CONFIG, train_sets(_s, m, TUNE_SEEDS[0], e, m))
                                     for m in METHODS for i, e in enumerate(tuning_entries(config, _s, m))})
    except UsageError as e:
        stop(f"{STUDY_FILES}: {e}")


def tune_job_runs(wildcards):
    """The tuning runs of one job: each a point of a method's grid, in its own folder, labelled
    METHOD@pI in MLflow (the tuning experiment)."""
    out = []
    for m, i in TUNE_JOBS[int(wildcards.job) - 1]:
        run = f"{wildcards.scenario}/{m}/{tuning.point_name(i)}/seed{wildcards.seed}"
        entry = tuning_entries(config, wildcards.scenario, m)[i]
        out.append({"out": f"{TUNE_DIR}/runs/{run}", "log": f"{TUNE_DIR}/logs/{run}.log",
                    "set": method_sets(entry, f"{m}@{tuning.point_name(i)}")})
    return json.dumps(out)


def tune_select_spec(wildcards):
    """What tune_select needs of the study, as JSON: its tuning section, scenarios, methods, rounds."""
    return json.dumps({
        "study": config["study"], "tuning": TUNING, "scenarios": SCENARIOS, "methods": METHODS,
        "rounds": tuned_rounds()})


# The command that asked for the tuning, for the chosen values' provenance. It reaches tune_select
# (a local rule, a child of this process) through the environment, not its params: a params change
# would re-run the selection whenever the command line differs.
if workflow.is_main_process:
    os.environ[tuning.COMMAND_VARIABLE] = " ".join(["snakemake", *map(shlex.quote, sys.argv[1:])])

from pathlib import Path


rule mlflow_init:
    """Create the MLflow store and experiment once, so parallel training jobs never race to."""
    output:
        f"{RESULTS}/mlflow/{STUDY_FOLDER}.experiment_id",
    params:
        uri=MLFLOW_URI,
        experiment=MLFLOW_EXPERIMENT,
    log:
        f"{STUDY_DIR}/logs/mlflow_init.log",
    benchmark:
        f"{STUDY_DIR}/benchmarks/mlflow_init.tsv"
    conda:
        CONDA_ENV
    shell:
        "fedfactor mlflow-init --uri {params.uri:q} --experiment {params.experiment:q} --out {output:q} > {log:q} 2>&1"


# A training job's command (the train rule's and tune.smk's): its runs in one process.
TRAIN_COMMAND = (
    "OMP_NUM_THREADS={threads} fedfactor train-runs --threads {threads} --config {input.run_config:q} {params.sets}"
    " --set seed={wildcards.seed} --set partition.file={input.partition:q}"
    " --set tracking.uri={params.uri:q} --set tracking.experiment_id=$(cat {input.experiment:q})"
    " --runs {params.runs:q} --done {output:q} --gpus {resources.gpu}"
)


rule train:
    """The runs of one scenario and seed, `runs_per_job` methods of it (JOB_METHODS), one after another
    in one process: Python, torch and MLflow start once per job. Each run keeps its folder (resume from
    its checkpoint; a finished one is skipped) and its own log; the job's output is a marker written
    once all of them have finished. With `gpus_per_job` > 0 it claims that many GPUs no other job holds
    (`--resources gpu=K` caps how many run at once); under SLURM it keeps the GPUs SLURM gave it."""
    input:
        partition=f"{STUDY_DIR}/partitions/{{scenario}}/seed{{seed}}.json",
        experiment=rules.mlflow_init.output[0],
        run_config=RUN_CONFIG,
        tuned=tuned_or_stop,
    output:
        f"{STUDY_DIR}/jobs/train/{{scenario}}/seed{{seed}}-{{job}}.json",
    params:
        sets=scenario_set_options,
        runs=job_runs,
        uri=MLFLOW_URI,
        study=lambda w, output: str(Path(output[0]).parents[3]),  # STUDY/jobs/train/SCENARIO/seedN-J.json
        # failed_runs: record: a run that fails is a result (its failed.json), not the job's failure
        failed=lambda w: "--allow-failed" if config["failed_runs"] == "record" else "",
    threads: config["threads_per_job"]
    # One seed of every (scenario, method) cell first, then the next seed: the first complete table
    # (live.md) appears after a fraction of the study.
    priority: lambda w: len(SEEDS) - SEEDS.index(int(w.seed))
    resources:
        gpu=config["gpus_per_job"],
    log:
        f"{STUDY_DIR}/logs/train/{{scenario}}/seed{{seed}}-{{job}}.log",
    benchmark:
        f"{STUDY_DIR}/benchmarks/train/{{scenario}}/seed{{seed}}-{{job}}.tsv"
    conda:
        CONDA_ENV
    # stdout, one line per finished run (its accuracy, time, the study's runs left and ETA), goes to
    # the terminal; each run's log is logs/train/SCENARIO/METHOD/seedN.log, appended to by every
    # attempt (an interrupted one's "checkpoint written" stays above the resumed one's lines).
    # study.smk's train_sets gives the DAG build's checks the same `--set`s in the same order: change
    # both together (tests/study/test_workflow.py compares them).
    shell:
        f"{TRAIN_COMMAND} --study {{params.study:q}} {{params.failed}} 2> {{log:q}}"

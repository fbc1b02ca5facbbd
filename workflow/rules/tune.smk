# Tuning on validation data (docs/tuning.md): every method of the study trains each point of its grid
# (the study's `tuning` section, the same number of points for every method) on the tuning seeds;
# tune_select keeps the point with the best validation score per scenario and method, and writes it
# with its provenance to `tuning.file`, which the study's final runs read. `snakemake tune` runs it;
# `all` never does.
include: "tune_common.smk"


localrules:
    mlflow_init_tuning,
    tune_select,


rule mlflow_init_tuning:
    """The tuning runs' MLflow experiment (tuning-<the study's>), created once like the study's."""
    output:
        f"{RESULTS}/mlflow/{STUDY_FOLDER}-tuning.experiment_id",
    params:
        uri=MLFLOW_URI,
        experiment=TUNING_EXPERIMENT,
    log:
        f"{STUDY_DIR}/logs/mlflow_init_tuning.log",
    conda:
        CONDA_ENV
    shell:
        "fedfactor mlflow-init --uri {params.uri:q} --experiment {params.experiment:q} --out {output:q} > {log:q} 2>&1"


rule tune_train:
    """Tuning runs of one scenario and seed, as the train rule trains the study's runs; a run that
    fails (a diverged learning rate) is a result: its point is never chosen."""
    input:
        partition=f"{STUDY_DIR}/partitions/{{scenario}}/seed{{seed}}.json",
        experiment=rules.mlflow_init_tuning.output[0],
        run_config=RUN_CONFIG,
    output:
        f"{TUNE_DIR}/jobs/{{scenario}}/seed{{seed}}-{{job}}.json",
    params:
        sets=scenario_set_options,
        runs=tune_job_runs,
        uri=MLFLOW_URI,
    threads: config["threads_per_job"]
    resources:
        gpu=config["gpus_per_job"],
    log:
        f"{TUNE_DIR}/logs/jobs/{{scenario}}/seed{{seed}}-{{job}}.log",
    benchmark:
        f"{TUNE_DIR}/benchmarks/{{scenario}}/seed{{seed}}-{{job}}.tsv"
    conda:
        CONDA_ENV
    shell:
        f"{TRAIN_COMMAND} --allow-failed 2> {{log:q}}"


rule tune_select:
    """The best point per scenario and method on validation, written with every point's score, the
    commit and the command to the study's tuning.file (in the repository: commit it)."""
    input:
        expand(f"{TUNE_DIR}/jobs/{{scenario}}/seed{{seed}}-{{job}}.json", scenario=SCENARIOS, seed=TUNE_SEEDS,
               job=range(1, len(TUNE_JOBS) + 1)),
    output:
        # The record in the results folder makes `snakemake tune` a target of the tuning runs: with only
        # the committed file as output, a fresh clone would find it present and tune nothing.
        record=f"{TUNE_DIR}/chosen.yaml",
        file=TUNING["file"],
    params:
        study=tune_select_spec,
        runs=f"{TUNE_DIR}/runs",
    log:
        f"{STUDY_DIR}/logs/tune_select.log",
    conda:
        CONDA_ENV
    shell:
        "fedfactor tune-select --study {params.study:q} --runs {params.runs:q} --jobs {input:q}"
        " --out {output.record:q} {output.file:q} 2> {log:q}"


rule tune:
    """`snakemake tune`: tune every method of the study on validation (its own target)."""
    input:
        rules.tune_select.output,

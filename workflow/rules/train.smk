rule mlflow_init:
    """Create the MLflow store and experiment once, so parallel training jobs never race to."""
    output:
        f"{RESULTS}/mlflow/{config['study']}.experiment_id",
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


rule train:
    """One federated run: scenario x method x seed. With `gpus_per_job` > 0 it claims that many GPUs
    no other job holds (`--resources gpu=K` caps how many run at once); under SLURM it keeps the GPUs
    SLURM gave it."""
    input:
        partition=f"{STUDY_DIR}/partitions/{{scenario}}/seed{{seed}}.json",
        experiment=rules.mlflow_init.output[0],
        run_config=RUN_CONFIG,
    output:
        summary=f"{STUDY_DIR}/runs/{{scenario}}/{{method}}/seed{{seed}}/summary.json",
        metrics=f"{STUDY_DIR}/runs/{{scenario}}/{{method}}/seed{{seed}}/metrics.csv",
    params:
        sets=train_sets,
        out=lambda w, output: os.path.dirname(output.summary),
        uri=MLFLOW_URI,
    threads: config["threads_per_job"]
    resources:
        gpu=config["gpus_per_job"],
    log:
        f"{STUDY_DIR}/logs/train/{{scenario}}/{{method}}/seed{{seed}}.log",
    benchmark:
        f"{STUDY_DIR}/benchmarks/train/{{scenario}}/{{method}}/seed{{seed}}.tsv"
    conda:
        CONDA_ENV
    shell:
        "OMP_NUM_THREADS={threads} fedfactor train --config {input.run_config:q} {params.sets}"
        " --set seed={wildcards.seed} --set partition.file={input.partition:q}"
        " --set tracking.uri={params.uri:q} --set tracking.experiment_id=$(cat {input.experiment:q})"
        " --gpus {resources.gpu} --out {params.out:q} > {log:q} 2>&1"

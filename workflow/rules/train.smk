from pathlib import Path


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
        study=lambda w, output: str(Path(output.summary).parents[4]),  # STUDY/runs/SCENARIO/METHOD/seedN/
    threads: config["threads_per_job"]
    # One seed of every (scenario, method) cell first, then the next seed: the first complete table
    # (live.md) appears after a fraction of the study.
    priority: lambda w: len(SEEDS) - SEEDS.index(int(w.seed))
    resources:
        gpu=config["gpus_per_job"],
    log:
        f"{STUDY_DIR}/logs/train/{{scenario}}/{{method}}/seed{{seed}}.log",
    benchmark:
        f"{STUDY_DIR}/benchmarks/train/{{scenario}}/{{method}}/seed{{seed}}.tsv"
    conda:
        CONDA_ENV
    # Snakemake deletes a job's log before the job starts: the lines of an interrupted attempt (its
    # "checkpoint written" note) are kept in the run folder's attempts.log and open the resumed job's
    # log. A finished run prints its line for the terminal and updates live.md (fedfactor progress).
    shell:
        "cat {params.out:q}/attempts.log > {log:q} 2>/dev/null || true; "
        "OMP_NUM_THREADS={threads} fedfactor train --threads {threads} --config {input.run_config:q} {params.sets}"
        " --set seed={wildcards.seed} --set partition.file={input.partition:q}"
        " --set tracking.uri={params.uri:q} --set tracking.experiment_id=$(cat {input.experiment:q})"
        " --gpus {resources.gpu} --out {params.out:q} >> {log:q} 2>&1"
        " || {{ status=$?; mkdir -p {params.out:q}; cp {log:q} {params.out:q}/attempts.log; exit $status; }}; "
        "rm -f {params.out:q}/attempts.log; "
        "fedfactor progress {params.out:q} --study {params.study:q} --elapsed $SECONDS"

rule prepare_data:
    """Download (if needed) and verify a dataset against its checksums; its statistics go to a small
    JSON file. Local: compute nodes of a cluster need no internet."""
    output:
        f"{RESULTS}/data/{{dataset}}.json",
    params:
        name=lambda w: DATASET_NAMES[w.dataset],
        root=config["data_root"],
    log:
        f"{RESULTS}/logs/prepare_data/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/prepare_data/{{dataset}}.tsv"
    conda:
        CONDA_ENV
    shell:
        "fedfactor prepare-data --dataset {params.name:q} --root {params.root:q} --out {output:q} > {log:q} 2>&1"


# Each scenario's partition as the `--set`s that define it and nothing else (not the run config's
# file, rounds or method), so changing those keeps the partitions and the runs that use them.
PARTITION_SETS = {s: _quoted(partition_sets(RUN_CONFIG, OVERRIDES[s], config["data_root"])) for s in SCENARIOS}


rule partition:
    """Split the dataset among clients for one scenario and seed (a JSON file of index lists), shared by
    every method of the study."""
    input:
        data=lambda w: f"{RESULTS}/data/{slug(DATASETS[w.scenario])}.json",
    output:
        f"{STUDY_DIR}/partitions/{{scenario}}/seed{{seed}}.json",
    # Before any training run: each takes seconds, and with a lower priority than the training runs
    # (train.smk) a seed-0 partition waited for seed-1 runs whose partition happened to be ready.
    priority: len(SEEDS) + 1
    params:
        sets=lambda w: PARTITION_SETS[w.scenario],
    log:
        f"{STUDY_DIR}/logs/partition/{{scenario}}/seed{{seed}}.log",
    benchmark:
        f"{STUDY_DIR}/benchmarks/partition/{{scenario}}/seed{{seed}}.tsv"
    conda:
        CONDA_ENV
    shell:
        "fedfactor partition {params.sets} --set seed={wildcards.seed}"
        " --out {output:q} > {log:q} 2>&1"

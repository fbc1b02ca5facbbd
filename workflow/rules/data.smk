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


rule partition:
    """Split the dataset among clients for one scenario and seed (a JSON file of index lists), shared by
    every method of the study."""
    input:
        data=lambda w: f"{RESULTS}/data/{slug(DATASETS[w.scenario])}.json",
        run_config=RUN_CONFIG,
    output:
        f"{STUDY_DIR}/partitions/{{scenario}}/seed{{seed}}.json",
    params:
        sets=scenario_sets,
    log:
        f"{STUDY_DIR}/logs/partition/{{scenario}}/seed{{seed}}.log",
    benchmark:
        f"{STUDY_DIR}/benchmarks/partition/{{scenario}}/seed{{seed}}.tsv"
    conda:
        CONDA_ENV
    shell:
        "fedfactor partition --config {input.run_config:q} {params.sets} --set seed={wildcards.seed}"
        " --out {output:q} > {log:q} 2>&1"

rule table:
    """Mean +- std over seeds per scenario and method, as markdown and csv."""
    input:
        expand(
            f"{STUDY_DIR}/runs/{{scenario}}/{{method}}/seed{{seed}}/summary.json",
            scenario=SCENARIOS,
            method=METHODS,
            seed=SEEDS,
        ),
    output:
        md=f"{STUDY_DIR}/table.md",
        csv=f"{STUDY_DIR}/table.csv",
    params:
        title=f"fedfactor study '{config['study']}'",
    log:
        f"{STUDY_DIR}/logs/table.log",
    shell:
        "fedfactor table {input:q} --out-md {output.md:q} --out-csv {output.csv:q} --title {params.title:q} > {log:q} 2>&1"


rule curves:
    """Mean client accuracy per round, one panel per scenario, one line per method (+-std over seeds)."""
    input:
        expand(
            f"{STUDY_DIR}/runs/{{scenario}}/{{method}}/seed{{seed}}/metrics.csv",
            scenario=SCENARIOS,
            method=METHODS,
            seed=SEEDS,
        ),
    output:
        f"{STUDY_DIR}/curves.png",
    params:
        runs=lambda w, input: [os.path.join(os.path.dirname(f), "summary.json") for f in input],
        title=f"fedfactor study '{config['study']}'",
    log:
        f"{STUDY_DIR}/logs/curves.log",
    shell:
        "fedfactor curves {params.runs:q} --out {output:q} --title {params.title:q} > {log:q} 2>&1"


rule diagnose:
    """Factor analysis of every run's client weights (FedFac's shared/personal split, for every
    method) and FedFac's split history; numbers and figures also go to each run's MLflow run."""
    input:
        # summary.json only: the training job that writes it also writes client_weights.npz and
        # diagnostics/, and a run without them is listed as skipped, not an error
        expand(
            f"{STUDY_DIR}/runs/{{scenario}}/{{method}}/seed{{seed}}/summary.json",
            scenario=SCENARIOS,
            method=METHODS,
            seed=SEEDS,
        ),
    output:
        md=f"{STUDY_DIR}/diagnostics/diagnostics.md",
        csv=f"{STUDY_DIR}/diagnostics/diagnostics.csv",
        communalities=f"{STUDY_DIR}/diagnostics/communalities.png",
        eigenvalues=f"{STUDY_DIR}/diagnostics/eigenvalues.png",
    params:
        out=lambda w, output: os.path.dirname(output.md),
        uri=MLFLOW_URI,
    threads: config["threads_per_job"]
    log:
        f"{STUDY_DIR}/logs/diagnose.log",
    benchmark:
        f"{STUDY_DIR}/benchmarks/diagnose.tsv"
    shell:
        "OMP_NUM_THREADS={threads} fedfactor diagnose {input:q} --out {params.out:q} --uri {params.uri:q}"
        " > {log:q} 2>&1"

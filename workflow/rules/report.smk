# Tables, claim verdicts, figures and diagnostics of a study; each also goes into the HTML report
# (`snakemake --configfile ... --report results/<study>/report.html`).


rule study_spec:
    """What the report steps need to know about the study (title, scenarios, methods and which are not
    implemented yet, the paper mapping, the claims), checked and written as one JSON file."""
    output:
        f"{STUDY_DIR}/study.json",
    params:
        # a function: Snakemake would read braces in a plain string (Lambda={1}) as wildcards
        spec=lambda w: json.dumps(SPEC),
    log:
        f"{STUDY_DIR}/logs/study_spec.log",
    benchmark:
        f"{STUDY_DIR}/benchmarks/study_spec.tsv"
    conda:
        CONDA_ENV
    shell:
        "fedfactor study-spec --json {params.spec:q} --out {output:q} > {log:q} 2>&1"


rule table:
    """Mean +- std [95 % t interval] over seeds per scenario and method."""
    input:
        study=rules.study_spec.output[0],
        runs=train_jobs(),
    output:
        md=f"{STUDY_DIR}/tables/table.md",
        csv=f"{STUDY_DIR}/tables/table.csv",
        tex=f"{STUDY_DIR}/tables/table.tex",
        html=report(
            f"{STUDY_DIR}/tables/table.html",
            caption="../report/table.rst",
            category="Tables",
            labels={"table": "results"},
        ),
    params:
        runs=runs("summary.json"),
        not_implemented=NOT_IMPLEMENTED,  # the caption names them
        title=lambda w: TITLE,
    log:
        f"{STUDY_DIR}/logs/table.log",
    benchmark:
        f"{STUDY_DIR}/benchmarks/table.tsv"
    conda:
        CONDA_ENV
    shell:
        "fedfactor table {params.runs:q} --study {input.study:q} --out-md {output.md:q} --out-csv {output.csv:q}"
        " --out-html {output.html:q} --out-tex {output.tex:q} --title {params.title:q} > {log:q} 2>&1"


rule paper_tables:
    """The paper's tables in its layout: ours (mean +- std [CI], n) beside the paper's number and the difference."""
    input:
        study=rules.study_spec.output[0],
        runs=train_jobs(),
    output:
        md=f"{STUDY_DIR}/tables/paper.md",
        csv=f"{STUDY_DIR}/tables/paper.csv",
        tex=f"{STUDY_DIR}/tables/paper.tex",
        html=report(
            f"{STUDY_DIR}/tables/paper.html",
            caption="../report/paper.rst",
            category="Tables",
            labels={"table": "paper vs ours"},
        ),
    params:
        runs=runs("summary.json"),
        not_implemented=NOT_IMPLEMENTED,  # the caption names them
        out=lambda w, output: os.path.dirname(output.md),
    log:
        f"{STUDY_DIR}/logs/paper_tables.log",
    benchmark:
        f"{STUDY_DIR}/benchmarks/paper_tables.tsv"
    conda:
        CONDA_ENV
    shell:
        "fedfactor paper-tables {params.runs:q} --study {input.study:q} --out {params.out:q} > {log:q} 2>&1"


rule claims:
    """Each qualitative claim of the paper, tested on our runs: reproduced, not reproduced, within noise or not run
    (or needs paper scale, for a claim taken from a paper study); comparisons.csv holds each comparison as numbers."""
    input:
        study=rules.study_spec.output[0],
        runs=train_jobs(),
    output:
        md=f"{STUDY_DIR}/claims/claims.md",
        csv=f"{STUDY_DIR}/claims/claims.csv",
        comparisons=f"{STUDY_DIR}/claims/comparisons.csv",
        html=report(
            f"{STUDY_DIR}/claims/claims.html",
            caption="../report/claims.rst",
            category="Claims",
            labels={"claims": "verdicts"},
        ),
    params:
        runs=runs("summary.json"),
        not_implemented=NOT_IMPLEMENTED,  # the caption names them
        out=lambda w, output: os.path.dirname(output.md),
    log:
        f"{STUDY_DIR}/logs/claims.log",
    benchmark:
        f"{STUDY_DIR}/benchmarks/claims.tsv"
    conda:
        CONDA_ENV
    shell:
        "fedfactor claims {params.runs:q} --study {input.study:q} --out {params.out:q} > {log:q} 2>&1"


rule figures:
    """Accuracy against rounds, bytes and wall-clock time, per-client accuracy, and, where the runs hold them,
    similarity heatmaps, matching frequencies and the per-round spread of the similarities matched on
    against tau, FedDecomp's sigma/tau and E_lora figures (PNG + PDF)."""
    input:
        study=rules.study_spec.output[0],
        runs=train_jobs(),
    output:
        report(
            directory(f"{STUDY_DIR}/figures"),
            patterns=["{name}.png"],
            caption="../report/figures.rst",
            category="Figures",
            labels={"figure": "{name}"},
        ),
    params:
        runs=runs("summary.json"),
        title=lambda w: TITLE,
        smoke="--smoke" if SMOKE else "",
    log:
        f"{STUDY_DIR}/logs/figures.log",
    benchmark:
        f"{STUDY_DIR}/benchmarks/figures.tsv"
    conda:
        CONDA_ENV
    shell:
        "fedfactor figures {params.runs:q} --out {output:q} --title {params.title:q} {params.smoke} > {log:q} 2>&1"


rule diagnose:
    """Factor analysis of every run's client weights (FedFac's shared/personal split, for every
    method) and FedFac's split history; numbers and figures also go to each run's MLflow run."""
    input:
        train_jobs(),
    output:
        md=f"{STUDY_DIR}/diagnostics/diagnostics.md",
        csv=f"{STUDY_DIR}/diagnostics/diagnostics.csv",
        # communalities and eigenvalues always; FedFac's split history and stability with a FedFac run
        figures=report(
            directory(f"{STUDY_DIR}/diagnostics/figures"),
            patterns=["{name}.png"],
            caption="../report/diagnostics.rst",
            category="Factor-analysis diagnostics",
            labels={"figure": "{name}"},
        ),
    params:
        # summary.json only: the run that writes it also writes client_weights.npz and diagnostics/,
        # and a run without them is listed as skipped, not an error
        runs=runs("summary.json"),
        out=lambda w, output: os.path.dirname(output.md),
        uri=MLFLOW_URI,
    threads: config["threads_per_job"]
    log:
        f"{STUDY_DIR}/logs/diagnose.log",
    benchmark:
        f"{STUDY_DIR}/benchmarks/diagnose.tsv"
    conda:
        CONDA_ENV
    shell:
        "OMP_NUM_THREADS={threads} fedfactor diagnose {params.runs:q} --out {params.out:q} --figures {output.figures:q}"
        " --uri {params.uri:q}"
        " > {log:q} 2>&1"



rule compare:
    """This study's reported accuracy against another study's, per scenario and method, paired over
    the seeds both ran (docs/workflow.md, "Comparing two studies")."""
    input:
        compare_with_or_stop,
        runs=train_jobs(),
    output:
        md=f"{COMPARE_DIR}/compare.md",
        csv=f"{COMPARE_DIR}/compare.csv",
        png=f"{COMPARE_DIR}/compare.png",
    params:
        runs=runs("summary.json"),
        against=lambda w: os.path.join(RESULTS, COMPARE_WITH, "runs"),
        names=lambda w: [STUDY_FOLDER, COMPARE_WITH],
        out=lambda w, output: os.path.dirname(output.md),
    log:
        f"{STUDY_DIR}/logs/compare_{COMPARE_WITH or 'none'}.log",
    conda:
        CONDA_ENV
    shell:
        "fedfactor compare {params.runs:q} --against {params.against:q} --names {params.names:q}"
        " --out {params.out:q} > {log:q} 2>&1 && tail -n 1 {log:q}"

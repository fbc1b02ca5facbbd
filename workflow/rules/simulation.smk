# FedFac's simulation study (paper 001, section 4.3, Figures 6 and 7): synthetic data, no dataset.
# A study of its own (config/studies/fedfac_simulation.yaml: `simulation:` names its config, and
# `overrides` go to it), or, next to any other study, `snakemake --cores 2 simulate` with the default
# config into results/simulation/fedfac.
SIMULATION_CONFIG = config.get("simulation") or "config/simulation/fedfac.yaml"
SIMULATION_DIR = (f"{config['results']}/{config['study']}" if config.get("simulation")
                  else f"{config['results']}/simulation/fedfac")
SIMULATION_SETS = " ".join(f"--set {shlex.quote(s)}" for s in run_sets(config.get("overrides") or {}))


rule simulate:
    """Five decompositions of a hidden layer (true, oracle, static, dynamic, random) on FedFac's
    simulated clients: accuracy table, Figure 6 (accuracy per round) and Figure 7 (dynamic FedFac's
    split stability)."""
    input:
        SIMULATION_CONFIG,
    output:
        csv=f"{SIMULATION_DIR}/simulation.csv",
        md=f"{SIMULATION_DIR}/simulation.md",
        html=report(
            f"{SIMULATION_DIR}/simulation.html",
            caption="../report/simulation.rst",
            category="Tables",
            labels={"table": "simulation"},
        ),
        rounds=f"{SIMULATION_DIR}/rounds.csv",
        figure6=report(
            f"{SIMULATION_DIR}/figure6.png",
            caption="../report/simulation.rst",
            category="Figures",
            labels={"figure": "figure6"},
        ),
        figure7=report(
            f"{SIMULATION_DIR}/figure7.png",
            caption="../report/simulation.rst",
            category="Figures",
            labels={"figure": "figure7"},
        ),
    params:
        out=lambda w, output: os.path.dirname(output.csv),
        sets=SIMULATION_SETS,
    threads: 2
    log:
        f"{SIMULATION_DIR}/logs/simulate.log",
    benchmark:
        f"{SIMULATION_DIR}/benchmarks/simulate.tsv"
    conda:
        CONDA_ENV
    shell:
        "OMP_NUM_THREADS={threads} fedfactor simulate --config {input:q} {params.sets} --out {params.out:q} > {log:q} 2>&1"

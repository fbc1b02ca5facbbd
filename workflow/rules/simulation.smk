# FedFac's simulation study (paper 001, section 4.3, Figures 6 and 7): synthetic data, no dataset.
# Not part of `all`: run it with `snakemake --cores 2 simulate`.
SIMULATION_CONFIG = "config/simulation/fedfac.yaml"
SIMULATION_DIR = f"{RESULTS}/simulation/fedfac"


rule simulate:
    """Five decompositions of a hidden layer (true, oracle, static, dynamic, random) on FedFac's
    simulated clients: accuracy table, Figure 6 (accuracy per round) and Figure 7 (dynamic FedFac's
    split stability)."""
    input:
        SIMULATION_CONFIG,
    output:
        csv=f"{SIMULATION_DIR}/simulation.csv",
        md=f"{SIMULATION_DIR}/simulation.md",
        rounds=f"{SIMULATION_DIR}/rounds.csv",
        figure6=f"{SIMULATION_DIR}/figure6.png",
        figure7=f"{SIMULATION_DIR}/figure7.png",
    params:
        out=lambda w, output: os.path.dirname(output.csv),
    threads: 2
    log:
        f"{SIMULATION_DIR}/logs/simulate.log",
    benchmark:
        f"{SIMULATION_DIR}/benchmarks/simulate.tsv"
    shell:
        "OMP_NUM_THREADS={threads} fedfactor simulate --config {input:q} --out {params.out:q} > {log:q} 2>&1"

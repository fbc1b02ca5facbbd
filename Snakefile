# fedfactor workflow: data -> partition -> train (scenario x method x seed) -> diagnostics -> tables,
# claims, figures -> report. Logic lives in the fedfactor package; each rule is one CLI call with a log
# and a benchmark file.
from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

from fedfactor.errors import UsageError
from fedfactor.study.workflow import check_config_files, check_required_keys, schema_problem, stop

min_version("8.0")


# The config files given, read strictly, before the default study could be merged into them.
try:
    check_config_files(workflow.overwrite_configfiles or ["config/config.yaml"])
except UsageError as e:
    stop(e)

# The default study, unless a study is given with --configfile (Snakemake would otherwise merge the
# two, and the default's scenarios and methods would leak into every paper study).
if "study" not in config:

    configfile: "config/config.yaml"


# what was merged into `config`, the study file first: every message about the study names it
STUDY_FILES = ", ".join(map(str, workflow.configfiles)) + (" and --config" if workflow.config_settings.config else "")
try:
    check_required_keys(config)
    validate(config, "workflow/schemas/config.schema.yaml", set_default=True)
except UsageError as e:
    stop(f"{STUDY_FILES}: {e}")
except WorkflowError as e:
    stop(f"{STUDY_FILES}: {schema_problem(e)}")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


if config.get("simulation"):  # FedFac's simulation study: no data, no runs

    include: "workflow/rules/simulation.smk"

    rule all:
        input:
            rules.simulate.output,

else:

    include: "workflow/rules/study.smk"
    include: "workflow/rules/data.smk"
    include: "workflow/rules/train.smk"
    include: "workflow/rules/report.smk"
    include: "workflow/rules/simulation.smk"  # `snakemake simulate`; not part of `all`

    if TUNING:  # `snakemake tune`; not part of `all`

        include: "workflow/rules/tune.smk"

    wildcard_constraints:
        scenario="|".join(map(re.escape, SCENARIOS)),
        method="|".join(map(re.escape, METHODS)),
        seed=r"\d+",
        job=r"\d+",

    # Small rules run where Snakemake runs, also under a cluster profile: the download needs the
    # internet, the others take seconds (a queue wait would cost more).
    localrules:
        prepare_data,
        partition,
        mlflow_init,
        study_spec,
        table,
        paper_tables,
        claims,
        figures,

    rule all:
        input:
            study_targets(),

    # The terminal of a run: one line per finished training run (`fedfactor progress`, called by the
    # train rule) instead of Snakemake's per-job blocks, unless --verbose or --printshellcmds asks for
    # them; live.md holds the table so far; after Ctrl-C or a failed job, the very last lines say what
    # is done and how to resume.
    import atexit
    import sys

    from snakemake.logging import logger

    from fedfactor.study.progress import finished_message, quiet_terminal, start_message, stopped_message, write_plan

    quiet_terminal(logger, workflow)

    onstart:
        if tuning_asked():
            print(f"fedfactor: tuning {len(TUNE_PAIRS) * len(SCENARIOS) * len(TUNE_SEEDS)} runs ({len(METHODS)} "
                  f"methods x {TUNING['points']} points x {len(SCENARIOS)} scenarios x {len(TUNE_SEEDS)} seed(s)) on "
                  f"validation; one line per finished run below; the chosen values go to {TUNING['file']}", flush=True)
        else:
            write_plan(STUDY_DIR, [f"{s}/{m}/seed{seed}" for s in SCENARIOS for m in METHODS for seed in SEEDS],
                       sys.argv, title=TITLE)
            print(start_message(STUDY_DIR), flush=True)

    onsuccess:
        if tuning_asked():
            # the study just tuned, with the files that gave it (a bare command would run the default study)
            files = [shlex.quote(str(f)) for f in workflow.overwrite_configfiles or []]
            again = " ".join(["snakemake --cores all", *(["--configfile", *files] if files else [])])
            print(f"fedfactor: tuned; the chosen values and every point's validation score are in {TUNING['file']} "
                  f"(commit it); `{again}` then runs the study with them", flush=True)
        else:
            print(finished_message(STUDY_DIR, rules.table.output.md, MLFLOW_URI), flush=True)

    onerror:
        # registered now, printed at exit: after Snakemake's own closing lines
        if tuning_asked():
            message = "fedfactor: tuning stopped; the finished tuning runs are kept: run the same command to go on"
        else:  # a dataset that could not be prepared is named: the same command alone will not get past it
            data = [(f"{RESULTS}/logs/prepare_data/{d}.log", f"{RESULTS}/data/{d}.json") for d in DATASET_NAMES]
            message = stopped_message(STUDY_DIR, data)
        atexit.register(print, message, file=sys.stderr, flush=True)

# fedfactor workflow: data -> partition -> train (scenario x method x seed) -> results table.
# Logic lives in the fedfactor package; each rule is one CLI call with a log.
from snakemake.utils import min_version, validate

min_version("8.0")


# The default study, unless a study is given with --configfile (Snakemake would otherwise merge the
# two, and the default's scenarios and methods would leak into every paper study).
if "study" not in config:

    configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml", set_default=True)


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/simulation.smk"  # `snakemake simulate`; not part of `all`


rule all:
    input:
        f"{STUDY_DIR}/table.md",
        f"{STUDY_DIR}/table.csv",
        f"{STUDY_DIR}/curves.png",
        f"{STUDY_DIR}/diagnostics/diagnostics.md",

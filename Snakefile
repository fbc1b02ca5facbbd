# fedfactor workflow: data -> partition -> train (scenario x method x seed) -> results table.
# Logic lives in the fedfactor package; each rule is one CLI call with a log.
from snakemake.utils import min_version, validate

min_version("8.0")


configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml", set_default=True)


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        f"{STUDY_DIR}/table.md",
        f"{STUDY_DIR}/table.csv",

import json
import re
import shlex
import sys
from pathlib import Path

from snakemake.settings.types import DeploymentMethod

from fedfactor.study import tuning
from fedfactor.config import load_config
from fedfactor.report.spec import SMOKE_TITLE
from fedfactor.study.plan import check_run_memory, snakemake_retries
from fedfactor.study.workflow import (checked_runs, check_results_folder, check_runs, check_study, dataset_name,
                                      final_entry, implemented, method_sets, partition_sets, run_sets, scenario_overrides,
                                      scenario_sets, seed_sets, selected, slug, study_folder, study_spec, tuning_entries,
                                      tuning_file)

# Under `--sdm conda` jobs run in envs/fedfactor.yaml, which holds the dependencies but not fedfactor
# itself: there `fedfactor` runs this checkout's src/ (Snakemake strips PYTHONPATH from the job's
# environment, so it is set in the command).
CONDA_ENV = "../../envs/fedfactor.yaml"
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    shell.prefix(f"set -euo pipefail; export PYTHONPATH={shlex.quote(os.path.join(workflow.basedir, 'src'))}; "
                 'fedfactor() {{ python -m fedfactor "$@"; }}; ')

RESULTS = config["results"]
try:
    check_results_folder(RESULTS)
except UsageError as e:
    stop(f"{STUDY_FILES}: {e}")

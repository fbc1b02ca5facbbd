"""The probe of bad inputs (probes/inputs.py) as tests: one test per input class, one case per input.

Each fedfactor case runs in-process through `fedfactor.cli.main`, in a fresh folder that is the
working directory, and must end cleanly: the expected exit status (2; 1 for a run that started and
then kept no update), the last line of stderr the one `fedfactor: error:` (or `run failed:`) line,
and nothing written. A case that would hang fails after 60 s (SIGALRM) instead, and one that would
allocate tens of GiB meets an address-space limit. `python -m probes.inputs` runs the same table as
separate processes, under load if asked, and counts the outcomes.
"""

import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # bad-input probes, each in a subprocess

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # probes/ sits beside src/ and is not installed
    sys.path.insert(0, str(REPO))

from probes import inputs as probe  # noqa: E402

READONLY = probe.can_make_readonly()  # root without the right to mount cannot make a folder read-only
FULL = READONLY  # a full file system is a tmpfs mount too


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    with probe.readonly_folder(root) as readonly, probe.full_folder(root) as full:
        yield probe.Templates(probe.build_templates(root / "templates"), readonly, full)


def cases_of(klass, only=None):
    cases = [c for c in probe.select([klass]) if (READONLY or not c.needs_readonly) and (FULL or not c.needs_full)]
    if only is not None:
        cases = [c for c in cases if c.id.split("/", 1)[1] in only]
        assert len(cases) == len(only), only
    return pytest.mark.parametrize("case", cases, ids=[c.id.split("/", 1)[1] for c in cases])


def assert_clean(case, folder, templates):
    r = probe.run_in_process(case, folder, templates)
    assert r.outcome == "clean", (f"{case.id}: {r.outcome} (exit {r.status}, expected {case.expect}): "
                                  f"{r.last_line!r}; new paths {r.new_paths[:5]}")


@cases_of(probe.CONFIG)
def test_config_values(case, tmp_path, templates):
    assert_clean(case, tmp_path / "case", templates)


@cases_of(probe.YAML)
def test_yaml_files(case, tmp_path, templates):
    assert_clean(case, tmp_path / "case", templates)


@cases_of(probe.OUT)
def test_output_paths(case, tmp_path, templates):
    assert_clean(case, tmp_path / "case", templates)


@cases_of(probe.PARTITION)
def test_partition_files(case, tmp_path, templates):
    assert_clean(case, tmp_path / "case", templates)


@cases_of(probe.NPZ)
def test_npz_data(case, tmp_path, templates):
    assert_clean(case, tmp_path / "case", templates)


@cases_of(probe.RUNFILES)
def test_damaged_run_files(case, tmp_path, templates):
    assert_clean(case, tmp_path / "case", templates)


@cases_of(probe.WEIGHTS)
def test_client_weights(case, tmp_path, templates):
    assert_clean(case, tmp_path / "case", templates)


@cases_of(probe.IMPORT)
def test_mlflow_import_folders(case, tmp_path, templates):
    assert_clean(case, tmp_path / "case", templates)


@cases_of(probe.PREPARE)
def test_prepare_data_archives(case, tmp_path, templates):
    assert_clean(case, tmp_path / "case", templates)


@cases_of(probe.COUNTS)
def test_counts_and_bounds(case, tmp_path, templates, monkeypatch):
    from fedfactor.run.simulator import Simulator

    def trains(self, rnd):
        raise AssertionError(f"{case.id}: round {rnd} started; the count must be refused before training")

    monkeypatch.setattr(Simulator, "run_round", trains)
    assert_clean(case, tmp_path / "case", templates)


@cases_of(probe.DEVICES)
def test_devices(case, tmp_path, templates):
    assert_clean(case, tmp_path / "case", templates)


@cases_of(probe.DIVERGENCE)
def test_divergence(case, tmp_path, templates):
    assert_clean(case, tmp_path / "case", templates)


@cases_of(probe.RERUN)
def test_rerun_of_a_finished_run(case, tmp_path, templates):
    # refused in one line, and the finished run's files (`kept`) are still there
    assert_clean(case, tmp_path / "case", templates)


# Some of the study files, through `snakemake -n` (tests/study/test_workflow.py has the rest of the workflow's)
@cases_of(probe.STUDY, only=["no study: key", "fedprox mu: -1", "method name with a typo beside a sound one",
                             "results is a file", "runs_per_job: 2.0"])
def test_study_files(case, tmp_path, templates):
    r = probe.run_subprocess(case, tmp_path / "case", templates, timeout=300)
    assert r.outcome == "clean", f"{case.id}: {r.outcome} (exit {r.status}): {r.last_line!r}"


# A hand-edited or stale file of chosen values, through `snakemake -n`: it stops the DAG build in one
# line naming the study file (tests/study/test_tuning.py checks each refusal's words)
@cases_of(probe.TUNING, only=["chosen fl.lr 99.0, in neither the grid nor the tried points", "values: {}",
                              "edited by hand after it was written", "tuning.points: 2.0"])
def test_tuning_files(case, tmp_path, templates):
    r = probe.run_subprocess(case, tmp_path / "case", templates, timeout=300)
    assert r.outcome == "clean", f"{case.id}: {r.outcome} (exit {r.status}): {r.last_line!r}"


@cases_of(probe.PLAN)
def test_plan(case, tmp_path, templates):
    assert_clean(case, tmp_path / "case", templates)


@cases_of(probe.RATIO)
def test_ratio_claims(case, tmp_path, templates):
    assert_clean(case, tmp_path / "case", templates)


@cases_of(probe.DISK)
def test_a_full_disk(case, tmp_path, templates):
    r = probe.run_in_process(case, tmp_path / "case", templates)
    assert r.outcome == "clean", f"{case.id}: {r.outcome} (exit {r.status}): {r.last_line!r}"
    # the file or folder being written, and the space left on the full file system, never "None"
    assert re.search(rf"no space left to write (into )?{re.escape(str(templates.full))}/", r.last_line)
    assert "None" not in r.last_line
    assert f"0 B free on the file system of {templates.full}" in r.last_line

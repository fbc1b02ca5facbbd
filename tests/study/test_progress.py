"""What a running study prints and writes: the per-run line, the live table, the stop message."""

import json
import logging
import os
import threading
import time

import pytest

from fedfactor.cli import _progress
from fedfactor.study.progress import (LIVE, LIVE_FIGURE, PLAN, QuietTerminal, finished_message, live_figure, live_table,
                                progress_line, quiet_terminal, read_plan, run_states, start_message, stopped_message,
                                write_plan)

PROTOCOL = {"test_pool": "client", "model": "trained", "report": "last"}
STARTED = 1_700_000_000.0  # the workflow's start
RUNS = ["a/local/seed0", "a/fedavg/seed0", "a/local/seed1", "a/fedavg/seed1", "a/fedfac/seed0"]


def _finished(study, key, acc, mtime, wall=7.0):
    scenario, method, seed = key.split("/")
    run = study / "runs" / key
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({
        "scenario": scenario, "method": method, "seed": int(seed[4:]), "accuracy": acc, "accuracy_mean": acc,
        "accuracy_best_mean": acc, "accuracy_weighted": acc, "bytes_total": 2e9, "rounds": 2, "clients": 4,
        "protocol": PROTOCOL, "dataset": "digits", "wall_seconds": wall}))
    os.utime(run / "summary.json", (mtime, mtime))
    return run


@pytest.fixture
def study(tmp_path):
    """Five planned runs: two finished (one before this workflow started), one checkpointed, two not
    started."""
    study = tmp_path / "results" / "s"
    write_plan(study, RUNS, ["/venv/bin/snakemake", "--cores", "all"], title="Digits", now=STARTED)
    _finished(study, "a/fedavg/seed0", 0.50, mtime=STARTED - 3600)  # an earlier call's run
    _finished(study, "a/local/seed0", 0.40, mtime=STARTED + 100)
    (study / "runs" / "a/local/seed1").mkdir(parents=True)
    (study / "runs" / "a/local/seed1" / "checkpoint.pt").write_bytes(b"x")
    (study / "runs" / "a/fedavg/seed1").mkdir(parents=True)  # started, killed before its first checkpoint
    return study


def test_run_states_count_summaries_and_checkpoints_of_the_planned_runs(study):
    assert (study / PLAN).exists()
    _finished(study, "a/other/seed0", 0.9, mtime=STARTED)  # not in the plan: not counted
    assert run_states(study, RUNS) == (["a/local/seed0", "a/fedavg/seed0"], ["a/local/seed1"])
    assert read_plan(study)["command"] == "snakemake --cores all"


def test_the_line_names_the_cell_its_accuracy_and_time_and_the_runs_left(study):
    line = progress_line(study / "runs" / "a/local/seed0", study, elapsed=75, now=STARTED + 100)
    clock = time.strftime("%H:%M:%S", time.localtime(STARTED + 100))
    # 1 run finished in the 100 s since the start (the other before it): 3 left take 300 s more
    eta = time.strftime("%H:%M", time.localtime(STARTED + 400))
    assert line == (f"[{clock}] a/local/seed0: accuracy 40.00% in 1 min 15 s | 2/5 runs done, 3 left, "
                    f"ETA {eta} (in 5 min 00 s)")
    # without --elapsed: the training's own seconds
    assert "accuracy 40.00% in 7 s |" in progress_line(study / "runs" / "a/local/seed0", study, now=STARTED + 100)


def test_a_run_that_ended_with_warnings_says_so_on_its_line(study):
    summary = study / "runs" / "a/local/seed0" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()),
                                   "warnings": ["simfed matched no other client in any of its 2 rounds", "x" * 300]}))
    line = progress_line(summary.parent, study, elapsed=75, now=STARTED + 100)
    assert line.endswith("| WARNING: simfed matched no other client in any of its 2 rounds (+1 more in its "
                         "summary.json)")
    assert "2/5 runs done" in line  # the counts stay where they were


def test_the_last_line_has_no_eta_and_a_run_outside_the_workflow_no_counts(tmp_path, study):
    for key in ("a/local/seed1", "a/fedavg/seed1", "a/fedfac/seed0"):
        if (study / "runs" / key).exists():
            for f in (study / "runs" / key).iterdir():
                f.unlink()
            (study / "runs" / key).rmdir()
        _finished(study, key, 0.6, mtime=STARTED + 200)
    line = progress_line(study / "runs" / "a/fedfac/seed0", study, elapsed=3, now=STARTED + 200)
    assert line.endswith("accuracy 60.00% in 3 s | 5/5 runs done, 0 left")
    alone = _finished(tmp_path / "elsewhere", "b/fedavg/seed3", 0.125, mtime=STARTED)
    assert progress_line(alone, tmp_path / "elsewhere", now=STARTED).endswith("b/fedavg/seed3: accuracy 12.50% in 7 s")


def test_live_table_holds_the_finished_runs_in_the_studys_order_and_says_what_is_missing(study):
    md = live_table(study, now=STARTED + 100)
    assert md == (study / LIVE).read_text()
    assert md.startswith("# Digits (live)")
    assert "2 of 5 runs finished; missing: 3 runs (1 checkpointed)" in md
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    # local before fedavg (the plan's order, though fedavg finished first); one seed: no spread, no interval
    assert rows[1:] == ["| local | 40.00 (n=1, no interval) | 2.0000 |", "| fedavg | 50.00 (n=1, no interval) | 2.0000 |"]
    assert "No run finished yet: fedfac." in md


def test_live_table_before_any_run_and_once_complete(tmp_path):
    study = tmp_path / "s"
    write_plan(study, ["a/local/seed0"], ["snakemake"], title="T", now=STARTED)
    assert "0 of 1 runs finished; missing: 1 runs (0 checkpointed)" in live_table(study)
    _finished(study, "a/local/seed0", 0.25, mtime=STARTED)
    md = live_table(study)
    assert "1 of 1 runs finished; complete" in md and "| local | 25.00 (n=1, no interval) |" in md


@pytest.mark.slow
def test_live_figure_draws_the_finished_runs_curves_and_counts_them_in_its_title(tmp_path, study):
    from PIL import Image

    for key in ("a/local/seed0", "a/fedavg/seed0"):
        (study / "runs" / key / "metrics.csv").write_text("round,accuracy_mean\n1,0.2\n2,0.4\n")
    assert live_figure(study) == study / LIVE_FIGURE
    with Image.open(study / LIVE_FIGURE) as png:
        assert png.info["Title"] == "Digits (live: 2 of 5 runs finished)"
    assert not (study / LIVE_FIGURE).with_suffix(".pdf").exists()  # a view: the PNG alone
    write_plan(tmp_path / "fresh", ["a/local/seed0"], ["snakemake"], now=STARTED)
    assert live_figure(tmp_path / "fresh") is None and live_figure(tmp_path / "no plan") is None


def test_concurrent_jobs_leave_one_complete_table_of_every_finished_run(study):
    _finished(study, "a/fedfac/seed0", 0.7, mtime=STARTED + 150)
    threads = [threading.Thread(target=live_table, args=(study,)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    md = (study / LIVE).read_text()
    assert "3 of 5 runs finished" in md and "| fedfac | 70.00 (n=1, no interval) |" in md
    assert not [p for p in study.iterdir() if p.name.endswith(".tmp")]


def test_a_training_job_prints_the_line_and_the_view_never_fails_the_finished_run(study, capsys):
    _progress(study / "runs" / "a/local/seed0", study, 9)  # what `fedfactor train-runs --study` does after a run
    out = capsys.readouterr().out
    assert "a/local/seed0: accuracy 40.00% in 9 s | 2/5 runs done, 3 left" in out
    assert "missing: 3 runs" in (study / LIVE).read_text()
    (study / "runs" / "a/local/seed0" / "summary.json").write_text("{")
    _progress(study / "runs" / "a/local/seed0", study, None)
    err = capsys.readouterr().err
    assert "a/local/seed0 finished, but its progress line or the live table failed" in err


def test_progress_is_cheap(study):
    import subprocess
    import sys

    # CPU seconds, import included: wall time on a busy test machine says little
    code = ("import sys, time; t = time.process_time(); from fedfactor.study.progress import progress_line; "
            f"progress_line({str(study / 'runs' / 'a/local/seed0')!r}, {str(study)!r}); "
            "print(time.process_time() - t, 'torch' in sys.modules, 'pandas' in sys.modules)")
    seconds, torch, pandas = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                            check=True).stdout.split()
    # the line needs neither pandas nor torch (the live table imports pandas after it is printed)
    assert (torch, pandas) == ("False", "False") and float(seconds) < 0.3


def test_start_and_stop_messages_count_the_runs_and_name_the_command(study):
    assert start_message(study).startswith("fedfactor: 5 training runs, 2 done, 1 to resume from a checkpoint;")
    assert stopped_message(study).splitlines() == [
        "fedfactor: stopped with 2 of 5 runs done, 1 checkpointed (they continue where they stopped), 2 still to run.",
        "Run the same command to resume: snakemake --cores all"]  # no live.md yet: no line for it
    live_table(study)
    (study / "runs" / "a/local/seed1" / "checkpoint.pt").unlink()
    assert stopped_message(study).splitlines() == [
        "fedfactor: stopped with 2 of 5 runs done, 0 checkpointed, 3 still to run.",
        "Run the same command to resume: snakemake --cores all", f"Results so far: {study / LIVE}"]
    table = study / "tables" / "table.md"
    assert finished_message(study, table) == "fedfactor: 2 of 5 training runs done"  # nothing built yet


def test_the_closing_block_names_each_output_the_report_command_mlflow_and_the_warned_runs(study):
    table = study / "tables" / "table.md"
    table.parent.mkdir()
    table.write_text("")
    (study / "figures").mkdir()
    summary = study / "runs" / "a/local/seed0" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "warnings": ["matched nobody", "second"]}))
    assert finished_message(study, table, "sqlite:///r/mlflow.db").splitlines() == [
        "fedfactor: 2 of 5 training runs done",
        f"  table:        {table}",
        f"  figures:      {study / 'figures'}",
        f"  report:       snakemake --cores all --report {study / 'report.html'}",
        "  MLflow:       mlflow ui --backend-store-uri sqlite:///r/mlflow.db  (then http://127.0.0.1:5000)",
        "  warnings:     1 run(s) ended with a warning:",
        "    a/local/seed0: matched nobody"]
    # a run that failed in a study that records failed runs is named with its reason
    failed = study / "runs" / "a/local/seed1"
    (failed / "failed.json").write_text(json.dumps({"scenario": "a", "method": "local", "seed": 1,
                                                    "reason": "round 9 kept no update"}))
    assert finished_message(study, table).splitlines()[-2:] == [
        "  failed:       1 run(s) failed, recorded as results (failed_runs: record):",
        "    a/local/seed1: round 9 kept no update"]


def test_a_dataset_that_could_not_be_prepared_is_named_instead_of_resume(study, tmp_path):
    log, out = tmp_path / "logs" / "cifar10.log", tmp_path / "data" / "cifar10.json"
    log.parent.mkdir()
    log.write_text("INFO downloading\nfedfactor: error: could not download cifar10: no network; place ...\n")
    assert stopped_message(study, [(log, out)]).splitlines()[1:] == [
        "A dataset could not be prepared: could not download cifar10: no network; place ...",
        "Do what that says, then run the same command to go on: snakemake --cores all"]
    out.parent.mkdir()
    out.write_text("{}")  # prepared since: an old log says nothing
    assert stopped_message(study, [(log, out)]).splitlines()[1] == "Run the same command to resume: snakemake --cores all"


def _record(message, event=None, level=logging.INFO):
    record = logging.LogRecord("snakemake", level, __file__, 1, message, None, None)
    if event is not None:
        record.event = event
    return record


def test_quiet_terminal_leaves_out_the_per_job_blocks_and_after_ctrl_c_the_interrupted_jobs_errors():
    from snakemake_interface_logger_plugins.common import LogEvent

    f = QuietTerminal()
    assert not f.filter(_record("", LogEvent.JOB_INFO))
    assert not f.filter(_record("Execute 2 jobs...", LogEvent.JOB_STARTED))
    assert not f.filter(_record("Select jobs to execute..."))
    assert not f.filter(_record("3 of 19 steps (16%) done", LogEvent.PROGRESS))
    assert f.filter(_record("Warning: something", level=logging.WARNING))
    assert f.filter(_record("Error in rule train", LogEvent.JOB_ERROR, logging.ERROR))  # a failed job shows
    assert f.filter(_record("Terminating processes on user request, this might take some time."))
    assert not f.filter(_record("Error in rule train", LogEvent.JOB_ERROR, logging.ERROR))  # an interrupted one not
    assert not f.filter(_record("Removing output files of failed job train since they might be corrupted"))


def test_each_step_after_the_training_says_in_one_line_that_it_started(capsys):
    from snakemake_interface_logger_plugins.common import LogEvent

    f = QuietTerminal()
    for rule in ("diagnose", "figures", "train"):
        record = _record(f" Rule: {rule}, Jobid: 3", LogEvent.JOB_INFO)
        record.rule_name = rule
        assert not f.filter(record)  # Snakemake's block stays hidden
    # the training runs have their own line each (progress_line); the steps after them a line as they start
    assert capsys.readouterr().err.splitlines() == [
        "fedfactor: factor analysis of every run's client weights (diagnostics/)...", "fedfactor: figures..."]


@pytest.mark.parametrize("dryrun, verbose, printshellcmds, quiet", [
    (False, False, False, True), (True, False, False, False), (False, True, False, False), (False, False, True, False)])
def test_quiet_terminal_only_in_a_real_run_without_verbose_or_printshellcmds(dryrun, verbose, printshellcmds, quiet):
    from types import SimpleNamespace

    from snakemake_interface_logger_plugins.common import LogEvent

    workflow = SimpleNamespace(dryrun=dryrun, output_settings=SimpleNamespace(verbose=verbose,
                                                                              printshellcmds=printshellcmds))
    assert QuietTerminal(workflow).filter(_record("", LogEvent.JOB_INFO)) is not quiet
    assert QuietTerminal(SimpleNamespace()).filter(_record("", LogEvent.JOB_INFO))  # in doubt, a line shows


def test_the_terminal_is_quiet_and_snakemakes_log_file_keeps_every_line(tmp_path):
    import io

    from snakemake_interface_logger_plugins.common import LogEvent

    logger = logging.getLogger("test_progress.quiet")
    terminal, logfile = io.StringIO(), tmp_path / "snakemake.log"
    logger.handlers = [logging.StreamHandler(terminal), logging.FileHandler(logfile)]
    logger.propagate = False
    quiet_terminal(logger, None)
    logger.warning("rule train:", extra={"event": LogEvent.JOB_INFO})
    logger.warning("a warning")
    for h in logger.handlers:
        h.close()
    assert terminal.getvalue() == "a warning\n"
    assert logfile.read_text() == "rule train:\na warning\n"

"""A running study as the terminal shows it: one line per finished training run, a live results
table, and what an interrupted study leaves behind.

The workflow writes a plan when it starts (`write_plan`, from the Snakefile's onstart): the runs it
is to build, the time and the command. Each training run, once its summary.json is written, calls
`job_finished` (its `fedfactor train-runs` job does), which prints the run's line and rewrites the
study's live.md from the summaries that exist. When Snakemake stops early (Ctrl-C, a failed job),
`stopped_message` counts the finished and checkpointed runs and names the command that resumes them
(or the dataset that could not be prepared); a finished workflow ends with `finished_message`'s block.

Cheap by design: it runs once per training run, so it reads JSON files and file names only; the live
table imports pandas (the project's table code), never torch. The live figure (`live_figure`,
matplotlib) is redrawn once per training job, after its runs.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ..io import atomic_write_json, atomic_write_text

PLAN = "progress.json"  # in the study folder
LIVE = "live.md"  # in the study folder
LIVE_FIGURE = "live_rounds.png"  # in the study folder, redrawn as each training job ends
CHECKPOINT = "checkpoint.pt"  # fedfactor.run.job.CHECKPOINT (not imported: that module imports torch)


def write_plan(study_dir: str | Path, runs: list[str], command: list[str], title: str = "Results",
               now: float | None = None) -> Path:
    """Record the runs this workflow is to build ("scenario/method/seedN", under STUDY/runs/), when
    it started and the command that started it (`command`: sys.argv)."""
    path = Path(study_dir) / PLAN
    atomic_write_json(path, {"runs": list(runs), "started": time.time() if now is None else now,
                             "command": shlex.join(["snakemake", *command[1:]]), "title": title})
    return path


def read_plan(study_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(study_dir) / PLAN).read_text(encoding="utf-8"))


def run_states(study_dir: str | Path, runs: list[str]) -> tuple[list[str], list[str]]:
    """The finished runs (summary.json written) and the checkpointed ones (a checkpoint, no summary)
    among `runs`."""
    root = Path(study_dir) / "runs"
    done = [r for r in runs if (root / r / "summary.json").exists()]
    checkpointed = [r for r in sorted(set(runs) - set(done), key=runs.index) if (root / r / CHECKPOINT).exists()]
    return done, checkpointed


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def eta(plan: dict[str, Any], done: list[str], study_dir: str | Path, now: float) -> float | None:
    """Seconds until the last planned run finishes, at the pace of this workflow so far: the time
    since it started over the runs it finished (runs finished by an earlier call do not count)."""
    left = len(plan["runs"]) - len(done)
    root = Path(study_dir) / "runs"
    # summary.json is written last, so its time is the run's end; 1 s of slack for coarse clocks
    new = sum(1 for r in done if (root / r / "summary.json").stat().st_mtime >= plan["started"] - 1)
    if left == 0 or new == 0:
        return 0.0 if left == 0 else None
    return (now - plan["started"]) / new * left


def progress_line(run_dir: str | Path, study_dir: str | Path, elapsed: float | None = None,
                  now: float | None = None) -> str:
    """One line for the finished run in `run_dir`: its cell, accuracy and time, then the study's runs
    finished and left and when the last should finish."""
    now = time.time() if now is None else now
    summary = json.loads((Path(run_dir) / "summary.json").read_text(encoding="utf-8"))
    acc = summary.get("accuracy")
    seconds = summary.get("wall_seconds") if elapsed is None else elapsed
    cell = f"{summary['scenario']}/{summary['method']}/seed{summary['seed']}"
    line = (f"[{time.strftime('%H:%M:%S', time.localtime(now))}] {cell}: accuracy "
            f"{'n/a' if acc is None else f'{100 * acc:.2f}%'}"
            f"{'' if seconds is None else f' in {_duration(seconds)}'}")
    # a degenerate run (matched nobody, at chance, updates dropped) says so where it is first seen
    warnings = summary.get("warnings") or []
    warned = (f" | WARNING: {_shorten(str(warnings[0]))}" + (f" (+{len(warnings) - 1} more in its summary.json)"
                                                             if len(warnings) > 1 else "")) if warnings else ""
    try:
        plan = read_plan(study_dir)
    except (OSError, ValueError):  # started outside the workflow (or by hand): no plan to count against
        return line + warned
    done, _ = run_states(study_dir, plan["runs"])
    total, left = len(plan["runs"]), len(plan["runs"]) - len(done)
    line += f" | {len(done)}/{total} runs done, {left} left"
    remaining = eta(plan, done, study_dir, now)
    if left and remaining is not None:
        line += f", ETA {time.strftime('%H:%M', time.localtime(now + remaining))} (in {_duration(remaining)})"
    return line + warned


def _shorten(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def live_table(study_dir: str | Path, now: float | None = None) -> str:
    """The study's results table (`fedfactor table`'s markdown) from the runs finished so far, with
    what is still missing; written to STUDY/live.md. Concurrent jobs take turns (a lock), so the
    last one to finish writes the table with the most runs."""
    from ..report.table import aggregate, collect, to_markdown

    now = time.time() if now is None else now
    study_dir = Path(study_dir)
    plan = read_plan(study_dir)
    with open(study_dir / f".{LIVE}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when its holder dies
        done, checkpointed = run_states(study_dir, plan["runs"])
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
        missing = len(plan["runs"]) - len(done)
        status = (f"Live table, {stamp}: {len(done)} of {len(plan['runs'])} runs finished"
                  + (f"; missing: {missing} runs ({len(checkpointed)} checkpointed)" if missing else "; complete")
                  + ". n = seeds per cell; - = no run of that cell finished yet.")
        if done:
            agg = aggregate(collect([study_dir / "runs" / r / "summary.json" for r in done]))
            # columns and rows in the study's order, not in the order the runs finished
            cells = [r.split("/")[:2] for r in plan["runs"]]
            order = {"scenario": list(dict.fromkeys(s for s, _ in cells)),
                     "method": list(dict.fromkeys(m for _, m in cells))}
            agg = agg.sort_values(["scenario", "method"], key=lambda col: col.map(order[col.name].index))
            not_started = [m for m in order["method"] if m not in set(agg["method"])]
            notes = [status] + ([f"No run finished yet: {', '.join(not_started)}."] if not_started else [])
            md = to_markdown(agg, f"{plan['title']} (live)", notes)
        else:
            md = f"# {plan['title']} (live)\n\n{status}\n"
        atomic_write_text(study_dir / LIVE, md)
    return md


def live_figure(study_dir: str | Path) -> Path | None:
    """Accuracy against rounds of the runs finished so far (`fedfactor figures`' first figure), its
    title counting them, as STUDY/live_rounds.png; None before any run has finished."""
    from ..report.figures import accuracy_curves, load_curves

    study_dir = Path(study_dir)
    if not (study_dir / PLAN).exists():  # a job started outside the workflow
        return None
    plan = read_plan(study_dir)
    with open(study_dir / f".{LIVE}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done, _ = run_states(study_dir, plan["runs"])
        if not done:
            return None
        curves = load_curves([study_dir / "runs" / r / "summary.json" for r in done])
        title = f"{plan['title']} (live: {len(done)} of {len(plan['runs'])} runs finished)"
        accuracy_curves(curves, study_dir / LIVE_FIGURE, title=title, pdf=False)
    return study_dir / LIVE_FIGURE


def job_finished(run_dir: str | Path, study_dir: str | Path, elapsed: float | None = None) -> str:
    """After a run of a training job: print the run's line first (it is cheap), then rewrite the
    live table."""
    line = progress_line(run_dir, study_dir, elapsed)
    print(line, flush=True)
    if (Path(study_dir) / PLAN).exists():
        live_table(study_dir)
    return line


def start_message(study_dir: str | Path) -> str:
    plan = read_plan(study_dir)
    done, checkpointed = run_states(study_dir, plan["runs"])
    total = len(plan["runs"])
    resumed = f", {len(checkpointed)} to resume from a checkpoint" if checkpointed else ""
    return (f"fedfactor: {total} training runs, {len(done)} done{resumed}; one line per finished run below, "
            f"the table so far in {os.path.join(study_dir, LIVE)}, its curves in {os.path.join(study_dir, LIVE_FIGURE)}")


def finished_message(study_dir: str | Path, table: str | Path, mlflow_uri: str | None = None) -> str:
    """The closing block of a finished workflow: the runs done, then what a reader opens next, each
    on its own line where it exists (table, claims, figures, diagnostics), the command that builds the
    HTML report, the MLflow UI on the study's store, and the runs that ended with a warning."""
    plan = read_plan(study_dir)
    done, _ = run_states(study_dir, plan["runs"])
    study = Path(study_dir)
    lines = [f"fedfactor: {len(done)} of {len(plan['runs'])} training runs done"]
    outputs = [("table", Path(table)), ("claims", study / "claims" / "claims.md"),
               ("paper tables", study / "tables" / "paper.md"), ("figures", study / "figures"),
               ("diagnostics", study / "diagnostics" / "diagnostics.md")]
    lines += [f"  {name + ':':13} {path}" for name, path in outputs if path.exists()]
    if len(lines) > 1:  # the report needs the outputs it shows
        report = os.path.join(study_dir, "report.html")
        lines.append(f"  {'report:':13} {plan['command']} --report {shlex.quote(report)}")
    if mlflow_uri:
        lines.append(f"  {'MLflow:':13} mlflow ui --backend-store-uri {shlex.quote(mlflow_uri)}  "
                     "(then http://127.0.0.1:5000)")
    warned = _warned(study, done)
    if warned:
        lines.append(f"  {'warnings:':13} {len(warned)} run(s) ended with a warning:")
        lines += [f"    {run}: {text}" for run, text in warned[:5]]
        if len(warned) > 5:
            lines.append(f"    ... and {len(warned) - 5} more (each run's summary.json, `warnings`)")
    failed = _failed(study, [r for r in plan["runs"] if r not in set(done)])
    if failed:  # failed_runs: record; the tables and claims use the seeds that finished
        lines.append(f"  {'failed:':13} {len(failed)} run(s) failed, recorded as results (failed_runs: record):")
        lines += [f"    {run}: {text}" for run, text in failed[:5]]
        if len(failed) > 5:
            lines.append(f"    ... and {len(failed) - 5} more (each run's failed.json)")
    return "\n".join(lines)


def _failed(study: Path, runs: list[str]) -> list[tuple[str, str]]:
    """(run, why it failed) of the runs among `runs` whose folder holds failed.json."""
    from ..report.runs import FAILED

    out = []
    for run in runs:
        try:
            reason = json.loads((study / "runs" / run / FAILED).read_text(encoding="utf-8"))["reason"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out.append((run, _shorten(str(reason))))
    return out


def _warned(study: Path, done: list[str]) -> list[tuple[str, str]]:
    """(run, its first warning) of the finished runs whose summary holds warnings."""
    out = []
    for run in done:
        try:
            warnings = json.loads((study / "runs" / run / "summary.json").read_text(encoding="utf-8")).get("warnings")
        except (OSError, ValueError):
            continue
        if warnings:
            out.append((run, _shorten(str(warnings[0]))))
    return out


def stopped_message(study_dir: str | Path, data: Sequence[tuple[str | Path, str | Path]] = ()) -> str:
    """The last lines after the workflow stopped before the end (Ctrl-C, a failed job). `data`: each
    dataset's (prepare-data log, its output); a dataset not prepared whose log ends in an error is
    named with that error, since running the same command again will not get past it."""
    plan = read_plan(study_dir)
    done, checkpointed = run_states(study_dir, plan["runs"])
    total = len(plan["runs"])
    rest = total - len(done) - len(checkpointed)
    resume = " (they continue where they stopped)" if checkpointed else ""
    failed = [line for log, out in data if not Path(out).exists() and (line := _error_line(log))]
    lines = [f"fedfactor: stopped with {len(done)} of {total} runs done, {len(checkpointed)} checkpointed{resume}, "
             f"{rest} still to run."]
    if failed:
        lines += [f"A dataset could not be prepared: {line}" for line in failed]
        lines.append(f"Do what that says, then run the same command to go on: {plan['command']}")
    else:
        lines.append(f"Run the same command to resume: {plan['command']}")
    live = os.path.join(study_dir, LIVE)
    if os.path.exists(live):
        lines.append(f"Results so far: {live}")
    return "\n".join(lines)


def _error_line(log: str | Path) -> str | None:
    """The `fedfactor: error: ...` line a command's log ends with, without its prefix; None if none."""
    try:
        last = Path(log).read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1]
    except (OSError, IndexError):
        return None
    prefix = "fedfactor: error: "
    return last[len(prefix):] if last.startswith(prefix) else None


class QuietTerminal(logging.Filter):
    """Snakemake's own lines that a study's terminal leaves out, so that one line per finished run
    (`fedfactor progress`) is what remains: the job stats, each job's start block, "Execute N jobs",
    "Finished jobid" and "x of y steps". Warnings and errors stay; but once Ctrl-C has stopped the
    workflow, the errors of the jobs it interrupted are left out too (each of them checkpointed), and
    `stopped_message` says what is left.

    Only in a real run without --verbose or --printshellcmds: the Snakefile installs the filter
    before Snakemake knows whether this is a dry run (whose job list must stay), so it asks at every
    record; and a filter that raised would break Snakemake's logging, so any doubt lets a line through.
    """

    CHATTER = ("Select jobs to execute...", "Building DAG of jobs...", "Using shell:", "Conda environments: ignored")
    # The steps after the training runs, which take a minute or more on a large study: a line each as
    # it starts, in place of Snakemake's block, so the terminal does not go silent after the last run.
    STEPS = {"diagnose": "factor analysis of every run's client weights (diagnostics/)...",
             "figures": "figures...", "table": "the results table...", "paper_tables": "the paper's tables...",
             "claims": "the paper's claims, tested over the seeds...", "simulate": "FedFac's simulation study..."}
    STOPPING = "Terminating processes on user request"

    def __init__(self, workflow: Any = None) -> None:
        from snakemake_interface_logger_plugins.common import LogEvent

        super().__init__()
        self.workflow = workflow  # None: always on (tests)
        self.hidden = {LogEvent.JOB_INFO, LogEvent.GROUP_INFO, LogEvent.JOB_STARTED, LogEvent.JOB_FINISHED,
                       LogEvent.PROGRESS, LogEvent.RUN_INFO, LogEvent.RESOURCES_INFO, LogEvent.SHELLCMD}
        self.errors = {LogEvent.JOB_ERROR, LogEvent.GROUP_ERROR, LogEvent.ERROR}
        self.job_info = LogEvent.JOB_INFO
        self.stopping = False

    def _enabled(self) -> bool:
        if self.workflow is None:
            return True
        out = self.workflow.output_settings
        return not (self.workflow.dryrun or out.verbose or out.printshellcmds)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return not self._enabled() or self._keep(record)
        except Exception:  # noqa: BLE001
            return True

    def _keep(self, record: logging.LogRecord) -> bool:
        event = getattr(record, "event", None)
        message = record.getMessage() if isinstance(record.msg, str) else ""
        if message.startswith(self.STOPPING):
            self.stopping = True
            return True
        if event in self.hidden or message.startswith(self.CHATTER):
            step = self.STEPS.get(getattr(record, "rule_name", None) or "") if event == self.job_info else None
            if step:
                print(f"fedfactor: {step}", file=sys.stderr, flush=True)
            return False
        if self.stopping and (event in self.errors or message.startswith("Removing output files of failed job")):
            return False
        return True


def quiet_terminal(logger: logging.Logger, workflow: Any) -> None:
    """Install QuietTerminal on Snakemake's terminal handler; its log file (.snakemake/log/) keeps
    every line. Snakemake before 9 has no log events to filter on: its terminal stays as it was."""
    try:
        quiet = QuietTerminal(workflow)
    except ImportError:
        return
    for handler in logger.handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.addFilter(quiet)

"""The one entry point: `fedfactor <command>`. Rules, tables and users all build on this contract.

Bad input of any kind (unknown names, impossible settings, corrupt files) ends with one line on
stderr and exit status 2, before any output is written. A run that cannot go on (a diverging loss)
exits 1; a training job stopped by SIGTERM or SIGINT checkpoints and exits 128 + the signal. Once a
training job's results are complete it exits 0, whatever signal comes after.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from . import __version__
from .errors import Interrupted, RunFailed, UsageError

if TYPE_CHECKING:  # the commands import what they run when they run (a fast --help)
    from .run.setup import RunSetup

log = logging.getLogger("fedfactor")
# what `fedfactor --help` opens with: what the tool is for a newcomer, not the contract above
DESCRIPTION = ("Personalized federated learning with factorized and decomposed parameters: train runs, "
               "tabulate, check claims and diagnose them.")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="run config YAML (defaults apply to missing keys)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted config key, e.g. --set fl.rounds=10 (repeatable)")


def _add_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, default=0, metavar="N",
                   help="claim N GPUs no other fedfactor job holds (sets CUDA_VISIBLE_DEVICES unless a scheduler "
                        "already did; waits while all are taken)")
    p.add_argument("--gpu-locks", metavar="DIR", default=str(Path(tempfile.gettempdir()) / "fedfactor-gpu-locks"),
                   help="the GPU lock files, shared by every job on this machine (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="torch's CPU threads (default 1; 0: torch's own default, one per core, or OMP_NUM_THREADS). "
                        "One is fastest when jobs share the cores, as the workflow runs them (it passes its "
                        "`threads`): torch's default oversubscribes a busy machine (a digits job on 2 busy cores: "
                        "50.5 s with it, 8.7 s with 1, the same result); give more to one large job on idle cores")


def _setup(args: argparse.Namespace) -> RunSetup:
    """The run the command line describes, set up: its method's hyperparameters typed and checked,
    every default filled in (run.setup)."""
    from .run.setup import read_run

    return read_run(args.config, args.overrides)


def _set_threads(n: int) -> None:
    """torch's CPU threads for this process (0: torch's own default), before any work."""
    if n < 0:
        raise UsageError(f"--threads must be 0 (torch's default) or a positive count, not {n}")
    cores = os.cpu_count() or 1
    if n > cores:  # more threads than cores only slows torch down, and 10**5 of them exhaust memory
        raise UsageError(f"--threads {n} is more than this machine's {cores} CPU cores")
    import torch

    if n:
        torch.set_num_threads(n)
        try:
            torch.set_num_interop_threads(n)
        except RuntimeError:  # allowed once a process, before any inter-op work (a second in-process run)
            pass
    log.info("torch threads: %d (inter-op %d)", torch.get_num_threads(), torch.get_num_interop_threads())
    given = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if given.isdigit() and int(given) != torch.get_num_threads():
        # the rule's threads (set-threads) and the CPUs it asks SLURM for (cpus_per_task) are set apart
        log.warning("torch runs %d threads on the %s CPUs SLURM gave this task: set the rule's threads to its "
                    "cpus_per_task (--set-threads train=%s)", torch.get_num_threads(), given, given)


def cmd_train(args) -> None:
    _set_threads(args.threads)
    from .devices import claim_gpus
    from .run.job import train

    setup = _setup(args)
    claim_gpus(args.gpus, args.gpu_locks)
    summary = train(setup, Path(args.out), hold_signals=True)
    _finished()
    # accuracies in %, as the workflow's lines and tables show them
    print(f"{summary['scenario']}/{summary['method']}/seed{summary['seed']}: accuracy {100 * summary['accuracy']:.2f}% "
          f"({summary['protocol']['report']}, round {summary['accuracy_round']}; last "
          f"{100 * summary['accuracy_mean']:.2f}% +- {100 * summary['accuracy_std']:.2f}, best "
          f"{100 * summary['accuracy_best_mean']:.2f}% at round {summary['best_round']}), "
          f"{summary['bytes_total']:,} bytes -> {args.out}")


def cmd_train_runs(args) -> None:
    started = time.monotonic()
    _set_threads(args.threads)
    from .devices import claim_gpus
    from .run.job import train_runs
    from .run.setup import read_run

    runs = [(read_run(args.config, [*args.overrides, *run["set"]]), Path(run["out"]),
             Path(run["log"]) if run.get("log") else None) for run in _run_list(args.runs)]
    claim_gpus(args.gpus, args.gpu_locks)

    def finished(out: Path, seconds: float) -> None:
        if args.study:
            _progress(out, args.study, seconds)  # the terminal's line and live.md
        else:
            summary = json.loads((out / "summary.json").read_text())
            val = summary.get("val_score")
            # a tuning run's line shows the number it is chosen by, and not its test accuracy: a
            # researcher watching the grid should see no test number
            shown = f"accuracy {100 * summary['accuracy']:.2f} %" if val is None else f"validation {100 * val:.2f} %"
            print(f"{summary['scenario']}/{summary['method']}/seed{summary['seed']}: {shown} in {seconds:.1f} s "
                  f"-> {out}", flush=True)

    failures = train_runs(runs, finished, since=started, hold_signals=True)
    _finished()
    if args.study:
        _live_figure(args.study)
    lines = [f"{out}: {why}" for out, why in failures]
    if failures and not args.allow_failed:
        raise RunFailed(f"{len(failures)} of {len(runs)} runs failed (each run's log has the details):\n  "
                        + "\n  ".join(lines))
    for line in lines:  # --allow-failed: the failures are results (a tuning point that diverged)
        print(f"failed: {line}", file=sys.stderr, flush=True)
    if args.done:
        from .io import atomic_write_json

        done: dict[str, Any] = {"runs": [str(out) for _, out, _ in runs]}
        if args.allow_failed:  # each failed run with its reason, which tune_select records
            done["failed"] = [{"run": str(out), "reason": why} for out, why in failures]
        atomic_write_json(args.done, done)


def _finished() -> None:
    """The job's results are complete: SIGTERM and SIGINT are ignored from here to the process's
    exit (seconds, while torch and MLflow shut down), so that a late stop signal cannot turn a
    finished job into exit 143, which Snakemake and SLURM count as a failed one. SIG_IGN, not a
    Python handler: CPython puts Python handlers back to the default while it shuts down."""
    if threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)


def cmd_tune_select(args) -> None:
    from .study import tuning

    try:
        spec = json.loads(args.study)
    except ValueError as e:
        raise UsageError(f"--study is not JSON ({e})") from None
    doc = tuning.select(spec["tuning"], spec["scenarios"], spec["methods"], Path(args.runs),
                        tuning.provenance(spec["study"], os.environ.get(tuning.COMMAND_VARIABLE, "snakemake tune"),
                                          spec["rounds"], args.out), tuning.failure_reasons(args.jobs))
    for out in args.out:
        tuning.write(doc, out)
    for scenario, chosen in doc["chosen"].items():
        for label, c in chosen.items():
            values = ", ".join(f"{k}={v}" for k, v in c["values"].items())
            print(f"{scenario}/{label}: {values} (validation {100 * c['val_score']:.2f} %)", flush=True)
    print(f"chosen values -> {', '.join(args.out)}", flush=True)


def _run_list(text: str) -> list[dict]:
    """--runs: a JSON list of {"out": folder, "set": [KEY=VALUE, ...], "log": file (optional)}."""
    try:
        runs = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--runs is not JSON ({e})") from None
    if not isinstance(runs, list) or not runs or not all(
            isinstance(r, dict) and isinstance(r.get("out"), str) and isinstance(r.get("set", []), list)
            and set(r) <= {"out", "set", "log"} for r in runs):
        raise UsageError('--runs must be a non-empty JSON list of {"out": FOLDER, "set": [KEY=VALUE, ...], '
                         '"log": FILE} objects ("set" and "log" optional)')
    outs = [str(Path(r["out"]).resolve()) for r in runs]
    if len(set(outs)) < len(outs):
        raise UsageError(f"--runs names a folder twice: {next(o for o in outs if outs.count(o) > 1)}")
    return [{"set": [], **r} for r in runs]


# `cost` replays every round on shapes, about 0.3 ms a client trained in a round (3 min for this many)
MAX_COST_UPDATES = 500_000


def cmd_cost(args) -> None:
    import math

    from .run.simulator import Simulator

    setup = _setup(args)
    cfg = setup.cfg
    updates = cfg.fl.rounds * math.ceil(cfg.fl.fraction * cfg.fl.clients)
    if updates > MAX_COST_UPDATES:
        raise UsageError(f"cost replays each round: {cfg.fl.rounds:,} rounds x {updates // cfg.fl.rounds:,} clients "
                         f"trained a round = {updates:,} updates, over the {MAX_COST_UPDATES:,} it replays; "
                         "cost fewer rounds and scale (bytes grow with the rounds)")
    sim = Simulator(cfg, dry_run=True, method=setup.method)
    sim.run()
    m = sim.meter
    result = {"method": cfg.method["name"], "model": cfg.model.name, "dataset": cfg.data.name,
              "clients": cfg.fl.clients, "rounds": cfg.fl.rounds, "fraction": cfg.fl.fraction,
              "bytes_up": m.up, "bytes_down": m.down, "bytes_total": m.total,
              "bytes_per_round": [list(r) for r in m.history]}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{cfg.method['name']} / {cfg.model.name} / {cfg.data.name}: {cfg.fl.clients} clients, {cfg.fl.rounds} rounds")
    for key in ("bytes_up", "bytes_down", "bytes_total"):
        v = result[key]
        print(f"{key:12s} {v:>18,d} B  = {v / 1e9:10.4f} GB  = {v / 2**30:10.4f} GiB")


def cmd_partition(args) -> None:
    from .data import load_dataset
    from .run.clients import build_partition

    cfg = _setup(args).cfg
    ds = load_dataset(cfg.data.name, cfg.data.root, download=cfg.data.download)
    y = ds.y.numpy()
    part = build_partition(cfg, y, ds.n_official_train, ds.info.num_classes, ds.owners)
    part.save(args.out, y)
    sizes = [len(c["train"]) for c in part.clients]
    print(f"{cfg.partition.kind}: {part.num_clients} clients, train sizes {min(sizes)}..{max(sizes)} -> {args.out}")


def cmd_prepare_data(args) -> None:
    from .data import prepare_dataset
    from .io import atomic_write_json

    stats = prepare_dataset(args.dataset, args.root)
    if args.out:
        atomic_write_json(args.out, stats)
    clients = f", {stats['natural_clients']} natural clients" if "natural_clients" in stats else ""
    print(f"{args.dataset}: {stats['samples']} samples, {stats['num_classes']} classes{clients}, ready in {args.root}")


def _list(registry) -> None:
    for name, description in registry.describe():
        print(f"{name}\t{description}")


def cmd_methods(args) -> None:
    from .methods import METHODS

    _list(METHODS)


def cmd_datasets(args) -> None:
    from .data.datasets import DATASETS

    _list(DATASETS)


def cmd_models(args) -> None:
    from .models import MODELS

    _list(MODELS)


def cmd_partitions(args) -> None:
    from .data.partition_kinds import PARTITIONS

    _list(PARTITIONS)


def cmd_mlflow_init(args) -> None:
    from .io import atomic_write_text
    from .tracking import init_store

    exp_id = init_store(args.uri, args.experiment)
    if args.out:
        atomic_write_text(args.out, exp_id + "\n")
    print(f"MLflow store {args.uri}, experiment {args.experiment!r} = {exp_id}")


def cmd_mlflow_import(args) -> None:
    from .tracking import import_runs

    outcomes = import_runs([Path(p) for p in args.runs], args.uri, args.experiment)
    for path, outcome in outcomes:
        print(f"{outcome}\t{path}")
    counts = {o: sum(1 for _, x in outcomes if x == o) for o in ("imported", "completed", "unchanged")}
    print(f"{len(outcomes)} runs: " + ", ".join(f"{n} {o}" for o, n in counts.items()), file=sys.stderr)


def cmd_table(args) -> None:
    from .report.table import collect, failed_note, write_tables

    skipped, tuned = None, None
    if args.study:
        from .report.spec import load_study

        study = load_study(args.study)
        skipped = {k: m.name for k, m in study.methods.items() if not m.implemented}
        tuned = study.tuned
    runs = collect(args.runs)
    md = write_tables(runs, args.out_md, args.out_csv, title=args.title, out_html=args.out_html, out_tex=args.out_tex,
                      skipped=skipped, tuned=tuned, failed=failed_note(args.runs))
    print(md)


def cmd_study_spec(args) -> None:
    from .io import atomic_write_json
    from .report.spec import check_spec

    try:
        raw = json.loads(args.json)
    except json.JSONDecodeError as e:
        raise UsageError(f"--json is not JSON ({e})") from None
    if not isinstance(raw, dict):
        raise UsageError("--json must be one JSON object (the study)")
    spec = check_spec(raw)
    atomic_write_json(args.out, spec.model_dump(mode="json"))
    skipped = [k for k, m in spec.methods.items() if not m.implemented]
    print(f"study {spec.study}: {len(spec.scenarios)} scenarios, {len(spec.methods) - len(skipped)} methods"
          f"{f' (not implemented yet: {len(skipped)})' if skipped else ''}, {len(spec.seeds)} seeds, "
          f"{len(spec.claims)} claims -> {args.out}")


def cmd_paper_tables(args) -> None:
    from .report.paper import paper_tables
    from .report.spec import load_study

    paper_tables(load_study(args.study), args.runs, Path(args.out))
    print(f"paper tables -> {args.out}")


def cmd_claims(args) -> None:
    from .report.claims import evaluate_claims, verdict_counts
    from .report.spec import load_study

    study = load_study(args.study)
    if not study.claims and not study.paper_scale_only:
        print(f"study {study.study} lists no claims: nothing to evaluate, nothing written")
        return
    print(f"{verdict_counts(evaluate_claims(study, args.runs, Path(args.out)))} -> {args.out}")


def cmd_compare(args) -> None:
    from .report.compare import compare_runs, counts_line

    frame = compare_runs(args.runs, Path(args.out), against=args.against, methods=args.methods, names=args.names,
                         metric=args.metric)
    print(f"{counts_line(frame)} -> {args.out}")


def cmd_verdicts(args) -> None:
    from .study.verdicts import cpu_counts, write_page

    rows = write_page(Path(args.studies), Path(args.cpu), Path(args.results), Path(args.out))
    counts = cpu_counts(rows)
    print(f"{len(rows)} claims of {len({r.paper for r in rows})} papers at CPU scale: "
          + ", ".join(f"{n} {v}" for v, n in counts.items()) + f" -> {args.out}")


def cmd_figures(args) -> None:
    from .study.figures import study_figures

    written = study_figures(args.runs, Path(args.out), title=args.title, smoke=args.smoke)
    print(f"{len(written)} figures -> {args.out}")


def cmd_curves(args) -> None:
    from .report.figures import accuracy_curves, load_curves

    accuracy_curves(load_curves(args.runs), args.out, title=args.title)
    print(f"accuracy curves -> {args.out}")


def cmd_figure(args) -> None:
    if args.kind != "similarity":
        from .diagnostics.decomp import decomposition_figure, elora_figure

        if args.rounds is not None:
            raise UsageError(f"--rounds applies to --kind similarity only, not {args.kind}")
        draw = {"decomp": decomposition_figure, "elora": elora_figure}[args.kind]
        table = draw(args.runs, args.out, title=args.title)
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print(f"{args.kind} figure -> {args.out}", file=sys.stderr)
        return
    from .diagnostics.heatmaps import similarity_heatmaps

    if len(args.runs) != 1:
        raise UsageError(f"--kind similarity draws one run; got {len(args.runs)} folders")
    rounds = None
    if args.rounds is not None:
        try:
            rounds = [int(r) for r in args.rounds.split(",")]
        except ValueError:
            raise UsageError(f"--rounds {args.rounds!r} is not a comma-separated list of round numbers, "
                             "e.g. --rounds 1,50,100") from None
    drawn = similarity_heatmaps(args.runs[0], args.out, rounds=rounds, title=args.title)
    counts = "" if drawn["counts_round"] is None else f", matching counts after round {drawn['counts_round']}"
    print(f"similarity heatmaps of {', '.join(drawn['rows'])} at rounds {', '.join(map(str, drawn['rounds']))}"
          f"{counts} ({drawn['clients']} clients) -> {args.out}")


def cmd_diagnose(args) -> None:
    from .diagnostics.diagnose import diagnose

    done = diagnose(args.runs, Path(args.out), kappa=args.kappa, method=args.fa_method, mlflow=not args.no_mlflow,
                    uri=args.uri, figures_dir=args.figures)
    rows = done["rows"]
    errors = int((rows["error"].fillna("") != "").sum()) if len(rows) else 0
    logged = sum(1 for outcome, _ in done["mlflow"].values() if outcome == "logged")
    mlflow = "" if args.no_mlflow else f", {logged} logged to MLflow"
    print(f"{rows['run'].nunique() if len(rows) else 0} runs analysed ({len(rows)} layers, {errors} with errors), "
          f"{len(done['skipped'])} skipped{mlflow} -> {args.out}")


def _live_figure(study) -> None:
    from .study.progress import live_figure

    try:  # a view, like the progress line: it never fails the job
        live_figure(study)
    except Exception as e:  # noqa: BLE001
        print(f"fedfactor: the live figure of {study} failed ({type(e).__name__}: {e})", file=sys.stderr)


def _progress(run, study, elapsed: float | None) -> None:
    from .study.progress import job_finished

    # The line and the live table are a view: whatever goes wrong here must not fail the training run
    # that has just finished.
    try:
        job_finished(run, study, elapsed=elapsed)
    except Exception as e:  # noqa: BLE001
        print(f"fedfactor progress: {run} finished, but its progress line or the live table failed "
              f"({type(e).__name__}: {e})", file=sys.stderr)


MAX_GPU_GIB = 100_000  # far above any GPU's memory: 1e308 would overflow the bytes it is turned into


def cmd_plan(args) -> None:
    from .study import plan

    gib = args.gpu_memory_gib
    if gib is not None and not 0 < gib <= MAX_GPU_GIB:  # also false for nan: nan, inf, 0 and below plan nothing
        raise UsageError(f"--gpu-memory-gib must be a number of GiB above 0 and at most {MAX_GPU_GIB:,} (got {gib:g})")
    paths = plan.study_files(args.all, args.study)
    device_memory = None if gib is None else int(gib * plan.GiB)
    profile = None if args.profile == "none" else args.profile

    def node(config: dict) -> plan.Node:
        return plan.profile_node(profile, config.get("gpus_per_job", 0), device_memory)

    plans = []
    for i, files in enumerate(paths, 1):
        if args.all:  # a few seconds a study: say which one is being measured
            print(f"plan: {i}/{len(paths)} {Path(files[0]).name}", file=sys.stderr, flush=True)
        plans.append(plan.plan_study(files, node))
    if args.json:
        print(json.dumps([{**plan.summary(p), "run_groups": plan.group_rows(p)} for p in plans]))
        return
    print(plan.summary_table(plans))
    if args.groups or not args.all:
        for p in plans:
            print(f"\n{p.study}: run groups (each measured once)\n")
            print(plan.groups_table(p))
    flagged = [line for p in plans for line in p.flagged]
    if flagged:
        print("\ncannot fit the requested node:\n" + "\n".join(f"  {line}" for line in flagged))


def cmd_simulate(args) -> None:
    from .fedfac_simulation.config import load_simulation_config
    from .fedfac_simulation.study import simulate

    md = simulate(load_simulation_config(args.config, args.overrides), Path(args.out))
    print(md)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedfactor", description=DESCRIPTION,
        epilog="A whole study runs through Snakemake: `snakemake --cores all` (README.md). Every command: docs/cli.md.")
    parser.add_argument("--version", action="version", version=f"fedfactor {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors in the log")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # each adds its commands in turn: `fedfactor --help` lists them in this order
    for add_commands in (_add_training_commands, _add_setup_commands, _add_mlflow_commands, _add_table_commands,
                         _add_figure_commands, _add_study_commands):
        add_commands(sub)
    return parser


def _add_training_commands(sub: argparse._SubParsersAction) -> None:
    """train, train-runs and tune-select."""
    p = sub.add_parser("train", help="run one federated training; writes OUT/summary.json and OUT/metrics.csv")
    _add_config_args(p)
    p.add_argument("--out", required=True, help="output directory")
    _add_device_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("train-runs", help="run several federated trainings one after another in one process (the "
                                          "workflow's jobs); each keeps train's folder contract")
    _add_config_args(p)
    p.add_argument("--runs", required=True, metavar="JSON",
                   help='the runs: a JSON list of {"out": FOLDER, "set": [KEY=VALUE, ...], "log": FILE}; each run\'s '
                        "config is --config with the common --set and then its own. A folder holding the same "
                        "run finished is skipped, an interrupted one resumes; a failed run does not stop the others "
                        "(exit 1 at the end, naming it)")
    p.add_argument("--study", metavar="DIR", help="the study folder: a progress line per finished run and live.md")
    p.add_argument("--done", metavar="FILE", help="written (the runs, as JSON) once every run has finished")
    p.add_argument("--allow-failed", action="store_true",
                   help="a failed run is a result, not an error: listed in --done and on stderr, exit 0 (tuning: a "
                        "diverged grid point)")
    _add_device_args(p)
    p.set_defaults(func=cmd_train_runs)

    p = sub.add_parser("tune-select", help="choose each method's hyperparameters on the tuning runs' validation "
                                           "scores; write the chosen values with their provenance (docs/tuning.md)")
    p.add_argument("--study", required=True, metavar="JSON",
                   help='{"study", "tuning", "scenarios", "methods", "rounds"} as the workflow passes it; the command '
                        "that asked for it comes from $FEDFACTOR_TUNE_COMMAND")
    p.add_argument("--runs", required=True, metavar="DIR", help="the tuning runs: DIR/SCENARIO/METHOD/pI/seedS")
    p.add_argument("--jobs", nargs="*", default=[], metavar="FILE",
                   help="the tuning jobs' --done files, whose failed runs' reasons the chosen values' file records")
    p.add_argument("--out", required=True, nargs="+", metavar="FILE",
                   help="write the chosen values to each FILE: the study's tuning.file and the tuning's own record")
    p.set_defaults(func=cmd_tune_select)


def _add_setup_commands(sub: argparse._SubParsersAction) -> None:
    """cost, partition, prepare-data and the listings (methods, datasets, models, partitions)."""
    p = sub.add_parser("cost", help="measured communication bytes of a config, from shapes alone (no training)")
    _add_config_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_cost)

    p = sub.add_parser("partition", help="split a dataset among clients; writes a JSON partition file")
    _add_config_args(p)
    p.add_argument("--out", required=True, help="partition file (.json)")
    p.set_defaults(func=cmd_partition)

    p = sub.add_parser("prepare-data", help="download and verify a dataset into the data root")
    p.add_argument("--dataset", required=True)
    p.add_argument("--root", default="data")
    p.add_argument("--out", help="write the dataset's statistics to this JSON file")
    p.set_defaults(func=cmd_prepare_data)

    for name, func, text in [("methods", cmd_methods, "list methods"), ("datasets", cmd_datasets, "list datasets"),
                             ("models", cmd_models, "list models"), ("partitions", cmd_partitions, "list partitions")]:
        sub.add_parser(name, help=text).set_defaults(func=func)


def _add_mlflow_commands(sub: argparse._SubParsersAction) -> None:
    """mlflow-init and mlflow-import."""
    p = sub.add_parser("mlflow-init", help="create the MLflow store and experiment once; print its id")
    p.add_argument("--uri", default="sqlite:///results/mlflow.db")
    p.add_argument("--experiment", default="fedfactor")
    p.add_argument("--out", help="write the experiment id to this file")
    p.set_defaults(func=cmd_mlflow_init)

    p = sub.add_parser("mlflow-import", help="mirror finished run folders into an MLflow store (again: nothing new)")
    p.add_argument("runs", nargs="+", help="run folders (holding summary.json) or folders searched for them")
    p.add_argument("--uri", default="sqlite:///results/mlflow.db")
    p.add_argument("--experiment", default="fedfactor")
    p.set_defaults(func=cmd_mlflow_import)


def _add_table_commands(sub: argparse._SubParsersAction) -> None:
    """table, study-spec, paper-tables, claims, compare and verdicts."""
    p = sub.add_parser("table", help="mean +- std over seeds of run summaries, as markdown and csv")
    p.add_argument("runs", nargs="+", help="summary.json files or directories searched for them")
    p.add_argument("--out-md", required=True)
    p.add_argument("--out-csv", required=True)
    p.add_argument("--out-html", help="also an HTML table (for the workflow's report)")
    p.add_argument("--out-tex", help="also a LaTeX table (a plain tabular to \\input{})")
    p.add_argument("--study", help="the workflow's study.json: methods it lists but that are not implemented yet get a note")
    p.add_argument("--title", default="Results")
    p.set_defaults(func=cmd_table)

    p = sub.add_parser("study-spec", help="check what the workflow passes to the report steps and write study.json")
    p.add_argument("--json", required=True, help="the study as one JSON object")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_study_spec)

    for name, func, text in (
        ("paper-tables", cmd_paper_tables, "the paper's tables with ours beside them: paper.md/.csv/.tex/.html in OUT"),
        ("claims", cmd_claims, "the paper's claims evaluated on our runs: claims.md/.csv/.html in OUT"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("runs", nargs="+", help="summary.json files or directories searched for them")
        p.add_argument("--study", required=True, help="the workflow's study.json")
        p.add_argument("--out", required=True, help="output directory")
        p.set_defaults(func=func)

    p = sub.add_parser("compare", help="two sets of runs (or two methods of one set) per scenario and method, paired "
                                       "over their shared seeds: compare.md/.csv/.png in OUT")
    p.add_argument("runs", nargs="+", metavar="A_RUNS", help="set A: summary.json files or directories searched for them")
    p.add_argument("--against", nargs="+", metavar="B_RUNS", help="set B, compared with A cell by cell")
    p.add_argument("--methods", nargs=2, metavar=("M1", "M2"),
                   help="instead of --against: method M1 (as A) against M2 (as B) in each scenario of A_RUNS")
    p.add_argument("--names", nargs=2, metavar=("A", "B"), help="the two sides' names in the outputs "
                                                                "(default: A and B, or M1 and M2)")
    p.add_argument("--metric", choices=["accuracy", "bytes"], default="accuracy",
                   help="the reported accuracy in %% or the bytes sent in GB (default: %(default)s)")
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("verdicts", help="every claim of the paper studies with its verdict at CPU scale and at paper "
                                        "scale: one markdown page and a figure per paper beside it")
    p.add_argument("--studies", default="config/studies", help="the paper studies (default: %(default)s)")
    p.add_argument("--cpu", default="config/studies/cpu", help="the CPU-scale studies (default: %(default)s)")
    p.add_argument("--results", default="results", help="the results root (default: %(default)s)")
    p.add_argument("--out", default="docs/verdicts.md", help="the page (default: %(default)s)")
    p.set_defaults(func=cmd_verdicts)


def _add_figure_commands(sub: argparse._SubParsersAction) -> None:
    """figures, curves, figure and diagnose."""
    p = sub.add_parser("figures", help="a study's figures (accuracy vs rounds and bytes, per client, similarity, "
                                       "FedDecomp), PNG + PDF in OUT")
    p.add_argument("runs", nargs="+", help="summary.json files or directories searched for them")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--title", default="")
    p.add_argument("--smoke", action="store_true", help="mark every figure as a smoke run on synthetic data")
    p.set_defaults(func=cmd_figures)

    p = sub.add_parser("curves", help="PNG of mean client accuracy per round, one panel per scenario")
    p.add_argument("runs", nargs="+", help="summary.json files or directories searched for them")
    p.add_argument("--out", required=True, help="PNG file")
    p.add_argument("--title", default="")
    p.set_defaults(func=cmd_curves)

    p = sub.add_parser("figure", help="a run's similarity heatmaps (Factorized-FL, SimFed), FedDecomp's sigma/tau "
                                      "diagnostics per round, or its E_lora sweep: PNG")
    p.add_argument("runs", nargs="+", help="similarity: one run's --out folder (holding diagnostics/); decomp, "
                                           "elora: run folders or folders searched for summary.json")
    p.add_argument("--kind", choices=["similarity", "decomp", "elora"], default="similarity",
                   help="similarity: client-similarity heatmaps and matching counts (000 Fig. 7); decomp: "
                        "FedDecomp's sigma distance, delta sigma and delta tau per round (004 Fig. 6, Table 6), "
                        "printing the last round's values; elora: reported accuracy against E_lora (004 Fig. 5), "
                        "printing the numbers drawn")
    p.add_argument("--out", required=True, help="PNG file")
    p.add_argument("--rounds", help="similarity: comma-separated rounds to show, e.g. 1,50,100 (default: first, "
                                    "middle, last)")
    p.add_argument("--title", default="", help="figure title (similarity default: scenario / method / seed of the run)")
    p.set_defaults(func=cmd_figure)

    p = sub.add_parser("diagnose", help="factor analysis of every run's client weights (FedFac's shared/personal "
                                        "split) and FedFac's split history: csv, markdown, PNGs")
    p.add_argument("runs", nargs="+", help="run folders (holding summary.json) or folders searched for them")
    p.add_argument("--out", required=True, help="output folder (diagnostics.md, .csv, PNGs)")
    p.add_argument("--kappa", type=float, default=0.85, help="G = fewest factors explaining this eigenvalue share")
    p.add_argument("--fa-method", choices=["principal", "eigen"], default="principal",
                   help="iterated principal factors (the paper) or the official code's direct eigenvectors")
    p.add_argument("--no-mlflow", action="store_true",
                   help="do not log the numbers and figures to the runs' MLflow runs")
    p.add_argument("--uri", help="MLflow store of the runs (default: each run's own tracking.uri)")
    p.add_argument("--figures", help="folder for the figures (default: --out)")
    p.set_defaults(func=cmd_diagnose)


def _add_study_commands(sub: argparse._SubParsersAction) -> None:
    """plan and simulate."""
    p = sub.add_parser("plan", help="what a study needs before it is launched: runs, local steps, downloads, disk, "
                                    "peak memory a run (measured on shapes), checkpoint, time where measured "
                                    "(docs/plan.md)")
    p.add_argument("--study", nargs="+", metavar="FILE", help="a study file, then files that override it (as "
                                                              "snakemake's --configfile)")
    p.add_argument("--all", action="store_true", help="every study: config/config.yaml and config/studies/*.yaml")
    p.add_argument("--profile", default=str(Path(__file__).resolve().parents[2] / "profiles" / "slurm"),
                   help="the Snakemake profile whose train rule's mem_mb and gpu the runs must fit, or `none` "
                        "(default: %(default)s)")
    p.add_argument("--gpu-memory-gib", type=float, metavar="GIB",
                   help="the GPU's memory, to flag runs that cannot fit it (the profile does not name a GPU)")
    p.add_argument("--groups", action="store_true", help="with --all: each study's run groups too")
    p.add_argument("--json", action="store_true", help="print one JSON list, a study an object")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("simulate", help="FedFac's simulation study (paper 001, Figures 6-7): csv, markdown, PNGs")
    p.add_argument("--config", help="study config YAML, e.g. config/simulation/fedfac.yaml (defaults: the same)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted config key, e.g. --set train.rounds=5 (repeatable)")
    p.add_argument("--out", required=True, help="output folder (simulation.csv, .md, rounds.csv, figure6/7.png)")
    p.set_defaults(func=cmd_simulate)


# Each command's output options and what they name, checked before the command runs.
OUTPUTS: dict[str, list[tuple[str, Literal["folder", "file"]]]] = {
    "train": [("out", "folder")], "train-runs": [("done", "file")], "partition": [("out", "file")],
    "prepare-data": [("root", "folder"), ("out", "file")], "mlflow-init": [("out", "file")],
    "table": [("out_md", "file"), ("out_csv", "file"), ("out_html", "file"), ("out_tex", "file")], "study-spec": [("out", "file")],
    "paper-tables": [("out", "folder")], "claims": [("out", "folder")], "compare": [("out", "folder")],
    "verdicts": [("out", "file")], "figures": [("out", "folder")],
    "curves": [("out", "file")], "figure": [("out", "file")], "diagnose": [("out", "folder"), ("figures", "folder")],
    "simulate": [("out", "folder")],
}


def _check_args(args) -> None:
    """The checks every command shares: output paths and MLflow store URIs."""
    from .io import check_output

    for dest, kind in OUTPUTS.get(args.command, []):
        if getattr(args, dest) is not None:
            check_output(getattr(args, dest), kind, "--" + dest.replace("_", "-"))
    if getattr(args, "uri", None) is not None:
        from .config import check_tracking_uri, sqlite_file

        check_tracking_uri(args.uri, "--uri")
        database = sqlite_file(args.uri)
        if database and args.command != "diagnose":  # diagnose never creates a store
            check_output(database, "file", "--uri")
    if getattr(args, "experiment", None) is not None and not args.experiment.strip():
        raise UsageError("--experiment is empty; name the MLflow experiment")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    # matplotlib's PDF font subsetting and alembic's plugin set-up (every MLflow store open) chatter at
    # INFO: seven lines at the top of every job log, and all that show-failed-logs printed of a failure
    for chatty in ("fontTools", "alembic"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    handlers = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    try:
        code = _dispatch(args)
        if code == 2 and argv is None:
            _exit_now(code)
        return code
    finally:
        # _finished ignores stop signals until the process exits; a caller in the same process (argv
        # given: tests, the probe) gets its own handlers back.
        if argv is not None and threading.current_thread() is threading.main_thread():
            for s, h in handlers.items():
                if h is not None:
                    signal.signal(s, h)


def _exit_now(code: int) -> None:
    """End a refused command at once. Nothing was written and nothing is left to clean up, while the
    interpreter's teardown of torch (and MLflow, where imported) takes a second or more, and many
    more on a loaded machine, after the one line has been printed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _dispatch(args) -> int:
    try:
        _check_args(args)
        args.func(args)
    except UsageError as e:
        print(f"fedfactor: error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"fedfactor: run failed: {e}", file=sys.stderr)
        return 1
    except Interrupted as e:  # the job has checkpointed and said how to resume
        print(f"fedfactor: stopped by {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:  # Ctrl-C outside a training loop
        print("fedfactor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:  # a full disk under any command (training runs say so themselves: job.train)
        from .io import NO_SPACE, full_disk_message

        if e.errno not in NO_SPACE:
            raise
        outputs = [getattr(args, option, None) for option, _ in OUTPUTS.get(args.command, [])]
        print(f"fedfactor: run failed: {full_disk_message(e, next((o for o in outputs if o), None))}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

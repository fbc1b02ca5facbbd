"""One training job: a run folder that survives any kill and mirrors itself to MLflow.

The folder is the unit of work and of truth. It holds config.yaml, fingerprint.json (what decides
the results), metrics.csv (one row per completed round), diagnostics/, checkpoint.pt (every
`checkpoint.every` rounds, and when SIGTERM or SIGINT stops the job), mlflow.json (its MLflow run)
and, written last, summary.json, the mark of a finished run. Running the same command again on the
folder resumes from its checkpoint; on CPU the result is identical to an uninterrupted run. A
different config in the same folder starts a new run (checkpoint and MLflow run included). One job
at a time holds the folder (a lock), and the folder maps to one MLflow run, which a resume
continues.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import shutil
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd
import torch
import yaml

from ..config import CheckpointConfig, Config, flatten
from ..environment import versions
from ..errors import Interrupted, RunFailed, UsageError
from .records import RoundRecord, Scores
from .setup import RunSetup, set_up
from .simulator import Simulator
from .summary import ACCURACY_FIELDS, combined, summarize
from ..io import (NO_SPACE, atomic_open, atomic_write_json, atomic_write_npy, atomic_write_text, check_output,
                 folder_lock, full_disk_message, remove_stale_temporaries)
from ..tracking import FINAL_KEYS, RUN_FILES, STATE_FILE, Tracker, log_to_run, run_identity
from .weights import WEIGHTS_FILE, save_client_weights
from ..report.runs import FAILED

log = logging.getLogger("fedfactor")

CHECKPOINT = "checkpoint.pt"
STATES_FOLDER = "client_states"  # the disk store's files while the run goes on (store.client_states)
FINGERPRINT = "fingerprint.json"  # the result-determining config of the run this folder holds
CHECKPOINT_VERSION = 1
# How far a run's reported accuracy must rise above the majority-class baseline to count as
# learning: an untrained model lands near it, give or take a few of each client's test samples.
CHANCE_MARGIN = 0.02
# when checkpoints fall due (a test's stand-in clock replaces it)
_clock = time.monotonic


def fingerprint(cfg: Config) -> dict[str, Any]:
    """What a checkpoint must agree with to be resumed: the result-determining config and partition."""
    part = cfg.partition.file
    digest = hashlib.sha256(Path(part).read_bytes()).hexdigest() if part else None
    return {"config": cfg.result_dict(), "partition_sha256": digest}


def _differences(old: dict, new: dict) -> str:
    a, b = flatten(old.get("config", {})), flatten(new["config"])
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    if old.get("partition_sha256") != new["partition_sha256"]:
        keys.append("the partition file's content")
    shown = [f"{k} {a.get(k)!r} -> {b.get(k)!r}" if k in a or k in b else k for k in keys[:3]]
    return "; ".join(shown) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def load_checkpoint(path: Path, device: torch.device, mmap: bool = False) -> dict:
    """The checkpoint at `path`, checked; on `device`, or memory-mapped on the host (`mmap`: where the
    clients' states wait off the device, a checkpoint can be larger than the memory that reads it)."""
    try:
        # torch warns about what it finds in a foreign or damaged file (a pickle protocol it does not
        # write) before it refuses it: the one line below says what matters
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location="cpu" if mmap else device, mmap=mmap, weights_only=True)
        if ckpt["version"] != CHECKPOINT_VERSION:
            raise ValueError(f"version {ckpt['version']}, this fedfactor reads {CHECKPOINT_VERSION}")
        missing = [k for k in ("fingerprint", "simulator", "resumed") if k not in ckpt]
        missing += [f"simulator.{k}" for k in ("round", "states", "server") if k not in ckpt.get("simulator", {})]
        if missing:
            raise ValueError(f"no {', '.join(missing)}")
        return ckpt
    except Exception as e:  # torch raises many types for a damaged or foreign file
        raise UsageError(f"checkpoint {path} cannot be resumed ({_load_failure(e)}); delete it to start the run "
                         "over") from None


def _load_failure(error: Exception) -> str:
    """Why torch.load refused a file, without torch's advice to load it with weights_only=False or to
    allow the globals it names: either runs code the file holds, and a damaged checkpoint is not a
    file to trust."""
    text = " ".join(str(error).split()) or type(error).__name__  # an empty file: a bare EOFError
    if "weights_only" not in text:
        return text[:200]
    detail = re.search(r"(Trying to load unsupported GLOBAL \S+|WeightsUnpickler error: .*?|saved in the legacy "
                       r"\.tar format)(?=\. | Please | Check the documentation|$)", text)
    return "not a checkpoint of tensors and plain data" + (f": {detail[1][:150]}" if detail else "")


def check_run_folder(out: Path) -> None:
    """Refuse a run folder where one of the run's own files is not a regular file (a folder named
    summary.json, a named pipe), before anything reads or replaces it: reading a pipe blocks for
    ever, and replacing a folder fails halfway through a run."""
    for name in (".lock", CHECKPOINT, FINGERPRINT, STATE_FILE, WEIGHTS_FILE, "config.yaml", "metrics.csv",
                 "summary.json"):
        path = out / name
        if (path.exists() or path.is_symlink()) and not path.is_file():
            what = "a folder" if path.is_dir() else "not a regular file"
            raise UsageError(f"{path} is {what}; move it away (or use another --out) and run again")


def _checked_checkpoint(path: Path, fp: dict, sim: Simulator) -> dict | None:
    """The checkpoint to resume from, checked in full before anything in the folder is deleted (a
    refused one leaves a finished run's summary.json as it was), or None when there is none."""
    if not path.exists():
        return None
    ckpt = load_checkpoint(path, sim.device, mmap=sim.states.where != "device")
    if ckpt["fingerprint"] != fp:
        raise UsageError(f"{path} belongs to a different run ({_differences(ckpt['fingerprint'], fp)}); "
                         "use another --out, or delete the checkpoint to start over")
    # Refused rather than recomputed: a run never checkpoints a non-finite weight (a diverged update
    # is dropped or stops the run), so this file is damaged, and whether to spend the run's time
    # again, or to look at the file first, is the user's call.
    weights = {name for name, _ in sim.model.named_parameters()}
    state = ckpt["simulator"]
    if not all(torch.isfinite(t).all() for t in _weight_tensors([state["states"], state["server"]], weights)):
        raise UsageError(f"checkpoint {path} holds non-finite model weights (NaN or inf): it is damaged; delete it "
                         "to start the run over")
    return ckpt


def _weight_tensors(obj: Any, names: set[str]) -> Iterator[torch.Tensor]:
    """The floating-point tensors stored under a model parameter's name anywhere in `obj`. Other
    entries may be non-finite by design (AgnosticFL's NaN "no loss yet")."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in names and torch.is_tensor(value) and value.is_floating_point():
                yield value
            else:
                yield from _weight_tensors(value, names)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _weight_tensors(value, names)


@contextlib.contextmanager
def stop_signals(sim: Simulator, hold_after: Path | None = None) -> Iterator[None]:
    """SIGTERM (timeout, SLURM preemption) and SIGINT (Ctrl-C) stop the run at once in a phase that
    can be discarded (training, aggregation, scoring: `Simulator.stoppable`), else at the start of the
    next one; the job then checkpoints the last completed round instead of dying mid-write. With
    `hold_after` (a summary.json), once that file is complete the signals stay ignored instead of
    going back to the caller's handlers: the process (`fedfactor train`, a job's last run) is done,
    and a late signal must not turn it into exit 143, which Snakemake and SLURM read as failed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame) -> None:
        if sim.stop_signal is None:
            log.warning("%s received: stopping and checkpointing the last completed round",
                        signal.Signals(signum).name)
        sim.stop_signal = signum
        if sim.stoppable:  # raised where the main thread is: the phase's work is discarded
            sim.stoppable = False
            raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        done = hold_after is not None and hold_after.is_file()
        for s, h in previous.items():
            signal.signal(s, signal.SIG_IGN if done else h)
    # A signal that came during the run's last writes, after its last phase that stops, stops the
    # caller too (the job's next run would not see it), unless the finished process holds signals.
    if sim.stop_signal is not None and not done:
        raise Interrupted(sim.stop_signal)


def chance_accuracy(sim: Simulator, report: str) -> float:
    """The accuracy a model that always answers its client's most frequent class would report under
    eval.report `report`: each scored client's count of that class in the test split it is scored on
    (its own labels; under eval.test_pool=shared the pooled split inside its task), combined over
    clients as `accuracy` is (summary.combined: the mean of the clients' shares, or under
    best_weighted the share of all scored samples, where one large skewed client outweighs the rest)."""
    tests = [sim.clients[k]["test"] for k in sim.members]
    majority = np.array([torch.bincount(split.y).max().item() for split in tests])
    return combined(Scores(majority, np.array([len(split) for split in tests]), 0.0), report)


def chance_warning(accuracy: float, chance: float) -> str | None:
    """The warning line for a run whose reported accuracy does not beat chance by CHANCE_MARGIN, or None."""
    if accuracy > chance + CHANCE_MARGIN:
        return None
    return (f"accuracy {100 * accuracy:.1f} % is at or below chance (majority-class baseline {100 * chance:.1f} %, "
            f"margin {100 * CHANCE_MARGIN:g} pp): the run learned nothing; check fl.lr and the method's settings")


def train(run: RunSetup | Config, out: Path, hold_signals: bool = False) -> dict[str, Any]:
    """Run (or resume) the training `run` describes in folder `out`; returns the summary. A config
    is set up here (run.setup); the CLI and `train_runs` pass the setup they checked.
    `hold_signals`: stop signals stay ignored once the summary is complete (stop_signals)."""
    setup = run if isinstance(run, RunSetup) else set_up(run)
    cfg = setup.cfg
    check_output(out, "folder")
    check_run_folder(out)
    # every check on the config and the data happens here, before any output
    sim = Simulator(cfg, states_folder=out / STATES_FOLDER, method=setup.method)
    try:
        out.mkdir(parents=True, exist_ok=True)
        # Signals are caught from here on: one arriving while the MLflow run opens still ends in a
        # checkpoint and a KILLED run, at the first training step.
        with folder_lock(out), stop_signals(sim, out / "summary.json" if hold_signals else None):
            try:
                return _train(cfg, out, sim)
            finally:
                sim.states.close()  # the disk store's files: a resume rebuilds them from the checkpoint
    except OSError as e:
        if e.errno not in NO_SPACE:
            raise
        # Every file is replaced atomically (io.atomic_open), so what a rerun needs is intact.
        raise RunFailed(full_disk_message(e, out)) from None


def finished_summary(cfg: Config, out: Path) -> dict[str, Any] | None:
    """The summary of the finished run of exactly `cfg` that `out` holds, or None.

    A run unlinks summary.json when it starts and writes it last, so a summary beside the folder's
    fingerprint means the run with that fingerprint finished.
    """
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if _previous_fingerprint(out) == fingerprint(cfg) else None


@contextlib.contextmanager
def run_log(path: Path | None) -> Iterator[None]:
    """Everything logged while the block runs also goes to `path`, appended: an interrupted
    attempt's lines (its "checkpoint written") stay above the resumed attempt's."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def train_runs(runs: list[tuple[RunSetup, Path, Path | None]],
               on_finished: Callable[[Path, float], None] | None = None, since: float | None = None,
               hold_signals: bool = False) -> list[tuple[Path, str]]:
    """Train (setup, out, log) runs one after another in this process: the workflow's jobs, which pay
    Python's, torch's and MLflow's start-up once for several runs instead of once per run.

    Each run keeps the folder contract of `train`: one whose folder holds the same run finished is
    skipped, an interrupted one resumes from its checkpoint. A run that fails is logged and the next
    one goes on; the failures come back as (out, reason) pairs. A stop signal ends the whole batch
    (Interrupted) once the running run has checkpointed. `on_finished(out, seconds)` follows every
    run trained here, with its time since the previous one ended (the first: since `since`, a
    time.monotonic() value, by default this call). `hold_signals`: the last run holds stop signals
    once its summary is complete (`train`).
    """
    for _, out, _ in runs:  # every folder can be written, before any run starts (each method was set up)
        check_output(out, "folder")
        check_run_folder(out)
    failures: list[tuple[Path, str]] = []
    clock = time.monotonic() if since is None else since
    for i, (setup, out, log_path) in enumerate(runs):
        cfg = setup.cfg
        with run_log(log_path):
            if finished_summary(cfg, out) is not None:
                log.info("%s holds this run, finished: skipped", out)
                continue
            try:
                train(setup, out, hold_signals and i == len(runs) - 1)
            except (UsageError, RunFailed) as e:
                log.error("%s: %s", out, e)
                failures.append(_failed(cfg, out, str(e)))
            except Exception as e:  # a bug in one method must not cost the other runs of the job
                log.exception("%s failed", out)
                failures.append(_failed(cfg, out, f"{type(e).__name__}: {e}"))
            else:
                if on_finished is not None:
                    on_finished(out, time.monotonic() - clock)
            finally:
                clock = time.monotonic()
    return failures


def _failed(cfg: Config, out: Path, reason: str) -> tuple[Path, str]:
    """(out, reason), with the reason kept in the run's folder (failed.json): a study that records
    failed runs (`failed_runs: record`) shows them in its tables and claims; the run's next attempt
    removes it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / FAILED, {"scenario": cfg.scenario, "method": cfg.label or cfg.method["name"],
                                         "seed": cfg.seed, "reason": reason})
    except OSError as e:  # a full disk: the failure still goes back to the caller
        log.error("%s: cannot record the failure (%s)", out, e)
    return out, reason


def _previous_fingerprint(out: Path) -> dict | None:
    try:
        return json.loads((out / FINGERPRINT).read_text())
    except (OSError, ValueError):
        return None


def _train(cfg: Config, out: Path, sim: Simulator) -> dict[str, Any]:
    """The run in `out`: its folder made ready (resumed from its checkpoint where one fits), the
    rounds, then the summary and the tracker's last word. Each step is a function of its own."""
    fp, resumed = _prepare_folder(cfg, out, sim)
    environment = versions(sim.device)
    params, tags, run_name = run_identity(cfg, out, environment)
    tracker = Tracker(cfg.tracking, out, params, tags, run_name)
    checkpoints = _Checkpoints(cfg.checkpoint, out, sim, fp, resumed, tracker, run_name)
    rows = [r.metrics() for r in sim.records]
    if rows:  # rounds after the checkpoint that a killed job had written are recomputed
        atomic_write_text(out / "metrics.csv", pd.DataFrame(rows).to_csv(index=False))
    try:
        sim.run(_RoundOutputs(cfg.fl.rounds, cfg.checkpoint.keep, out, rows, tracker, checkpoints, run_name))
        summary = _summarise(cfg, out, sim, resumed, tracker, environment, run_name)
    except Interrupted as e:
        kept = checkpoints.on_stop()  # first: MLflow may be slow to answer, and the kill is coming
        tracker.end("KILLED")
        log.warning("%s stopped by %s after round %d of %d; %s", run_name, signal.Signals(e.signum).name,
                    sim.round, cfg.fl.rounds, kept)
        raise
    except BaseException:
        tracker.end("FAILED")
        raise
    # summary.json is the job's completion marker: written last, atomically.
    atomic_write_json(out / "summary.json", summary)
    _finish_tracking(cfg.tracking.uri, out, summary, tracker, run_name)
    if not cfg.checkpoint.keep:
        checkpoints.path.unlink(missing_ok=True)
    return summary


def _prepare_folder(cfg: Config, out: Path, sim: Simulator) -> tuple[dict, list[int]]:
    """Make `out` ready for the run: a folder of another config's run starts over, a checkpoint of
    this config's is loaded into `sim`; returns the config's fingerprint and the rounds the run was
    resumed after."""
    remove_stale_temporaries(out)
    (out / FAILED).unlink(missing_ok=True)  # an earlier attempt's failure; this one decides anew
    fp = fingerprint(cfg)
    previous = _previous_fingerprint(out)
    if previous is not None and previous != fp:
        # A changed study re-runs its jobs into the same folders: that is a new run, never a
        # continuation of the old one's checkpoint or MLflow run.
        log.warning("%s held a run of another config (%s): starting over as a new run", out,
                    _differences(previous, fp))
        for name in (CHECKPOINT, STATE_FILE, "metrics.csv", WEIGHTS_FILE):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / "diagnostics", ignore_errors=True)
    ckpt = _checked_checkpoint(out / CHECKPOINT, fp, sim)
    # A stale summary must not survive a failed rerun. A kept checkpoint of the last round (a
    # finished run re-summarised) rewrites the same rounds, so its run's summary stays until the
    # new one replaces it: a rerun that fails (a full disk) loses nothing finished.
    if ckpt is None or ckpt["simulator"]["round"] < cfg.fl.rounds:
        (out / "summary.json").unlink(missing_ok=True)
    resumed = []
    if ckpt is not None:
        sim.load_state_dict(ckpt["simulator"])
        resumed = [*ckpt["resumed"], sim.round]
        log.info("resuming %s after round %d of %d", out, sim.round, cfg.fl.rounds)
    else:
        (out / "metrics.csv").unlink(missing_ok=True)
    atomic_write_json(out / FINGERPRINT, fp)
    atomic_write_text(out / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return fp, resumed


class _Checkpoints:
    """When the run's checkpoint falls due (`checkpoint.every` rounds, `checkpoint.minutes`, and never
    while writing it takes more than `checkpoint.max_share` of the time), and writing it."""

    def __init__(self, settings: CheckpointConfig, out: Path, sim: Simulator, fp: dict, resumed: list[int],
                 tracker: Tracker, run_name: str):
        self.cfg, self.out, self.sim, self.fp, self.resumed = settings, out, sim, fp, resumed
        self.tracker, self.run_name = tracker, run_name
        self.path = out / CHECKPOINT
        self.last_at, self.took = _clock(), 0.0  # when the last checkpoint was written, and its seconds
        self.round = resumed[-1] if resumed else None  # the round the checkpoint on disk holds

    def on_stop(self) -> str:
        """At a stop signal: the checkpoint of the last completed round, unless a round's training is
        committed and its scoring was stopped (`Simulator.scoring_round`); what the log says of it."""
        if self.sim.scoring_round is None:
            self.save()
            return "checkpoint written: run the same command again to resume"
        kept = (f"the checkpoint of round {self.round} stays" if self.round is not None and self.path.exists()
                else "there is none yet, so it starts over")
        return (f"stopped while scoring round {self.sim.scoring_round}, no checkpoint written (its training is "
                f"done and its scores are not): {kept}; run the same command again to resume")

    def due(self, rnd: int) -> bool:
        ck, since = self.cfg, _clock() - self.last_at
        if ck.minutes and since >= 60 * ck.minutes:
            return True
        return bool(ck.every and rnd % ck.every == 0) and not (self.took > 1.0 and self.took > ck.max_share * since)

    def save(self) -> None:
        # The new checkpoint is written beside the last one, which is replaced only once the new one
        # is complete: for a while both are on disk. Said before the write, not after a full disk.
        if self.path.exists():
            size, free = self.path.stat().st_size, shutil.disk_usage(self.out).free
            if free < 1.1 * size:
                log.warning("%s: %.1f GB free beside the last checkpoint; the next one (about %.1f GB) is written "
                            "beside it before replacing it: free disk space, or the write fails and the last "
                            "checkpoint stays", self.run_name, free / 1e9, size / 1e9)
        start = _clock()
        with atomic_open(self.path) as f:
            torch.save({"version": CHECKPOINT_VERSION, "fingerprint": self.fp, "simulator": self.sim.state_dict(),
                        "resumed": self.resumed, "mlflow_run_id": self.tracker.run_id}, f)
        self.last_at, self.round = _clock(), self.sim.round
        self.took = self.last_at - start
        log.info("%s checkpoint of round %d written: %.1f MB in %.1f s", self.run_name, self.sim.round,
                 self.path.stat().st_size / 1e6, self.took)


class _RoundOutputs:
    """What each round leaves, through one channel: the loop's metrics and the method's diagnostics
    go to metrics.csv and MLflow, its arrays to diagnostics/<name>/, a line to the log, and the
    checkpoint when it falls due."""

    def __init__(self, rounds: int, keep: bool, out: Path, rows: list[dict], tracker: Tracker,
                 checkpoints: _Checkpoints, run_name: str):
        self.out, self.rows, self.tracker, self.checkpoints, self.run_name = out, rows, tracker, checkpoints, run_name
        self.rounds, self.keep = rounds, keep  # fl.rounds, checkpoint.keep

    def __call__(self, rec: RoundRecord) -> None:
        row = rec.metrics()
        self.rows.append(row)
        atomic_write_text(self.out / "metrics.csv", pd.DataFrame(self.rows).to_csv(index=False))
        for key, array in rec.arrays.items():
            atomic_write_npy(self.out / "diagnostics" / key / f"round_{rec.round:04d}.npy", array)
        self.tracker.log_metrics({k: v for k, v in row.items() if k != "round"}, step=rec.round)
        if rec.skipped:
            log.warning("%s round %d: dropped the diverged updates of clients %s", self.run_name, rec.round,
                        rec.skipped)
        if rec.test is not None and not sys.stderr.isatty():
            log.info("%s round %d/%d: accuracy %.2f%% +- %.2f, up %d B, down %d B, %.1f s", self.run_name, rec.round,
                     self.rounds, 100 * rec.test.mean, 100 * rec.test.std, rec.bytes_up, rec.bytes_down,
                     rec.elapsed_seconds)
        R = self.rounds
        if (rec.round < R and self.checkpoints.due(rec.round)) or (rec.round == R and self.keep):
            self.checkpoints.save()


def _run_warnings(sim: Simulator, accuracy: float, chance: float) -> list[str]:
    """How the run degenerated, if it did: the method's account from its logged scalars, and the
    loop's own, the diverged updates it dropped (a round that dropped every one has stopped the run)
    and a reported accuracy no better than always answering the majority class."""
    warnings = list(sim.method.run_warnings([r.diagnostics for r in sim.records]))
    dropped = [(r.round, k) for r in sim.records for k in r.skipped]
    if dropped:
        shown = ", ".join(f"round {r} client {k}" for r, k in dropped[:10]) + (", ..." if len(dropped) > 10 else "")
        warnings.append(f"{len(dropped)} client update(s) diverged and were dropped (fl.on_divergence=skip; the "
                        f"client kept its last state): {shown}; see skipped_updates, lower fl.lr")
    if (at_chance := chance_warning(accuracy, chance)) is not None:
        warnings.append(at_chance)
    return warnings


def _summarise(cfg: Config, out: Path, sim: Simulator, resumed: list[int], tracker: Tracker,
               environment: dict, run_name: str) -> dict[str, Any]:
    """summary.json's content, after the last round: the scores, the new clients', the client
    weights kept for the diagnostics, the warnings, bytes and versions."""
    new_clients = None
    if sim.newcomers:
        with sim.stoppable_phase():  # stopped, the checkpoint of the last round is written: a rerun scores again
            scored = sim.evaluate_new_clients()
        new_clients = {"clients": sim.newcomers, "strategies": {
            name: {"accuracy_mean": sc.mean, "accuracy_weighted": sc.weighted, "per_client": sc.per_client.tolist()}
            for name, sc in scored.items()}}
    analysed, analysed_clients = save_client_weights(cfg.diagnostics.keep_weights, sim, out / WEIGHTS_FILE)
    scores = summarize(sim.records, cfg.eval.report)
    chance = chance_accuracy(sim, cfg.eval.report)
    warnings = _run_warnings(sim, scores["accuracy"], chance)
    for line in warnings:
        log.warning("%s: %s", run_name, line)
    assert sim.partition is not None  # a run that trained holds its partition (only a dry run has none)
    return {
        "method": cfg.label or cfg.method["name"],
        "method_name": cfg.method["name"],
        "dataset": cfg.data.name,
        "scenario": cfg.scenario,
        "seed": cfg.seed,
        "model": cfg.model.name,
        "partition": cfg.partition.kind,
        "rounds": cfg.fl.rounds,
        "clients": cfg.fl.clients,
        "num_classes": sim.partition.num_classes,
        "head_local": sim.head_local,
        "protocol": cfg.eval.model_dump(),
        **scores,
        "chance_accuracy": chance,
        "warnings": warnings,
        "accuracy_fields": ACCURACY_FIELDS,
        "bytes_up": sim.meter.up,
        "bytes_down": sim.meter.down,
        "bytes_total": sim.meter.total,
        "params_total": sim.params_total,
        "wall_seconds": sim.records[-1].elapsed_seconds,
        "resumed_after_rounds": resumed,
        "new_clients": new_clients,
        "analysed_layers": {str(i): name for i, name in analysed.items()},
        "analysed_clients": analysed_clients,
        "mlflow_run_id": tracker.run_id,
        "device": str(sim.device),
        # whether local training ran clients batched (fl.batch_clients): equal within float rounding
        "batched_clients": sim.batched is not None,
        "versions": environment,
        "config": cfg.to_dict(),
    }


def _finish_tracking(uri: str, out: Path, summary: dict[str, Any], tracker: Tracker, run_name: str) -> None:
    """The MLflow run's final metrics (final_*), its warnings as a tag, the run's files, FINISHED."""
    warnings = summary["warnings"]
    finals = {k: summary[k] for k in FINAL_KEYS if summary[k] is not None}
    for name, sc in (summary["new_clients"] or {"strategies": {}})["strategies"].items():
        finals[f"new_clients_{name}_accuracy_weighted"] = sc["accuracy_weighted"]
    finals["warnings"] = len(warnings)  # final_warnings: 0 for a run that did not degenerate
    if warnings and tracker.active:  # the lines as a tag, on the run the tracker holds (nothing is created)
        text = "\n".join(warnings)
        outcome, detail = log_to_run(out, uri, {}, {"fedfactor.warnings": text[:5000]},
                                     run_id=tracker.run_id)
        if outcome != "logged":
            log.warning("%s: the run's warnings are not in MLflow (%s); summary.json has them", run_name, detail)
    tracker.finish(finals, [f for f in (out / name for name in RUN_FILES) if f.exists()])

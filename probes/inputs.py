"""The probe of bad inputs: hundreds of hostile but fair inputs, each of which must end cleanly.

    python -m probes.inputs [--jobs 2] [--load N] [--timeout 60] [--class CLASS] [-k TEXT] [--out DIR]

Every case is an input a user could plausibly give (a bad config value, a damaged file, an output
path that cannot be written, an absurd count) with the outcome the CLI contract promises
(src/fedfactor/cli.py): one line `fedfactor: error: ...` on stderr, exit 2, nothing written. The one
exception is a run that starts legitimately and then cannot go on (every update of a round dropped
under `fl.on_divergence=skip`): exit 1 and `fedfactor: run failed: ...`.

Each case runs as its own process with a timeout, in a fresh folder that is its working directory,
and is classified as clean, traceback, wrong success (exit 0), hang (timeout), leftover (refused,
but wrote something, or deleted what it must keep) or other (another exit status, or no one-line message). Study files are given
to `snakemake -n` in the repository. The case table is also what tests/test_reliability.py runs,
in-process (`run_in_process`).

Subprocesses get a memory limit (`MEMORY_LIMIT`) so that a case that tries to allocate tens of GiB
fails instead of taking the shared machine down, and a proxy that refuses every connection, so that
`prepare-data` on a corrupt archive cannot reach the network.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import io
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator
from unittest import mock

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
MEMORY_LIMIT = 6 * 2**30  # address space of one case's process; importing torch alone maps ~3.2 GiB
REFUSING_PROXY = "http://127.0.0.1:9"  # the discard port: every connection is refused at once
PREFIXES = {2: "fedfactor: error:", 1: "fedfactor: run failed:"}
OUTCOMES = ["clean", "traceback", "wrong success", "hang", "leftover", "other"]

CONFIG = "config values"
YAML = "YAML files"
OUT = "output paths"
PARTITION = "partition files"
NPZ = "npz data"
STUDY = "study files (snakemake -n)"
RUNFILES = "damaged run files (table/curves/diagnose/claims/figures)"
WEIGHTS = "client_weights.npz"
IMPORT = "mlflow-import folders"
PREPARE = "prepare-data archives"
COUNTS = "counts and bounds (hangs)"
DEVICES = "devices"
DIVERGENCE = "divergence"
RERUN = "rerun of a finished run (a damaged kept checkpoint, run files that are no file)"
TUNING = "tuning files (snakemake -n)"
PLAN = "plan"
RATIO = "ratio claims to a method that sends nothing"
DISK = "full disk (a run, a partition)"
CLASSES = [CONFIG, YAML, OUT, PARTITION, NPZ, STUDY, RUNFILES, WEIGHTS, IMPORT, PREPARE, COUNTS, DEVICES,
           DIVERGENCE, RERUN, TUNING, PLAN, RATIO, DISK]

# The base of every training case: small and fast, so that a wrong success costs seconds.
BASE = ["data.name=digits", "fl.clients=4", "tracking.enabled=false"]
FAST = ["fl.rounds=1", "fl.epochs=1"]
# The runs the report and import cases read (Templates): 2 rounds, so that curves have a line.
TEMPLATE_RUN = [*BASE, "fl.rounds=2", "fl.epochs=1", "fl.batch_size=32", "fl.lr=0.05", "fl.device=cpu",
                "scenario=s", "seed=0"]
TEMPLATE_METHODS = ("fedavg", "fedfac")
DAMAGED = "runs/s/fedfac/0"  # the run the damage goes into
KEPT_RUN = [*TEMPLATE_RUN, "method.name=fedavg", "checkpoint.keep=true"]  # a finished run that kept its checkpoint
STUDY_SPEC = {"study": "probe", "title": "Probe", "smoke": False, "seeds": [0], "scenarios": ["s"],
              "methods": {m: {"name": m, "implemented": True} for m in TEMPLATE_METHODS}, "paper": None,
              "claims": [{"id": "fac_over_avg", "claim": "FedFac beats FedAvg", "source": "probe", "kind": "order",
                          "a": "fedfac", "b": "fedavg", "scenarios": ["s"]}]}
SIMULATION = [str(REPO / "config" / "simulation" / "fedfac.yaml")]
SIMULATION_TINY = ["data.clients=6", "data.d=10", "data.m=12", "data.train_samples=30", "data.test_samples=30",
                   "train.rounds=3", "train.warmup_steps=2", "seeds=[0]"]


def sets(items) -> list[str]:
    return [a for s in items for a in ("--set", s)]


# --------------------------------------------------------------------------------------------
# templates: the valid files that cases copy and damage, built once per probe or test session


@dataclass(frozen=True)
class Templates:
    root: Path  # runs/ (finished runs of TEMPLATE_METHODS), partition.json, study.json
    readonly: Path | None = None  # a folder nobody may write to, where one could be made
    full: Path | None = None  # a folder on a full file system, where one could be made

    @property
    def runs(self) -> Path:
        return self.root / "runs"


def _main(argv: list[str]) -> None:
    from fedfactor.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    if code != 0:
        raise RuntimeError(f"building the probe's templates: fedfactor {' '.join(argv)} exited {code}: "
                           f"{err.getvalue().strip()[-2000:]}")


def build_templates(root: Path) -> Path:
    """Finished runs, a partition and a study.json under `root`, made with the CLI itself."""
    for method in TEMPLATE_METHODS:
        # FedFac's default tau (inf) fixes the split; `mean` analyses every round and logs the split history
        extra = ["method.tau=mean"] if method == "fedfac" else []
        _main(["train", *sets([*TEMPLATE_RUN, f"method.name={method}", *extra]),
               "--out", str(root / "runs/s" / method / "0")])
    _main(["train", *sets(KEPT_RUN), "--out", str(root / "kept")])  # the RERUN cases' finished run
    _main(["partition", *sets(BASE), "--out", str(root / "partition.json")])
    _main(["study-spec", "--json", json.dumps(STUDY_SPEC), "--out", str(root / "study.json")])
    return root


@contextlib.contextmanager
def readonly_folder(base: Path) -> Iterator[Path | None]:
    """A folder this process cannot write to, or None. Root writes through any mode bits, so as root
    it is a read-only tmpfs mount (None where mounting is not allowed)."""
    path = base / "readonly"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)],
                             capture_output=True).returncode == 0
    try:
        yield path if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], capture_output=True)


@contextlib.contextmanager
def full_folder(base: Path) -> Iterator[Path | None]:
    """A folder on a file system with no space left: a 64 KiB tmpfs filled up, which needs root (None
    elsewhere). Folders can still be made there; no file can be written."""
    path = base / "full"
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        yield None
        return
    try:
        with contextlib.suppress(OSError), open(path / "filler", "wb") as f:
            while True:
                f.write(bytes(4096))
                f.flush()
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


def can_make_readonly() -> bool:
    with tempfile.TemporaryDirectory() as tmp, readonly_folder(Path(tmp)) as ro:
        return ro is not None


# --------------------------------------------------------------------------------------------
# the case table

Setup = Callable[[Path, Templates], None]


@dataclass(frozen=True)
class Case:
    id: str
    klass: str
    argv: tuple[str, ...]  # `fedfactor ...` or `snakemake ...`; {case}, {readonly} and {full} are filled in
    setup: Setup | None = None
    expect: int = 2
    forbidden: tuple[str, ...] = ()  # paths (relative to the case folder, or absolute) that must not exist
    needs_readonly: bool = False
    # a regex the output must match: with expect 0, the command goes on and reports the damage; with
    # 1 or 2, what its one line must say (a full disk: the file and the free space where it was written)
    reported: str = ""
    kept: tuple[str, ...] = ()  # paths (relative to the case folder) that must still exist: a finished result

    @property
    def snakemake(self) -> bool:
        return self.argv[0] == "snakemake"

    @property
    def needs_full(self) -> bool:
        return any("{full}" in a for a in self.argv)

    def args(self, folder: Path, t: Templates) -> list[str]:
        return [a.replace("{case}", str(folder)).replace("{readonly}", str(t.readonly)).replace("{full}", str(t.full))
                for a in self.argv]


CASES: list[Case] = []


def add(klass: str, name: str, argv, setup: Setup | None = None, expect: int = 2, forbidden=(),
        reported: str = "", kept=()) -> None:
    argv = tuple(argv)
    CASES.append(Case(f"{klass.split()[0].lower()}/{name}", klass, argv, setup, expect, tuple(forbidden),
                      any("{readonly}" in a for a in argv), reported, tuple(kept)))


def write(name: str, content: str | bytes) -> Setup:
    def setup(folder: Path, t: Templates) -> None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return setup


def chain(*setups: Setup | None) -> Setup:
    def setup(folder: Path, t: Templates) -> None:
        for s in setups:
            if s is not None:
                s(folder, t)
    return setup


def copy_runs(damage: Callable[[Path], None] | None = None) -> Setup:
    """The template runs under runs/, then `damage` applied to the folder DAMAGED."""
    def setup(folder: Path, t: Templates) -> None:
        shutil.copytree(t.runs, folder / "runs")
        if damage is not None:
            damage(folder / DAMAGED)
    return setup


def copy_file(source: Callable[[Templates], Path], name: str) -> Setup:
    def setup(folder: Path, t: Templates) -> None:
        shutil.copy(source(t), folder / name)
    return setup


def train(*items: str, config: str | None = None, base=(*BASE, *FAST), out: str = "out") -> list[str]:
    return ["fedfactor", "train", *(["--config", config] if config else []), *sets([*base, *items]), "--out", out]


def bomb(levels: int = 9, width: int = 9) -> str:
    """A YAML flow sequence whose last element expands to width**levels scalars through aliases."""
    parts = ["&a0 [" + ", ".join(["lol"] * width) + "]"]
    parts += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


# -- config values: `fedfactor train --set KEY=VALUE` -----------------------------------------

_INT_MIN1 = ["fl.clients", "fl.rounds", "fl.epochs", "fl.batch_size", "fl.eval_every", "partition.classes_per_client",
             "partition.clients_per_group", "partition.samples_per_client.train", "partition.min_train_samples",
             "diagnostics.max_clients", "fl.batch_clients_max"]
_INT_MIN0 = ["seed", "partition.samples_per_client.val", "partition.samples_per_client.test",
             "partition.permutation_seed", "checkpoint.every"]
# Every integer key gets a value below its range, a fraction, a boolean and text; the counts also
# NaN and a list (their upper bounds are the counts class below).
for key in _INT_MIN1 + _INT_MIN0:
    below = "1" if key == "fl.batch_clients_max" else "0" if key in _INT_MIN1 else "-1"
    more = ["nan", "[]"] if key in ("fl.clients", "fl.rounds", "fl.epochs", "fl.batch_size", "seed") else []
    for value in [below, "1.5", "true", "x", *more]:
        add(CONFIG, f"{key}={value}", train(f"{key}={value}"))
for key, values in {
    "fl.lr": ["0", "true", "x", "nan", ".inf"],
    "fl.max_loss": ["0", "true", "nan", ".inf"],
    "partition.alpha": ["0", "true", "x", ".inf"],
    "fl.fraction": ["0", "1.5", "true", "nan"],
    "fl.momentum": ["-1", "1", "true", "nan"],
    "fl.weight_decay": ["-1", "true", ".inf"],
    "eval.new_clients": ["-1", "1", "true", "nan"],
}.items():
    for value in values:
        add(CONFIG, f"{key}={value}", train(f"{key}={value}"))
for item in [
    "method.name=nope", "model.name=nope", "data.name=nope", "partition.kind=nope", "data.split=[0.5,0.5]",
    "data.split=[1,0,0]", "data.split_mode=x", "data.augment=nope", "fl.optimizer=x", "fl.head=x",
    "fl.on_divergence=maybe", "fl.batch_clients=maybe", "eval.report=x", "scenario=[1]", "method=3",
    "diagnostics.layers=[0]",
    "diagnostics.layers=[-99]", "diagnostics.layers=[1.5]", "diagnostics.layers=x",
]:
    add(CONFIG, item, train(item))
# diagnostics.layers=[99]: refused only once the run folder existed, leaving .lock, config.yaml ...
add(CONFIG, "diagnostics.layers=[99]", train("diagnostics.layers=[99]"),
    forbidden=["out", "out/.lock", "out/config.yaml", "out/fingerprint.json", "out/metrics.csv"])
add(CONFIG, "fedprox mu=-1", train("method.name=fedprox", "method.mu=-1"))
add(CONFIG, "fedprox muu=1", train("method.name=fedprox", "method.muu=1"))
add(CONFIG, "groups=[[]] under iid", train("partition.kind=iid", "partition.groups=[[]]"))
add(CONFIG, "groups=[[99]] under iid", train("partition.kind=iid", "partition.groups=[[99]]"))
add(CONFIG, "class_groups overlapping", train("partition.kind=class_groups", "partition.groups=[[0,1],[1,2]]",
                                              "partition.clients_per_group=2"))
add(CONFIG, "shards classes_per_client=11", train("partition.kind=shards", "partition.classes_per_client=11"))
# issue 39: one class a client's task (accuracy 1.0 +- 0 when trained), keys and values a config never holds
add(CONFIG, "class_groups of one class each, permuted",
    train("partition.kind=class_groups", "partition.groups=[[0],[1],[2],[3]]", "partition.clients_per_group=1",
          "partition.permute_labels=true"))
# issue 51: booleans taken as 1 where numbers go
for key, values in {"checkpoint.minutes": ["true", "nan", "-1"], "checkpoint.max_share": ["true", "0", "1.5"],
                    "data.seed": ["-1", "1.5", "true"]}.items():
    for value in values:
        add(CONFIG, f"{key}={value}", train(f"{key}={value}"))
for item in ["fl={{a: 1}: 2}", "fl={[a]: 1}", "fl.rounds=!!binary MQ==", "method.bogus=1"]:
    add(CONFIG, item, train(item))
for uri in ["sqlite:///", "sqlite://", "''", "nosuch://x/y"]:
    add(CONFIG, f"tracking.uri={uri}", train("tracking.enabled=true", f"tracking.uri={uri}"),
        forbidden=["mlruns", "out"])
add(CONFIG, "tracking.experiment=''", train("tracking.enabled=true", "tracking.uri=sqlite:///t.db",
                                            "tracking.experiment=''"), forbidden=["t.db", "mlruns"])
for item in ["fl.rounds", "=3", "fl=3", "fl.rounds.x=1", "nosuch.key=1", "fl.nosuch=1", "fl.rounds=[1", "data="]:
    add(CONFIG, f"--set {item}", train(item))

# -- YAML files: `fedfactor train --config cfg.yaml` ------------------------------------------


def yaml_case(name: str, content: str | bytes, base=(*BASE, *FAST), extra: Setup | None = None) -> None:
    add(YAML, name, train(config="cfg.yaml", base=base), chain(write("cfg.yaml", content), extra))


for doc in ["false", "0", "[]", '"text"', "text", "- fl\n- rounds\n", "1.5", "true", "!!binary aGVsbG8=\n"]:
    yaml_case(f"document {doc.strip()!r}", doc)
yaml_case("second fl: block", "fl:\n  rounds: 1\nfl:\n  epochs: 1\n")
yaml_case("rounds: 1 then rounds: 3", "fl:\n  rounds: 1\n  rounds: 3\n")
yaml_case("seed twice", "seed: 1\nseed: 2\n")
yaml_case("duplicate in a flow mapping", "fl: {rounds: 1, rounds: 2}\n")
yaml_case("duplicate nested deep", "partition:\n  samples_per_client:\n    train: 5\n    train: 6\n")
yaml_case("duplicate hyperparameter", "method:\n  name: fedprox\n  mu: 0.1\n  mu: 0.2\n")
yaml_case("identical duplicate section", "data: {name: digits}\ndata: {name: digits}\n")
yaml_case("duplicate complex key", "? seed\n: 1\n? seed\n: 2\n")
_BASE_ONLY = (*BASE, "fl.epochs=1")
for where, text in {
    "diagnostics.layers": "diagnostics: {layers: BOMB}\n",
    "data.split": "data: {split: BOMB}\n",
    "partition.groups": "partition: {groups: BOMB}\n",
    "method hyperparameter": "method: {name: fedprox, mu: BOMB}\n",
    "scenario": "scenario: BOMB\n",
    "label": "label: BOMB\n",
    "tracking.run_name": "tracking: {run_name: BOMB}\n",
    "fl.rounds": "fl: {rounds: BOMB}\n",
    "unknown top-level key": "x: BOMB\n",
    "a whole section": "partition: {samples_per_client: BOMB}\n",
}.items():
    yaml_case(f"alias bomb in {where}", text.replace("BOMB", bomb()), base=_BASE_ONLY)
yaml_case("invalid UTF-8 in a value", b"seed: 1\nscenario: \xff\xfe\n")
yaml_case("Latin-1 in a comment", b"# caf\xe9\nseed: 1\n")
yaml_case("NUL byte", b"seed: 1\x00\n")
yaml_case("huge: 20 MB comment", "# " + "x" * 20_000_000 + "\nseed: 0\n")
yaml_case("huge: 20 MB scenario label", "scenario: " + "x" * 20_000_000 + "\n")
yaml_case("nested 10000 deep", "scenario: " + "[" * 10_000 + "]" * 10_000 + "\n")
yaml_case("mappings nested 10000 deep", "scenario: " + "{a: " * 10_000 + "b" + "}" * 10_000 + "\n")
for text in ["fl: 3\n", "fl: [1, 2]\n", "fl: null\n"]:
    yaml_case(f"section {text.strip()!r}", text, base=("data.name=digits", "tracking.enabled=false"))
for text in ["method: 3\n", "method: {}\n", "method: [fedavg]\n", "method: {name: fedprox, mu: -1}\n",
             "method: {name: fedprox, muu: 1}\n"]:
    yaml_case(f"{text.strip()!r}", text)
yaml_case("data: null", "data: null\n", base=("fl.clients=4", "tracking.enabled=false", *FAST))
yaml_case("python tag", "seed: !!python/object/apply:os.system ['touch pwned']\n")
yaml_case("timestamp seed", "seed: 2001-12-14\n")
yaml_case("set tag", "fl: !!set {rounds}\n", base=("data.name=digits", "tracking.enabled=false"))
yaml_case("tab indentation", "fl:\n\trounds: 1\n")
yaml_case("unclosed bracket", "fl: {rounds: 1\n")
yaml_case("bad indentation", "fl:\n  rounds: 1\n   epochs: 2\n")
add(YAML, "config is a folder", train(config="cfgdir"), lambda folder, t: (folder / "cfgdir").mkdir())
add(YAML, "config does not exist", train(config="missing.yaml"))
add(YAML, "config /dev/zero", train(config="/dev/zero"))
# issue 39: keys that are lists or mappings, binary values, a null document, a config of 60,000 keys,
# a named pipe (open() would block for ever)
yaml_case("a key that is a list", "? [a]\n: 1\n")
yaml_case("a key that is a mapping", "? {a: 1}\n: 2\n")
yaml_case("a section's key that is a list", "fl: {[rounds]: 1}\n")
yaml_case("rounds: !!binary MQ==", "fl: {rounds: !!binary MQ==}\n")
yaml_case("document 'null'", "null\n")
yaml_case("document '~'", "~\n")
yaml_case("60,000 keys", "".join(f"k{i}: {i}\n" for i in range(60_000)))
add(YAML, "config is a named pipe", train(config="cfg.fifo"), lambda folder, t: os.mkfifo(folder / "cfg.fifo"))

# -- output paths ---------------------------------------------------------------------------

_RUNS = copy_runs()
_STUDY = copy_file(lambda t: t.root / "study.json", "study.json")
_OUT_COMMANDS: dict[str, tuple[str, Callable[[str], list[str]], Setup | None]] = {
    # name: (file or folder, argv given the --out value, setup)
    "train": ("folder", lambda o: train(out=o), None),
    "partition": ("file", lambda o: ["fedfactor", "partition", *sets(BASE), "--out", o], None),
    "prepare-data": ("file", lambda o: ["fedfactor", "prepare-data", "--dataset", "digits", "--root", "data",
                                        "--out", o], None),
    "mlflow-init": ("file", lambda o: ["fedfactor", "mlflow-init", "--uri", "sqlite:///{case}/m.db", "--out", o], None),
    "study-spec": ("file", lambda o: ["fedfactor", "study-spec", "--json", json.dumps(STUDY_SPEC), "--out", o], None),
    "table --out-md": ("file", lambda o: ["fedfactor", "table", "runs", "--out-md", o, "--out-csv", "t.csv"], _RUNS),
    "curves": ("file", lambda o: ["fedfactor", "curves", "runs", "--out", o], _RUNS),
    "figures": ("folder", lambda o: ["fedfactor", "figures", "runs", "--out", o], _RUNS),
    "claims": ("folder", lambda o: ["fedfactor", "claims", "runs", "--study", "study.json", "--out", o],
               chain(_RUNS, _STUDY)),
    "diagnose": ("folder", lambda o: ["fedfactor", "diagnose", "runs", "--no-mlflow", "--out", o], _RUNS),
    "simulate": ("folder", lambda o: ["fedfactor", "simulate", "--config", *SIMULATION, *sets(SIMULATION_TINY),
                                      "--out", o], None),
}
_make_file = write("afile", "not a folder\n")
_make_folder: Setup = lambda folder, t: (folder / "adir").mkdir()  # noqa: E731
for command, (kind, argv, setup) in _OUT_COMMANDS.items():
    ext = "" if kind == "folder" else ".out"
    variants = {
        "''": ("", None),
        "under a file": (f"afile/x{ext}", _make_file),
        # a file output at an existing folder, a folder output at an existing file
        "an existing folder" if kind == "file" else "an existing file":
            ("adir", _make_folder) if kind == "file" else ("afile", _make_file),
        "under /proc": (f"/proc/fedfactor-probe/x{ext}", None),
        "under /sys": (f"/sys/fedfactor-probe/x{ext}", None),
        "300-character name": ("a" * 300 + ext, None),
        "in a read-only folder": (f"{{readonly}}/x{ext}", None),
    }
    for variant, (out, extra) in variants.items():  # type: ignore[assignment]
        add(OUT, f"{command} --out {variant}", argv(out), chain(setup, extra))

# -- partition files: `fedfactor train --set partition.file=p.json` ---------------------------


def partition_case(name: str, damage: Callable[[dict], object] | None = None, raw: str | bytes | None = None,
                   argv: list[str] | None = None) -> None:
    def setup(folder: Path, t: Templates) -> None:
        if raw is not None:
            write("p.json", raw)(folder, t)
            return
        doc = json.loads((t.root / "partition.json").read_text())
        text = damage(doc)
        (folder / "p.json").write_text(text if isinstance(text, str) else json.dumps(doc))
    add(PARTITION, name, argv or train("partition.file=p.json"), setup)


def _repeat(client: int, split: str, times: int = 2, whole: bool = False):
    def damage(doc: dict) -> None:
        idx = doc["clients"][client][split]
        doc["clients"][client][split] = idx * times if whole else idx + idx[:1]
    return damage


partition_case("a client's train list repeated 3 times", _repeat(0, "train", 3, whole=True))
partition_case("a train index twice", _repeat(1, "train"))
partition_case("a val index twice", _repeat(2, "val"))
partition_case("a test index twice", _repeat(3, "test"))
partition_case("a pooled test index twice", lambda d: d["pools"]["test"].append(d["pools"]["test"][0]))
partition_case("not JSON", raw="{")
partition_case("a JSON list", raw="[]")
partition_case("empty file", raw="")
partition_case("invalid UTF-8", raw=b'{"clients": "\xff"}')
partition_case("NaN index", lambda d: d["clients"][0]["train"].append(float("nan")))  # json writes NaN
partition_case("1e400 index", lambda d: json.dumps(d).replace('"train": [', '"train": [1e400, ', 1))
partition_case("nested 100000 deep", raw="[" * 100_000 + "]" * 100_000)
# the last of two "clients" wins in Python's json: a valid list, but not the one the file shows first
partition_case("duplicate key clients",
               lambda d: json.dumps(d)[:-1] + ',"clients":' + json.dumps(d["clients"][::-1]) + "}")
partition_case("index 2**64", lambda d: d["clients"][0]["train"].append(2**64))
partition_case("4 clients but fl.clients=5", lambda d: None, argv=train("partition.file=p.json", "fl.clients=5"))
add(PARTITION, "partition.file is a folder", train("partition.file=pdir"), lambda folder, t: (folder / "pdir").mkdir())
add(PARTITION, "partition.file is a named pipe", train("partition.file=p.fifo"),
    lambda folder, t: os.mkfifo(folder / "p.fifo"))
partition_case("cost reads a file that is not JSON", raw="{",
               argv=["fedfactor", "cost", *sets([*BASE, "partition.file=p.json"])])

# -- npz data: `fedfactor train --set data.name=npz:d.npz` ------------------------------------


def npz_case(name: str, make: Callable[[np.random.Generator], dict] | None = None, raw: bytes | None = None,
             items: tuple[str, ...] = ()) -> None:
    def setup(folder: Path, t: Templates) -> None:
        if raw is not None:
            (folder / "d.npz").write_bytes(raw)
        else:
            with open(folder / "d.npz", "wb") as f:
                np.savez(f, **make(np.random.default_rng(0)))
    add(NPZ, name, train("data.name=npz:d.npz", *items), setup)


def _images(rng, n=400, shape=(8, 8), dtype=np.float64, scale=1.0) -> dict:
    return {"x": (rng.uniform(0, 16, size=(n, *shape)) * scale).astype(dtype), "y": np.arange(n) % 10}


# values float32 holds, even near its largest, are data; beyond its range they cannot be trained on
npz_case("pixels x1e300", lambda r: _images(r, scale=1e300))
def _one_huge_pixel(rng) -> dict:
    d = _images(rng)
    d["x"][0, 0, 0] = 1e300
    return d


npz_case("one pixel 1e300 among normal ones", _one_huge_pixel)
npz_case("pickled object array", lambda r: {"x": np.full((400, 8, 8), 1.0, dtype=object), "y": np.arange(400) % 10})
npz_case("float labels", lambda r: {**_images(r), "y": (np.arange(400) % 10).astype(float)})
npz_case("one class", lambda r: {**_images(r), "y": np.zeros(400, dtype=np.int64)})
npz_case("a class without samples", lambda r: {**_images(r), "y": (np.arange(400) % 2) * 5})
npz_case("1x1 images", lambda r: _images(r, shape=(1, 1)))
npz_case("2x2 colour images", lambda r: _images(r, shape=(3, 2, 2)))
npz_case("3 samples for 4 clients", lambda r: {"x": r.uniform(size=(3, 8, 8)), "y": np.array([0, 1, 2])})
npz_case("x_test of another shape", lambda r: {**_images(r), "x_test": r.uniform(size=(40, 9, 9)),
                                               "y_test": np.arange(40) % 10})
_npy = io.BytesIO()
np.save(_npy, np.zeros((400, 8, 8)))
npz_case("a .npy, not an .npz", raw=_npy.getvalue())
npz_case("truncated archive", raw=b"PK\x03\x04" + b"\x00" * 60)
npz_case("empty file", raw=b"")


# issue 39: sizes declared in the headers, memory estimated before loading, paths that are no file
def _npy_header(shape: tuple[int, ...], descr: str) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


def _y_declares_1e13(folder: Path, t: Templates) -> None:
    """y's header declares 10**13 labels on 8 bytes: a 73 TiB allocation if believed."""
    x = io.BytesIO()
    np.save(x, _images(np.random.default_rng(0))["x"])
    with zipfile.ZipFile(folder / "d.npz", "w") as zf:
        zf.writestr("x.npy", x.getvalue())
        zf.writestr("y.npy", _npy_header((10**13,), "<i8") + bytes(8))


def _expands_to_1_2_gb(folder: Path, t: Templates) -> None:
    """1.2 GB of uint8 images deflated to about 1 MB: some 6 GB once the model's float32 copy is made."""
    n, chunk = 1_200_000, memoryview(bytes(2**24))
    with zipfile.ZipFile(folder / "d.npz", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        with zf.open("x.npy", "w", force_zip64=True) as f:
            f.write(_npy_header((n, 32, 32), "|u1"))
            for start in range(0, n * 1024, len(chunk)):
                f.write(chunk[: n * 1024 - start])
        y = io.BytesIO()
        np.save(y, np.arange(n) % 10)
        zf.writestr("y.npy", y.getvalue())


add(NPZ, "y header declares 10**13 entries on 8 bytes", train("data.name=npz:d.npz"), _y_declares_1e13)
add(NPZ, "expands to 1.2 GB of uint8", train("data.name=npz:d.npz"), _expands_to_1_2_gb)
add(NPZ, "npz path is a folder", train("data.name=npz:d.npz"), lambda folder, t: (folder / "d.npz").mkdir())
add(NPZ, "npz path is a named pipe", train("data.name=npz:d.npz"), lambda folder, t: os.mkfifo(folder / "d.npz"))

# -- study files: `snakemake -n --configfile study.yaml`, in the repository -------------------


def study_case(name: str, change: Callable[[dict], object] | None = None, text: str | None = None,
               extra: Setup | None = None) -> None:
    def setup(folder: Path, t: Templates) -> None:
        study = {"study": "probe", "run_config": str(REPO / "config/runs/digits.yaml"),
                 "results": str(folder / "results"), "seeds": [0], "scenarios": {"a": {"partition": {"kind": "iid"}}},
                 "methods": {"fedavg": {"name": "fedavg"}}}
        if change is not None:
            change(study)
        (folder / "study.yaml").write_text(text.replace("RESULTS", str(folder / "results")) if text is not None
                                           else yaml.safe_dump(study))
        if extra is not None:
            extra(folder, t)
    add(STUDY, name, ["snakemake", "-n", "--configfile", "{case}/study.yaml"], setup)


study_case("fedprox mu: -1", lambda s: s.update(methods={"prox": {"name": "fedprox", "mu": -1}}))
study_case("unknown hyperparameter muu", lambda s: s.update(methods={"prox": {"name": "fedprox", "muu": 1}}))
study_case("no study: key", lambda s: s.pop("study"))
study_case("data: {name: nope}", lambda s: s["scenarios"]["a"].update(data={"name": "nope"}))
study_case("scenarios: []", lambda s: s.update(scenarios=[]))
study_case("scenarios: a string", lambda s: s.update(scenarios="a"))
study_case("scenarios: {a: 3}", lambda s: s.update(scenarios={"a": 3}))
study_case("scenario fl.rounds: x", lambda s: s["scenarios"]["a"].update(fl={"rounds": "x"}))
study_case("scenario fl: 3", lambda s: s["scenarios"]["a"].update(fl=3))
study_case("scenario with an unknown key", lambda s: s["scenarios"]["a"].update(nosuch=1))
study_case("scenario fl.rounds: 10**12", lambda s: s["scenarios"]["a"].update(fl={"rounds": 10**12}))
study_case("scenario partition.kind: nope", lambda s: s["scenarios"]["a"].update(partition={"kind": "nope"}))
study_case("scenario groups [[]] under iid", lambda s: s["scenarios"]["a"]["partition"].update(groups=[[]]))
study_case("scenarios: {}", lambda s: s.update(scenarios={}))
study_case("methods: {a: 3}", lambda s: s.update(methods={"a": 3}))
study_case("method name nope", lambda s: s.update(methods={"a": {"name": "nope"}}))
study_case("method run on_divergence: maybe",
           lambda s: s.update(methods={"a": {"name": "fedavg", "run": {"fl": {"on_divergence": "maybe"}}}}))
study_case("seeds: [-1]", lambda s: s.update(seeds=[-1]))
study_case("seeds: [x]", lambda s: s.update(seeds=["x"]))
study_case("seeds: []", lambda s: s.update(seeds=[]))
study_case("run_config missing", lambda s: s.update(run_config="/nonexistent/run.yaml"))
study_case("run_config holds false", lambda s: s.update(run_config="run.yaml"), extra=write("run.yaml", "false\n"))
study_case("duplicate methods: key", text=(
    f"study: probe\nrun_config: {REPO / 'config/runs/digits.yaml'}\nresults: RESULTS\nseeds: [0]\n"
    "scenarios: {a: {partition: {kind: iid}}}\nmethods: {fedavg: {name: fedavg}}\n"
    "methods: {prox: {name: fedprox, mu: -1}}\n"))
study_case("study file holds false", text="false\n")
# issue 39: a typo was taken for a method not implemented yet and got no jobs (exit 0); a results root
# that is a file ended the DAG build in a NotADirectoryError
study_case("method name with a typo beside a sound one",
           lambda s: s.update(methods={"fedavg": {"name": "fedavg"}, "x": {"name": "fedavgg"}}))
study_case("results is a file", extra=write("results", "not a folder\n"))
# issue 51: whole numbers the schema takes as 2.0
study_case("runs_per_job: 2.0", lambda s: s.update(runs_per_job=2.0))
study_case("seeds: [0.0]", lambda s: s.update(seeds=[0.0]))

# -- tuning files: a study's chosen values, checked when `snakemake -n` reads them (issue 51) ----------


def tuning_case(name: str, damage: Callable[[dict], object] | None = None, text: Callable[[str], str] | None = None,
                section: Callable[[dict], object] | None = None) -> None:
    """A tuned study whose file of chosen values tune_select wrote (fedfactor.study.tuning.write), then
    `damage`d and signed again, or edited as `text` after signing, or the study's `section` changed."""
    def setup(folder: Path, t: Templates) -> None:
        from fedfactor.study import tuning
        from fedfactor.config import load_config

        run_config = REPO / "config/runs/digits.yaml"
        grid = {"fl.lr": [0.01, 0.1]}
        tried = [{"values": {"fl.lr": lr}, "val_score": score} for lr, score in ((0.01, 0.4), (0.1, 0.5))]
        doc = {"version": tuning.FILE_VERSION, "study": "probe",
               "budget": {"points": 2, "rounds": {"a": load_config(run_config).fl.rounds}, "seeds": [100]},
               "grid": {"fedavg": grid}, "chosen": {"a": {"fedavg": {"values": {"fl.lr": 0.1}, "val_score": 0.5,
                                                                      "tried": tried}}}}
        if damage is not None:
            damage(doc)
        tuning.write(doc, folder / "chosen.yaml")
        if text is not None:
            (folder / "chosen.yaml").write_text(text((folder / "chosen.yaml").read_text()))
        study = {"study": "probe", "run_config": str(run_config), "results": str(folder / "results"), "seeds": [0],
                 "scenarios": {"a": {"partition": {"kind": "iid"}}}, "methods": {"fedavg": {"name": "fedavg"}},
                 "tuning": {"file": str(folder / "chosen.yaml"), "seeds": [100], "points": 2, "common": grid}}
        if section is not None:
            section(study["tuning"])
        (folder / "study.yaml").write_text(yaml.safe_dump(study))
    add(TUNING, name, ["snakemake", "-n", "--configfile", "{case}/study.yaml"], setup)


def _chosen(**values):
    return lambda doc: doc["chosen"]["a"]["fedavg"].update(values=values)


tuning_case("chosen fl.lr 99.0, in neither the grid nor the tried points", _chosen(**{"fl.lr": 99.0}))
tuning_case("a chosen key never tuned (fl.momentum)", _chosen(**{"fl.lr": 0.1, "fl.momentum": 0.5}))
tuning_case("values: {}", _chosen())
tuning_case("edited by hand after it was written", text=lambda t: t.replace("fl.lr: 0.1\n", "fl.lr: 0.01\n", 1))
tuning_case("tuned on other seeds", lambda doc: doc["budget"].update(seeds=[5]))
tuning_case("tuning.points: 2.0", section=lambda t: t.update(points=2.0))

# -- plan: `fedfactor plan` on a bad study or option (issue 51) -------------------------------------------


def plan_case(name: str, study: str | None, *options: str) -> None:
    setup = write("study.yaml", study) if study is not None else None
    path = "{case}/study.yaml" if study is not None else str(REPO / "config/config.yaml")
    add(PLAN, name, ["fedfactor", "plan", "--study", path, "--profile", "none", *options], setup)


plan_case("an empty study file", "")
plan_case("a study file of comments only", "# nothing yet\n")
plan_case("an unknown method", f"study: p\nrun_config: {REPO / 'config/runs/digits.yaml'}\nseeds: [0]\n"
          "scenarios: {a: {partition: {kind: iid}}}\nmethods: {fedavg: {name: fedavg}, x: {name: fedavgg}}\n")
for value in ("nan", "inf", "1e308", "-1", "0"):
    plan_case(f"--gpu-memory-gib {value}", None, f"--gpu-memory-gib={value}")

# -- ratio claims to a method that sends nothing: a verdict that says so, never inf (issue 51) -----------


def _ratio_study(folder: Path, t: Templates) -> None:
    from fedfactor.report.spec import check_spec

    claim = {"id": "fewer_bytes", "claim": "FedAvg sends twice FedFac's bytes", "source": "probe", "kind": "ratio",
             "a": "fedavg", "b": "fedfac", "scenarios": ["s"], "min": 2.0}
    spec = check_spec({**STUDY_SPEC, "claims": [claim]}).model_dump(mode="json")
    (folder / "study.json").write_text(json.dumps(spec))


add(RATIO, "fedfac sends 0 bytes", ["fedfactor", "claims", "runs", "--study", "study.json", "--out", "report"],
    chain(copy_runs(lambda run: _edit_summary(bytes_total=0)(run)), _ratio_study), expect=0,
    reported=r"0 not reproduced, 0 within noise, 1 not applicable")

# -- a full disk: one line naming what could not be written and the space left there (issue 51) -------
# Each case writes to its own path on the one full file system (Templates.full); a run folder can still
# be made there, so the run's first failed write names no file of its own.
_NAMED = r"no space left to write (into )?/\S+ \(0 B free on "  # a path, not None, and the full file system's space
add(DISK, "train --out on a full disk", train(out="{full}/run"), expect=1, reported=_NAMED)
add(DISK, "partition --out on a full disk", ["fedfactor", "partition", *sets(BASE), "--out", "{full}/p.json"],
    expect=1, reported=_NAMED)

# -- damaged run files: the reports ---------------------------------------------------------


def _set_file(name: str, content: str | bytes) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        write(name, content)(run, None)  # type: ignore[arg-type]
    return damage


def _edit_summary(**changes) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        doc = json.loads((run / "summary.json").read_text())
        for k, v in changes.items():
            if v is KeyError:
                doc.pop(k)
            else:
                doc[k] = v
        (run / "summary.json").write_text(json.dumps(doc))
    return damage


def _truncate(name: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        data = (run / name).read_bytes()
        (run / name).write_bytes(data[: len(data) // 2])
    return damage


_REPORTS = {
    "table": ["fedfactor", "table", "runs", "--out-md", "report/t.md", "--out-csv", "report/t.csv"],
    "curves": ["fedfactor", "curves", "runs", "--out", "report/curves.png"],
    "diagnose": ["fedfactor", "diagnose", "runs", "--no-mlflow", "--out", "report"],
    "claims": ["fedfactor", "claims", "runs", "--study", "study.json", "--out", "report"],
    "figures": ["fedfactor", "figures", "runs", "--out", "report"],
}
_SUMMARY_DAMAGE = {
    "empty summary.json": _set_file("summary.json", ""),
    "truncated summary.json": _truncate("summary.json"),
    "summary.json holds []": _set_file("summary.json", "[]"),
    "summary.json invalid UTF-8": _set_file("summary.json", b'{"scenario": "\xff"}'),
    "summary.json without method": _edit_summary(method=KeyError),
    "summary.json nested 100000 deep": _set_file("summary.json", "[" * 100_000 + "]" * 100_000),
}
_ACCURACY_DAMAGE = {  # for the reports that read the accuracies of summary.json
    "summary.json accuracy_mean NaN": _edit_summary(accuracy_mean=float("nan")),
}
_METRICS_DAMAGE = {
    "empty metrics.csv": _set_file("metrics.csv", ""),
    "metrics.csv header only": _set_file("metrics.csv", "round,train_loss,accuracy_mean\n"),
    "binary metrics.csv": _set_file("metrics.csv", bytes(range(256)) * 4),
    "metrics.csv round x": _set_file("metrics.csv", "round,train_loss,accuracy_mean\nx,1.0,0.5\n"),
    "metrics.csv accuracy x": _set_file("metrics.csv", "round,train_loss,accuracy_mean\n1,1.0,x\n2,0.9,y\n"),
}
for command, argv in _REPORTS.items():
    extra = _STUDY if command == "claims" else None
    damages = {**_SUMMARY_DAMAGE, **(_ACCURACY_DAMAGE if command in ("table", "claims") else {}),
               **(_METRICS_DAMAGE if command in ("curves", "figures") else {})}
    for name, damage in damages.items():
        add(RUNFILES, f"{command}: {name}", argv, chain(copy_runs(damage), extra), forbidden=["report"])

# -- client_weights.npz and split histories: `fedfactor diagnose` ------------------------------


def _weights(change: Callable[[dict], dict] | None = None, raw: bytes | None = None) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        path = run / "client_weights.npz"
        if raw is not None:
            path.write_bytes(raw)
            return
        with np.load(path) as f:
            arrays = {k: f[k] for k in f.files}
        with open(path, "wb") as fh:
            np.savez(fh, **change(arrays))  # object arrays are pickled: the reader must refuse them
    return damage


def _each(fn):
    return lambda arrays: {k: fn(v) for k, v in arrays.items()}


def _split_history(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        files = sorted((run / "diagnostics").rglob("round_*.npy"))
        if not files:
            raise RuntimeError(f"the template fedfac run {run} has no split history under diagnostics/")
        damage(files[-1])
    return apply


_WEIGHT_DAMAGE = {
    "pickled object array": _weights(_each(lambda v: np.array([v, None], dtype=object))),
    "not a zip": _weights(raw=b"not an npz\n"),
    "truncated": lambda run: _truncate("client_weights.npz")(run),
    "a single .npy": _set_file("client_weights.npz", _npy.getvalue()),
    "entry renamed": _weights(lambda a: {"x" + k: v for k, v in a.items()}),
    "NaN weights": _weights(_each(lambda v: np.full_like(v, np.nan))),
    "1-D entry": _weights(_each(lambda v: v.reshape(-1))),
    "no clients": _weights(_each(lambda v: v[:0])),
    "pickled split history": _split_history(lambda p: np.save(p, np.array([1, None], dtype=object),
                                                             allow_pickle=True)),
}
# diagnose goes on past a run it cannot analyse: the damage is an error row (diagnostics.md's
# "Errors", the count it prints), so that one bad run does not cost a study its other diagnostics
for name, damage in _WEIGHT_DAMAGE.items():
    add(WEIGHTS, name, _REPORTS["diagnose"], copy_runs(damage), expect=0, reported=r"\b[1-9]\d* with errors")

# -- mlflow-import folders ----------------------------------------------------------------------

_IMPORT = ["fedfactor", "mlflow-import", "runs", "--uri", "sqlite:///{case}/m.db", "--experiment", "e"]
for name, damage in {
    "summary.json holds []": _set_file("summary.json", "[]"),
    "truncated summary.json": _truncate("summary.json"),
    "config.yaml duplicate keys": _set_file("config.yaml", "fl:\n  rounds: 2\n  rounds: 3\n"),
    "config.yaml holds false": _set_file("config.yaml", "false\n"),
    "config.yaml unknown key": _set_file("config.yaml", "nosuch: 1\n"),
    "config.yaml alias bomb": _set_file("config.yaml", f"diagnostics: {{layers: {bomb()}}}\n"),
    "config.yaml missing": lambda run: (run / "config.yaml").unlink(),
    "empty metrics.csv": _set_file("metrics.csv", ""),
    "metrics.csv round 1.5": _set_file("metrics.csv", "round,accuracy_mean\n1.5,0.5\n"),
    "metrics.csv round NaN": _set_file("metrics.csv", "round,accuracy_mean\n,0.5\n"),
    "metrics.csv accuracy x": _set_file("metrics.csv", "round,accuracy_mean\n1,x\n2,y\n"),
    "mlflow.json damaged": _set_file("mlflow.json", "["),
}.items():
    add(IMPORT, name, _IMPORT, copy_runs(damage), forbidden=["m.db"])
add(IMPORT, "a folder without runs", ["fedfactor", "mlflow-import", "empty", "--uri", "sqlite:///{case}/m.db"],
    lambda folder, t: (folder / "empty").mkdir(), forbidden=["m.db"])
add(IMPORT, "a file, not a folder", ["fedfactor", "mlflow-import", "afile", "--uri", "sqlite:///{case}/m.db"],
    write("afile", "x\n"), forbidden=["m.db"])
for uri in ["", "sqlite:///", "nosuch://x", "sqlite:///{case}/afile/m.db", "sqlite:////proc/fedfactor-probe/m.db"]:
    add(IMPORT, f"--uri {uri.replace('{case}/', '')!r}", ["fedfactor", "mlflow-import", "runs", "--uri", uri],
        chain(copy_runs(), write("afile", "x\n")), forbidden=["mlruns"])
add(IMPORT, "--experiment ''", [*_IMPORT[:-1], ""], copy_runs(), forbidden=["m.db"])

# -- prepare-data on corrupt archives -----------------------------------------------------------


def _prepare(dataset: str, root: str = "data") -> list[str]:
    return ["fedfactor", "prepare-data", "--dataset", dataset, "--root", root, "--out", "stats.json"]


_GARBAGE = b"this is not an archive\n" * 100
_TINY = "data/tiny-imagenet-200"
add(PREPARE, "cifar10 corrupt tar.gz", _prepare("cifar10"), write("data/cifar-10-python.tar.gz", _GARBAGE),
    forbidden=["stats.json"])
add(PREPARE, "cifar100 corrupt tar.gz", _prepare("cifar100"), write("data/cifar-100-python.tar.gz", _GARBAGE),
    forbidden=["stats.json"])
add(PREPARE, "cifar10 corrupt extracted batches", _prepare("cifar10"),
    chain(*(write(f"data/cifar-10-batches-py/{n}", _GARBAGE)
            for n in ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch",
                      "batches.meta"])), forbidden=["stats.json"])
_MNIST = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
add(PREPARE, "mnist corrupt archives and files", _prepare("mnist"),
    chain(*(write(f"data/MNIST/raw/{n}{gz}", _GARBAGE) for n in _MNIST for gz in ("", ".gz"))),
    forbidden=["stats.json"])
add(PREPARE, "mnist corrupt extracted files", _prepare("mnist"),
    chain(*(write(f"data/MNIST/raw/{n}", _GARBAGE) for n in _MNIST)), forbidden=["stats.json"])
add(PREPARE, "svhn corrupt .mat", _prepare("svhn"),
    chain(write("data/train_32x32.mat", _GARBAGE), write("data/test_32x32.mat", _GARBAGE)), forbidden=["stats.json"])
_TINY_OK = chain(write(f"{_TINY}/wnids.txt", "n01\n"), write(f"{_TINY}/val/val_annotations.txt", "v.JPEG\tn01\n"))
add(PREPARE, "tinyimagenet corrupt JPEG", _prepare("tinyimagenet"),
    chain(_TINY_OK, write(f"{_TINY}/train/n01/images/a.JPEG", _GARBAGE), write(f"{_TINY}/val/images/v.JPEG", _GARBAGE)),
    forbidden=["stats.json", "data/tiny-imagenet-200.npz"])
add(PREPARE, "tinyimagenet garbled annotations", _prepare("tinyimagenet"),
    chain(write(f"{_TINY}/wnids.txt", "n01\n"), write(f"{_TINY}/val/val_annotations.txt", b"\xff\xfe\x00garbage"),
          write(f"{_TINY}/train/n01/images/a.JPEG", _GARBAGE)),
    forbidden=["stats.json", "data/tiny-imagenet-200.npz"])
add(PREPARE, "tinyimagenet corrupt zip", _prepare("tinyimagenet"), write("data/tiny-imagenet-200.zip", _GARBAGE),
    forbidden=["stats.json", "data/tiny-imagenet-200.npz"])


def _pickled_npz(folder: Path, t: Templates) -> None:
    (folder / "data").mkdir()
    with open(folder / "data/tiny-imagenet-200.npz", "wb") as f:
        np.savez(f, x_train=np.array([None], dtype=object))


add(PREPARE, "tinyimagenet pickled cache", _prepare("tinyimagenet"), _pickled_npz, forbidden=["stats.json"])
add(PREPARE, "--root is a file", _prepare("digits", "afile"), write("afile", "x\n"), forbidden=["stats.json"])
add(PREPARE, "--root under /proc", _prepare("digits", "/proc/fedfactor-probe/data"), forbidden=["stats.json"])
add(PREPARE, "unknown dataset", _prepare("nope"), forbidden=["stats.json"])
add(PREPARE, "corrupt npz dataset", _prepare("npz:d.npz"), write("d.npz", _GARBAGE), forbidden=["stats.json"])

# -- counts and bounds: the hangs -------------------------------------------------------------

for item in ["fl.rounds=1000000000000", "fl.rounds=1e29", "fl.rounds=1.0e+29", "fl.epochs=1000000000",
             "fl.clients=1000000", "fl.clients=5000", "seed=99999999999999999999", "seed=18446744073709551616"]:
    add(COUNTS, f"train {item}", train(item))
for item in ["fl.rounds=1000000000000", "fl.clients=1000000", "fl.clients=1000000000"]:
    add(COUNTS, f"cost {item}", ["fedfactor", "cost", *sets([*BASE, item])])
add(COUNTS, "partition fl.clients=1000000000", ["fedfactor", "partition", *sets([*BASE, "fl.clients=1000000000"]),
                                                "--out", "p.json"])
add(COUNTS, "train-runs with fl.rounds=10**12 in a run",
    ["fedfactor", "train-runs", *sets([*BASE, *FAST]), "--runs",
     json.dumps([{"out": "a", "set": ["fl.rounds=1000000000000"]}]), "--done", "done.json"])
add(COUNTS, "dirichlet min_train_samples=100000",
    train("partition.kind=dirichlet", "partition.min_train_samples=100000"))
add(COUNTS, "dirichlet_fixed 10**9 train samples a client",
    train("partition.kind=dirichlet_fixed", "partition.samples_per_client.train=1000000000"))
add(COUNTS, "class_groups 10**9 clients a group",
    train("partition.kind=class_groups", "partition.groups=[[0,1],[2,3]]", "partition.clients_per_group=1000000000"))
for item in ["train.rounds=1000000000000", "data.clients=1000000000", "data.d=1000000000"]:
    add(COUNTS, f"simulate {item}", ["fedfactor", "simulate", "--config", *SIMULATION,
                                     *sets([*SIMULATION_TINY, item]), "--out", "sim"])

# -- devices ----------------------------------------------------------------------------------

for device in ["mps", "cuda", "cuda:0", "cuda:99", "cuda:-1", "meta", "xla", "hip", "vulkan", "mps:0", "nope", "",
               "1"]:
    add(DEVICES, f"fl.device={device}", train(f"fl.device={device}"))
add(DEVICES, "--gpus 1 with fl.device=cuda", [*train("fl.device=cuda"), "--gpus", "1", "--gpu-locks", "locks"])
add(DEVICES, "--threads -1", [*train(), "--threads", "-1"])

# -- divergence: a run that starts and keeps no update -------------------------------------------

for name, items in {
    "skip, lr 1e6": ["fl.on_divergence=skip", "fl.lr=1e6", "fl.momentum=0", "fl.rounds=2"],
    "skip, max_loss 1e-9": ["fl.on_divergence=skip", "fl.max_loss=1e-9", "fl.rounds=2"],
    "skip, max_loss 1e-9, local": ["fl.on_divergence=skip", "fl.max_loss=1e-9", "method.name=local"],
    "skip, lr 1e6, half the clients a round": ["fl.on_divergence=skip", "fl.lr=1e6", "fl.momentum=0",
                                               "fl.fraction=0.5", "fl.rounds=2"],
    "skip, max_loss 1e-9, tracked": ["fl.on_divergence=skip", "fl.max_loss=1e-9", "tracking.enabled=true",
                                     "tracking.uri=sqlite:///t.db"],
}.items():
    add(DIVERGENCE, name, train(*items), expect=1)

# -- rerun of a finished run: refused before anything in its folder is deleted ------------------


def _kept(damage: Callable[[Path], object]) -> Setup:
    """The finished run that kept its checkpoint, as run/, with `damage` applied to that folder."""
    def setup(folder: Path, t: Templates) -> None:
        shutil.copytree(t.root / "kept", folder / "run")
        damage(folder / "run")
    return setup


class _Hostile:
    """Unpickled, it creates the file it names: a checkpoint that runs code when loaded."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _nan_checkpoint(run: Path) -> None:
    """Every float of the clients' and the server's states NaN, saved as a sound checkpoint."""
    import torch

    def nan(obj):
        if isinstance(obj, dict):
            return {k: nan(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [nan(v) for v in obj]
        return torch.full_like(obj, float("nan")) if torch.is_tensor(obj) and obj.is_floating_point() else obj

    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    for part in ("states", "server"):
        ckpt["simulator"][part] = nan(ckpt["simulator"][part])
    torch.save(ckpt, run / "checkpoint.pt")


def _replace(name: str, make: Callable[[Path], object]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        (run / name).unlink()
        make(run / name)
    return damage


def _save_hostile(path: Path) -> None:
    import torch

    torch.save(_Hostile(path.parent / "pwned"), path)


def _plain_pickle(run: Path) -> None:
    import pickle

    (run / "checkpoint.pt").write_bytes(pickle.dumps({"version": 1}))


_RERUN = ["fedfactor", "train", *sets(KEPT_RUN), "--out", "run"]
_RERUN_RUNS = ["fedfactor", "train-runs", *sets(KEPT_RUN), "--runs", json.dumps([{"out": "run"}]), "--done", "d.json"]
for name, damage in {
    "truncated": _truncate("checkpoint.pt"),
    "empty": _set_file("checkpoint.pt", b""),
    "random bytes": _set_file("checkpoint.pt", np.random.default_rng(0).bytes(4096)),
    "a folder": _replace("checkpoint.pt", Path.mkdir),
    "a plain pickle": _plain_pickle,
    "a hostile pickle": _replace("checkpoint.pt", _save_hostile),
    "NaN weights": _nan_checkpoint,
}.items():
    add(RERUN, f"kept checkpoint {name}", _RERUN, _kept(damage), forbidden=["run/pwned"], kept=["run/summary.json"])
for argv, name, make in [(_RERUN, "a folder", Path.mkdir), (_RERUN_RUNS, "a folder", Path.mkdir),
                         (_RERUN_RUNS, "a named pipe", os.mkfifo)]:
    add(RERUN, f"{argv[1]}: summary.json is {name}", argv, _kept(_replace("summary.json", make)),
        forbidden=["d.json"], kept=["run/checkpoint.pt", "run/metrics.csv"])


# --------------------------------------------------------------------------------------------
# running and classifying


@dataclass
class Result:
    case: Case
    outcome: str
    status: int | None  # None: timed out
    seconds: float
    last_line: str
    new_paths: list[str] = field(default_factory=list)


def _paths(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def classify(case: Case, status: int | None, output: str, stderr: str, new: list[str], folder: Path) -> str:
    """The outcome of one case: see the module docstring. `output` is stdout and stderr together."""
    if status is None:
        return "hang"
    if "Traceback (most recent call last)" in output:
        return "traceback"
    if status == 0:
        return "clean" if case.expect == 0 and re.search(case.reported, output) else "wrong success"
    forbidden = [p for p in case.forbidden if (folder / p).exists()]
    lost = [p for p in case.kept if not (folder / p).exists()]
    if forbidden or lost or (case.expect == 2 and new):
        return "leftover"
    if case.snakemake:  # Snakemake exits 1 for every error
        # Snakemake prints its own lines around ours: our message names the study file; or it is the
        # schema's validation error, or Snakemake's own for a file that is no mapping (it parses
        # --configfile before the Snakefile runs)
        ok = any(line.startswith(f"{folder}/study.yaml: ") for line in output.splitlines()) \
            or "Error validating config file" in output \
            or "Config file must be given as JSON or YAML with keys at top level" in output
        return "clean" if ok else "other"
    if status != case.expect:  # a signal (negative), or 1 for 2
        return "other"
    if case.reported and not re.search(case.reported, output):
        return "other"
    lines = stderr.strip().splitlines()
    prefix = PREFIXES[case.expect]
    ok = bool(lines) and lines[-1].startswith(prefix) and stderr.count(prefix) == 1
    return "clean" if ok else "other"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def case_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
    for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        env[key] = REFUSING_PROXY
    env.pop("no_proxy", None)
    env.pop("NO_PROXY", None)
    return env


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_subprocess(case: Case, folder: Path, t: Templates, timeout: float) -> Result:
    """Run one case as a process in `folder` (set up here), with a timeout; classify it."""
    folder.mkdir(parents=True)
    if case.setup is not None:
        case.setup(folder, t)
    before = _paths(folder)
    args = case.args(folder, t)
    cmd = [sys.executable, "-m", "snakemake" if case.snakemake else "fedfactor", *args[1:]]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO if case.snakemake else folder, env=case_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                            start_new_session=True, preexec_fn=None if case.snakemake else _limit_memory)
    try:
        out, err = proc.communicate(timeout=timeout)
        status: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        status = None
    seconds = time.monotonic() - start
    new = sorted(_paths(folder) - before) if folder.exists() else []
    outcome = classify(case, status, out + err, err, new, folder)
    return Result(case, outcome, status, seconds, _last_line(err if not case.snakemake else out + err), new)


class _Alarm(Exception):
    pass


@contextlib.contextmanager
def _guards(seconds: int) -> Iterator[None]:
    """SIGALRM after `seconds` (a hang fails instead of hanging) and an address-space limit (a case
    that allocates tens of GiB raises MemoryError instead of taking the machine)."""
    def ring(signum, frame):
        raise _Alarm(f"still running after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, ring)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    vm = int(re.search(r"VmSize:\s+(\d+) kB", Path("/proc/self/status").read_text())[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (min(vm + 4 * 2**30, hard) if hard != resource.RLIM_INFINITY
                                            else vm + 4 * 2**30, hard))
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run_in_process(case: Case, folder: Path, t: Templates, timeout: int = 60) -> Result:
    """Run one fedfactor case through `fedfactor.cli.main` in this process, in `folder` (set up
    here) as the working directory, with the network refused; classify it. Exceptions that escape
    main() (a traceback in a real run) propagate, so that a test shows them."""
    from urllib.error import URLError

    from fedfactor.cli import main

    assert not case.snakemake, case.id
    folder.mkdir(parents=True, exist_ok=True)
    if case.setup is not None:
        case.setup(folder, t)
    before = _paths(folder)
    args = case.args(folder, t)
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    start = time.monotonic()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _guards(timeout), \
                mock.patch("urllib.request.urlopen", side_effect=URLError("the network is refused in tests")):
            try:
                status = main(args[1:])
            except SystemExit as e:  # argparse
                status = e.code if isinstance(e.code, int) else 1
    finally:
        os.chdir(cwd)
    new = sorted(_paths(folder) - before)
    outcome = classify(case, status, out.getvalue() + err.getvalue(), err.getvalue(), new, folder)
    return Result(case, outcome, status, time.monotonic() - start, _last_line(err.getvalue()), new)


def _folder_name(i: int, case: Case) -> str:
    return f"{i:03d}-" + re.sub(r"[^A-Za-z0-9._=-]+", "_", case.id)[:80]


def select(classes: list[str] | None = None, keyword: str | None = None) -> list[Case]:
    chosen = [c for c in CASES if not classes or c.klass in classes]
    if keyword:
        chosen = [c for c in chosen if keyword.lower() in f"{c.klass} {c.id}".lower()]
    return chosen


def counts_table(results: list[Result]) -> str:
    lines = ["| input class | cases | clean | tracebacks | wrong successes | hangs | leftovers | other |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for klass in [*CLASSES, "all"]:
        rs = [r for r in results if klass == "all" or r.case.klass == klass]
        if not rs:
            continue
        n = [sum(r.outcome == o for r in rs) for o in OUTCOMES]
        name = "**all**" if klass == "all" else klass
        lines.append(f"| {name} | {len(rs)} | " + " | ".join(map(str, n)) + " |")
    return "\n".join(lines)


def failures_list(results: list[Result]) -> str:
    lines = []
    for klass in CLASSES:
        bad = [r for r in results if r.case.klass == klass and r.outcome != "clean"]
        if not bad:
            continue
        lines.append(f"\n### {klass}\n")
        for r in bad:
            detail = r.last_line or "(no output)"
            if r.outcome == "leftover":
                detail += f" [left: {', '.join(r.new_paths[:4]) or ', '.join(r.case.forbidden)}]"
            lines.append(f"- `{r.case.id}` ({r.outcome}, exit {r.status}): {detail}")
    return "\n".join(lines)


def _write_results(out: Path, results: list[Result], header: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "class", "outcome", "expected", "status", "seconds", "last_line", "new_paths", "argv"])
        for r in results:
            w.writerow([r.case.id, r.case.klass, r.outcome, r.case.expect, r.status, f"{r.seconds:.1f}", r.last_line,
                        " ".join(r.new_paths[:10]), shlex.join(r.case.argv)[:500]])
    (out / "results.md").write_text(f"{header}\n\n{counts_table(results)}\n\n## Not clean\n{failures_list(results)}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m probes.inputs", description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    p.add_argument("--timeout", type=float, default=60, help="seconds before a case counts as a hang (default 60)")
    p.add_argument("--load", type=int, default=0, metavar="N", help="N busy-loop processes beside the cases")
    p.add_argument("--class", dest="classes", action="append", choices=CLASSES, metavar="CLASS",
                   help="only this input class (repeatable): " + "; ".join(CLASSES))
    p.add_argument("-k", dest="keyword", help="only cases whose class or id contains this text")
    p.add_argument("--out", type=Path, help="write results.csv and results.md here")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    args = p.parse_args(argv)
    cases = select(args.classes, args.keyword)
    if args.list:
        for c in cases:
            print(f"{c.klass}\t{c.id}\texit {c.expect}\t{shlex.join(c.argv)[:200]}")
        print(f"{len(cases)} cases", file=sys.stderr)
        return 0
    if not cases:
        print("no case selected", file=sys.stderr)
        return 2
    started = time.monotonic()
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        with tempfile.TemporaryDirectory(prefix="fedfactor-probe-") as tmp, readonly_folder(Path(tmp)) as ro, \
                full_folder(Path(tmp)) as full:
            print(f"building templates in {tmp} ...", file=sys.stderr, flush=True)
            t = Templates(build_templates(Path(tmp) / "templates"), ro, full)
            if ro is None:
                print("no read-only folder can be made here: its cases are left out", file=sys.stderr)
                cases = [c for c in cases if not c.needs_readonly]
            if full is None:
                print("no full file system can be made here: its cases are left out", file=sys.stderr)
                cases = [c for c in cases if not c.needs_full]
            results: list[Result] = []
            with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
                futures = [pool.submit(run_subprocess, c, Path(tmp) / "cases" / _folder_name(i, c), t, args.timeout)
                           for i, c in enumerate(cases)]
                for n, fut in enumerate(concurrent.futures.as_completed(futures), 1):
                    r = fut.result()
                    results.append(r)
                    print(f"[{n}/{len(cases)}] {r.outcome:13s} {r.seconds:5.1f} s  {r.case.id}", file=sys.stderr,
                          flush=True)
    finally:
        for proc in load:
            proc.kill()
            proc.wait()
    order = {c.id: i for i, c in enumerate(CASES)}
    results.sort(key=lambda r: order[r.case.id])
    header = (f"# Probe of bad inputs\n\n{len(results)} cases, {args.jobs} at once, {args.load} busy-loop processes "
              f"beside them, timeout {args.timeout:g} s: {time.monotonic() - started:.0f} s in all, on "
              f"{os.cpu_count()} cores.")
    print(header)
    print()
    print(counts_table(results))
    bad = [r for r in results if r.outcome != "clean"]
    if bad:
        print("\n## Not clean")
        print(failures_list(results))
    if args.out:
        _write_results(args.out, results, header)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""The probe of plausible bugs: one small change to the science at a time, and whether the fast tier sees it.

    python -m probes.bugs [--jobs 2] [-k TEXT] [--tests "-m 'not slow'"] [--out FILE]

Each bug is the kind of one- or two-line change a tired contributor makes: an evaluation before the
round's training, a random state not restored on resume, a constant of a baseline changed, a weight
dropped from an average. Mutation testing (docs/testing.md) changes operators at random; these are
chosen for what would silently change a paper table. For each bug the package is copied to a scratch
folder, the change is made there (the working tree is never touched), and the fast tier runs
against the copy (`PYTHONPATH`), stopping at its first failure. A bug is caught when a test fails.

The table it prints (and `--out` writes as CSV) is what docs/testing.md reports.
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Bug:
    name: str
    path: str  # under src/fedfactor
    old: str  # must occur exactly once in the file
    new: str


BUGS = [
    Bug("scored before the round's local training", "run/simulator.py",
        "            loss, skipped = self.run_round(rnd)\n            self.scoring_round = rnd\n            scored = {}\n"
        "            if rnd % self.cfg.fl.eval_every == 0 or rnd == R:\n                with self.stoppable_phase():\n"
        "                    scored = self.evaluate((\"test\", \"val\") if has_val else (\"test\",))\n",
        "            scored = {}\n            if rnd % self.cfg.fl.eval_every == 0 or rnd == R:\n"
        "                with self.stoppable_phase():\n"
        "                    scored = self.evaluate((\"test\", \"val\") if has_val else (\"test\",))\n"
        "            loss, skipped = self.run_round(rnd)\n            self.scoring_round = rnd\n"),
    Bug("resume does not restore torch's random state", "run/simulator.py",
        'torch.set_rng_state(rng["torch"])', 'rng["torch"]'),
    Bug("resume one round off", "run/simulator.py",
        'self.round = int(ckpt["round"])', 'self.round = int(ckpt["round"]) - 1'),
    Bug("tuning's val_score reads the test split", "run/summary.py",
        '"val_score": (last.val.mean if last.val else None)', '"val_score": (last.test.mean if last.val else None)'),
    Bug("FedAvg weighs clients equally, not by train size", "run/simulator.py",
        "weights[k] = float(self.ctx.train_sizes[k])", "weights[k] = 1.0"),
    Bug("clients sampled the same every round", "run/simulator.py",
        "derive_seed(self.cfg.seed, rnd, 2**31)", "derive_seed(self.cfg.seed, 2**31)"),
    Bug("eval.model=trained scores the received model", "run/simulator.py",
        'if self.cfg.eval.model == "trained":', 'if self.cfg.eval.model != "trained":'),
    Bug("weighted mean divides by the count", "fl/state.py",
        "(t / self.weight)", "(t / self.count)"),
    Bug("gradients never zeroed", "fl/train.py",
        "opt.zero_grad(set_to_none=True)", "pass"),
    Bug("a phase trains what it should freeze", "fl/train.py",
        "p.requires_grad_(n in names)", "p.requires_grad_(True)"),
    Bug("bytes down counted as bytes up", "fl/comm.py",
        "self.round_down += nbytes(payload)", "self.round_up += nbytes(payload)"),
    Bug("Factorized-FL's L1 acts in the as-run mode", "methods/factorized_fl.py",
        'self.hp.l1_mode == "paper" and self.hp.l1 > 0', 'self.hp.l1_mode == "official" and self.hp.l1 > 0'),
    Bug("Factorized-FL matches on u, not v", "methods/factorized_fl.py",
        'key = f"{self.match_layer}.v"\n        return None', 'key = f"{self.match_layer}.u"\n        return None'),
    Bug("FedDecomp's two phases swapped", "methods/feddecomp.py",
        "phases = [Phase(params=self.tau_keys, epochs=self.hp.e_lora),\n"
        "                  Phase(params=self.sigma_group, epochs=E - self.hp.e_lora)]",
        "phases = [Phase(params=self.sigma_group, epochs=E - self.hp.e_lora),\n"
        "                  Phase(params=self.tau_keys, epochs=self.hp.e_lora)]"),
    Bug("FedRep trains the body before the head", "methods/fedrep.py",
        "[Phase(params=self.head, epochs=self.hp.head_epochs), Phase(params=self.body, epochs=self.ctx.epochs)]",
        "[Phase(params=self.body, epochs=self.ctx.epochs), Phase(params=self.head, epochs=self.hp.head_epochs)]"),
    Bug("FedPer shares its personal layers", "methods/fedper.py",
        "return [k for k in self.ctx.float_keys if k not in personal]", "return list(self.ctx.float_keys)"),
    Bug("FedProx's term is mu, not mu/2", "methods/fedprox.py",
        "0.5 * self.hp.mu", "self.hp.mu"),
    Bug("pFedGate's sparsity default changed", "methods/pfedgate.py",
        "sparsity: Float = Field(0.5,", "sparsity: Float = Field(0.3,"),
    Bug("FedCAC's beta default changed", "methods/fedcac.py",
        "beta: Count = Field(100,", "beta: Count = Field(50,"),
    Bug("FedFac shares the personal units", "methods/fedfac.py",
        "mask = split(fa.communalities, self.hp.tau)", "mask = ~split(fa.communalities, self.hp.tau)"),
    Bug("FedFomo's weights not normalised", "methods/fedfomo.py",
        "return w / w.sum() if w.sum() > 0 else w", "return w"),
    Bug("communality from loadings, not their squares", "analysis/factor.py",
        "communalities = full.pow(2).sum(1).clamp(0, 1)", "communalities = full.abs().sum(1).clamp(0, 1)"),
    Bug("a class's last samples dropped by the partition", "data/partition_kinds.py",
        "    cuts[-1] = n  # float error", "    # cuts[-1] = n  # float error"),
    Bug("every client gets the same label permutation", "data/partition_labels.py",
        "random.Random(permutation_seed + client)", "random.Random(permutation_seed)"),
    Bug("a claim with one reproduced comparison is reproduced", "report/claims.py",
        "return WITHIN_NOISE if WITHIN_NOISE in verdicts else REPRODUCED",
        "return REPRODUCED if REPRODUCED in verdicts else WITHIN_NOISE"),
    Bug("Student's t-test where seeds do not pair", "report/claims.py",
        "stats.ttest_ind(xa, xb, equal_var=False)", "stats.ttest_ind(xa, xb, equal_var=True)"),
    Bug("the train/val/test cut follows the run seed", "run/clients.py",
        "cfg.data.split_mode, seed=cfg.data.seed,", "cfg.data.split_mode, seed=cfg.seed,"),
    Bug("FedDecomp's R_c and R_l swapped", "methods/feddecomp.py",
        "decompose(model, self.hp.conv_ratio, self.hp.linear_ratio,", "decompose(model, self.hp.linear_ratio, self.hp.conv_ratio,"),
    Bug("chance unweighted under best_weighted", "run/summary.py",
        'return scores.weighted if report == "best_weighted" else scores.mean', "return scores.mean"),
    Bug("tuning's budget leaves out the batch size", "study/tuning.py",
        '"fl.rounds", "fl.epochs", "fl.batch_size", "fl.clients", "fl.fraction")',
        '"fl.rounds", "fl.epochs", "fl.clients", "fl.fraction")'),
    Bug("validation accuracy no longer sent to MLflow", "run/job.py",
        'if k != "round"}, step=rec.round)', 'if k not in ("round", "val_accuracy_mean")}, step=rec.round)'),
]


def apply(bug: Bug, src: Path) -> None:
    """Make `bug`'s change in the package under `src` (a copy)."""
    path = src / "fedfactor" / bug.path
    text = path.read_text()
    if not bug.old:  # the null bug: nothing changed
        return
    if text.count(bug.old) != 1:
        raise SystemExit(f"probes.bugs: {bug.name!r}: the text to change occurs {text.count(bug.old)} times in "
                         f"{bug.path} (the code moved: update the bug)")
    path.write_text(text.replace(bug.old, bug.new))


def run(bug: Bug, tests: list[str], jobs: int) -> tuple[bool, float, str]:
    """(caught, seconds, the first failing test) of the fast tier against a copy with `bug`."""
    with tempfile.TemporaryDirectory(prefix="fedfactor-bug-") as tmp:
        # The package finds the workflow, configs and schemas beside src/: link them into the copy.
        for entry in REPO.iterdir():
            if entry.name not in ("src", ".git", ".venv"):
                (Path(tmp) / entry.name).symlink_to(entry)
        src = Path(tmp) / "src"
        shutil.copytree(REPO / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
        apply(bug, src)
        start = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", str(jobs),
                            *tests], cwd=REPO, capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(src)})
        seconds = time.perf_counter() - start
    failed = next((line.split()[1] for line in r.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))), "")
    if r.returncode not in (0, 1):  # 2+: collection errors, interrupted: the bug broke import, which is caught
        failed = failed or f"pytest exit {r.returncode}"
    return r.returncode != 0, seconds, failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m probes.bugs", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers (default 2)")
    p.add_argument("-k", default="", help="only the bugs whose name contains this text")
    p.add_argument("--tests", default="-m 'not slow'", help="pytest's arguments (default: the fast tier)")
    p.add_argument("--out", type=Path, help="also write the table as CSV")
    p.add_argument("--null", action="store_true", help="run the tests against an unchanged copy (must pass)")
    args = p.parse_args(argv)
    if args.null:
        caught, seconds, failed = run(Bug("none", "__init__.py", "", ""), shlex.split(args.tests), args.jobs)
        print(f"unchanged copy: {'FAILED ' + failed if caught else 'passed'} ({seconds:.0f} s)")
        return int(caught)
    bugs = [b for b in BUGS if args.k.lower() in b.name.lower()]
    for bug in bugs:  # every change must still apply before anything runs
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "fedfactor" / bug.path).parent.mkdir(parents=True)
            shutil.copy(REPO / "src" / "fedfactor" / bug.path, Path(tmp) / "fedfactor" / bug.path)
            apply(bug, Path(tmp))
    rows = []
    for i, bug in enumerate(bugs, 1):
        caught, seconds, failed = run(bug, shlex.split(args.tests), args.jobs)
        rows.append({"bug": bug.name, "module": bug.path, "caught": caught, "seconds": round(seconds, 1),
                     "first_failure": failed})
        print(f"[{i}/{len(bugs)}] {'caught' if caught else 'MISSED'}  {bug.name} ({bug.path}, {seconds:.0f} s)"
              + (f": {failed}" if failed else ""), flush=True)
    caught = sum(r["caught"] for r in rows)
    print(f"{caught} of {len(rows)} caught")
    if args.out:
        with args.out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0 if caught == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())

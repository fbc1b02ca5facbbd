"""Mutation scores per module from mutmut's results, as BENCHMARKS.md reports them.

    python -m probes.mutation [FOLDER]

mutmut 3 keeps each mutated file's results in `mutants/src/.../FILE.py.meta` (JSON: an exit code
per mutant) and prints them one mutant at a time; this sums them per module. FOLDER is where
`mutmut run` ran (default: this checkout). Exit codes, as mutmut reads them: 1 killed (a test
failed), 0 survived, 33 no test reaches the mutant, 24, 36 and 152 timed out (counted as killed:
the mutant broke the code badly enough to hang it), none not run yet.

A module's score is killed (timeouts included) over the mutants run; the mutants no fast test
reaches are survivors too, and are shown apart because the fix differs (a test that reaches the
code, not a sharper assertion).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KILLED, SURVIVED, NO_TESTS = 1, 0, 33
TIMEOUTS = {24, 36, 152, -24, -9}


def scores(folder: Path) -> list[dict]:
    """One row per mutated module: mutants, run, killed, survived, no tests, score (% or None)."""
    root = folder / "mutants" / "src" / "fedfactor"
    rows = []
    for meta in sorted(root.rglob("*.py.meta")):
        codes = list(json.loads(meta.read_text())["exit_code_by_key"].values())
        if not codes:
            continue
        c = Counter("not run" if v is None else "killed" if v == KILLED or v in TIMEOUTS else
                    "survived" if v == SURVIVED else "no tests" if v == NO_TESTS else "other" for v in codes)
        run = len(codes) - c["not run"]
        rows.append({"module": str(meta.relative_to(root))[: -len(".meta")], "mutants": len(codes), "run": run,
                     "killed": c["killed"], "survived": c["survived"], "no tests": c["no tests"],
                     "other": c["other"], "score": 100 * c["killed"] / run if run else None})
    return rows


def markdown(rows: list[dict], complete_only: bool = False) -> str:
    out = ["| module | mutants | killed | survived | no test reaches | score |", "|---|---|---|---|---|---|"]
    for r in rows:
        if complete_only and r["run"] < r["mutants"]:
            continue
        score = "not run" if r["score"] is None else f"{r['score']:.1f} %"
        if 0 < r["run"] < r["mutants"]:
            score += f" ({r['run']} of {r['mutants']} run)"
        out.append(f"| `{r['module']}` | {r['mutants']} | {r['killed']} | {r['survived']} | {r['no tests']} | {score} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m probes.mutation", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", nargs="?", type=Path, default=REPO, help="where mutmut ran (default: this checkout)")
    p.add_argument("--complete", action="store_true", help="only the modules whose every mutant has run")
    args = p.parse_args(argv)
    rows = scores(args.folder)
    if not rows:
        print(f"probes.mutation: no mutmut results under {args.folder / 'mutants'}; run mutmut first "
              "(docs/testing.md)", file=sys.stderr)
        return 2
    print(markdown(rows, args.complete))
    total = Counter()
    for r in rows:
        total.update({k: r[k] for k in ("mutants", "run", "killed", "survived", "no tests")})
    print(f"\n{total['run']} of {total['mutants']} mutants run: {total['killed']} killed, {total['survived']} "
          f"survived, {total['no tests']} reached by no fast test")
    return 0


if __name__ == "__main__":
    sys.exit(main())

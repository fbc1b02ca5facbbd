"""The plan's CPU hours against a run's own: `fedfactor plan` times a few local steps and the scoring
of one sample of each run group through the run's Trainer (fedfactor.study.plan.step_cost) and multiplies
them by the group's local steps and scored samples. Here runs of the default study (config/config.yaml)
are trained in this process, one CPU thread, and their CPU time is set against the plan's for them.
ratio = the factor between them either way (measured / planned or its inverse, whichever is larger),
meant to be at most 1.5. CPU time
(time.process_time), not the clock's: a busy machine inflates the clock, not the work.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from .common import row

DESCRIPTION = "the plan's CPU seconds a run against a run's measured CPU seconds (default study, one thread)"

ROOT = Path(__file__).resolve().parent.parent
METHODS = ["fedavg", "factorized_fl_beta", "simfed", "feddecomp"]  # a plain one and the seed methods' three costs


def run(quick: bool, device: str) -> list[dict[str, Any]]:
    import torch

    from fedfactor.data.facts import dataset_facts
    from fedfactor.study import plan
    from fedfactor.run.job import train

    if device not in ("cpu", "auto"):
        return []  # the plan's CPU hours are for the CPU
    torch.set_num_threads(1)
    study = plan.read_study([ROOT / "config" / "config.yaml"])
    specs = {s.name: s for s in plan.study_runs(study) if s.kind == "final"}
    rows = []
    for method in METHODS[:1] if quick else METHODS:
        spec = specs[f"dir0.5/{method}"]
        cfg = plan._run_config(str(ROOT / study["run_config"]), [*spec.sets, "tracking.enabled=false", "seed=0"])
        facts = dataset_facts(cfg.data.name, cfg.data.root)
        g = plan._group(cfg, facts, "k", spec.name, timed=True)
        g.steps, g.scored = plan.local_steps(cfg, facts), plan.scored_samples(cfg, facts)
        planned = plan.group_hours(g, "cpu")[0] * 3600
        with tempfile.TemporaryDirectory() as tmp:
            cfg.partition.file = None
            start = time.process_time()
            train(cfg, Path(tmp) / "run")
            measured = time.process_time() - start
        factor = max(measured / planned, planned / measured)
        rows.append(row(f"{spec.name}: CPU seconds a run", measured, "s", factor, "<= 1.5",
                        f"planned {planned:.1f} s ({'under' if measured > planned else 'over'}); the default "
                        "study's run config, seed 0, one thread"))
    return rows

"""Per-client overhead: a FedAvg round of many clients holding a few samples each against one client
holding all of them.

Both simulators train the same model on the same number of samples, in batches of the same size
(10, so both take the same number of SGD steps of the same shape); what the many-client round
spends beyond the one-client round is what the loop costs per client (state copies, optimizer
set-up, downloads, uploads, the average over many uploads). The round's time is also split over the
method's hooks, so it shows where that time goes. Evaluation is timed apart, outside the round.

"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Callable


from .common import client_sets, describe_sets, row, synchronize, timed, write_npz

DESCRIPTION = ("per-client overhead: FedAvg round of K clients x 10 samples vs 1 client x 10K samples "
               "(same model, batch, steps), and where the round's time goes")

HOOKS = ("download", "receive", "local_train", "upload", "aggregate")


class HookTimer:
    """Seconds spent in each of a simulator's method hooks, by wrapping the bound methods of the instance."""

    def __init__(self, sim: Any, device: str):
        self.device = device
        self.seconds = dict.fromkeys(HOOKS, 0.0)
        for name in HOOKS:
            setattr(sim.method, name, self._timed(name, getattr(sim.method, name)))

    def _timed(self, name: str, fn: Callable) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                synchronize(self.device)  # attribute queued GPU work to the hook that queued it
                self.seconds[name] += time.perf_counter() - start

        return wrapper

    def reset(self) -> None:
        self.seconds = dict.fromkeys(HOOKS, 0.0)


def run(quick: bool, device: str) -> list[dict]:
    from fedfactor.config import load_config
    from fedfactor.run.simulator import Simulator

    many_k, per_client = (100, 10) if quick else (1000, 10)
    total = many_k * per_client
    with tempfile.TemporaryDirectory() as tmp:
        npz = write_npz(Path(tmp) / "clients.npz", n_train=total, n_test=many_k)
        note = f"{total} train + {many_k} test random 8x8 images, 10 classes (benchmarks/clients.py write_npz)"
        # Each client gets one test sample, the single client all of them: evaluation scores the same samples.
        # "batched": the many clients trained as one vmapped computation (fl.batch_clients=true), which
        # `auto` picks on a GPU; on a CPU it runs the CNN's convolutions grouped.
        setups = {"many": (many_k, per_client, 1, "false"), "one": (1, total, many_k, "false"),
                  "batched": (many_k, per_client, 1, "true")}
        sims, timers, inputs = {}, {}, {}
        for key, (k, n, t, batched) in setups.items():
            sets = [*client_sets(npz, k, n, t, device), "method.name=fedavg", f"fl.batch_clients={batched}"]
            sims[key] = Simulator(load_config(None, sets))
            timers[key] = HookTimer(sims[key], device)
            inputs[key] = describe_sets(sets, note)
        # Warm-up round, then the timed one, alternating the two so that a busy machine slows both alike.
        round_s, eval_s = {}, {}
        for rnd in (1, 2):
            for key, sim in sims.items():
                timers[key].reset()
                round_s[key] = timed(lambda: sim.run_round(rnd), device)
        for key, sim in sims.items():
            eval_s[key] = timed(sim.evaluate, device)

    name = {"many": f"{many_k} clients x {per_client} samples", "one": f"1 client x {total} samples",
            "batched": f"{many_k} clients x {per_client} samples, batched"}
    rows = [
        row(f"{name['many']}: round", round_s["many"], "s", round_s["many"] / round_s["one"], "<= 1.5", inputs["many"]),
        row(f"{name['batched']}: round", round_s["batched"], "s", round_s["batched"] / round_s["one"], "<= 1.5",
            inputs["batched"]),
        row(f"{name['one']}: round", round_s["one"], "s", None, None, inputs["one"]),
        row("extra time per client", 1e3 * (round_s["many"] - round_s["one"]) / (many_k - 1), "ms", None, None,
            f"(many - one) / {many_k - 1}, E=1, batch 10, FedAvg, cnn"),
    ]
    for key in ("many", "one"):
        hooks = timers[key].seconds
        for hook in HOOKS:
            rows.append(row(f"{name[key]}: {hook}", hooks[hook], "s", hooks[hook] / round_s[key], None,
                            "time in the method hook during the timed round; ratio = share of the round"))
        rest = round_s[key] - sum(hooks.values())
        rows.append(row(f"{name[key]}: rest of the loop", rest, "s", rest / round_s[key], None,
                        "sampling, meter, commit: the round minus its hooks; ratio = share of the round"))
    rows.append(row(f"{name['many']}: evaluate", eval_s["many"], "s", eval_s["many"] / eval_s["one"], None,
                    f"sim.evaluate() after the rounds, not in the round; one test sample per client, the same "
                    f"{many_k} samples in both; ratio = many / one"))
    rows.append(row(f"{name['one']}: evaluate", eval_s["one"], "s", None, None, "sim.evaluate() after the rounds"))
    return rows

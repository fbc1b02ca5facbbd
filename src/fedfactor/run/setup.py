"""A run set up once: its config as read, and the method that config names, built from it.

`cfg.method` stays data in the config (`{"name": ..., hyperparameters...}`, the layer below the
methods cannot type it); the run's one `build` turns it into the method object, its hyperparameters
typed and checked, and writes every default back into the config the run records. Whoever runs a
config (the CLI, a workflow job, `fedfactor plan`) sets it up here, and passes the setup on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import Config, load_config
from ..methods import Method, build


@dataclass(frozen=True)
class RunSetup:
    cfg: Config  # its `method`: the spec with every default filled in, as the run's config.yaml records it
    method: Method  # built from that spec, not yet bound to a run (the simulator binds it)


def set_up(cfg: Config) -> RunSetup:
    """The run `cfg` describes, its method built: a bad hyperparameter is a UsageError naming it,
    before anything is written. `cfg` itself is left as it was."""
    method = build(cfg.method)
    return RunSetup(cfg.model_copy(update={"method": method.spec}), method)


def read_run(path: str | Path | None, sets: list[str]) -> RunSetup:
    """A run config file (None: the defaults) with `--set` overrides, set up."""
    return set_up(load_config(path, sets))

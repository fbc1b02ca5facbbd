"""Federated methods, one small file each, registered by name.

To add one: write methods/<name>.py with a subclass of `Method` (methods/base.py, which is FedAvg)
that overrides only the hooks that differ, declares its hyperparameters as a `Params` subclass,
registers it with `@METHODS.register(name, description)`, and import the module below.
"""

from typing import Any, Mapping

from . import (  # noqa: F401  (registration side effects)
    agnostic_fl, clustered_fl, factorized_fl, fedamp, fedavg, fedbn, fedcac, feddecomp, fedem, fedfac, fedfomo, fedper,
    fedprox, fedrep, fedrod, lg_fedavg, local, per_fedavg, pfedgate, pfedpara, pfedsd, simfed,
)
from .base import METHODS, Context, Method  # noqa: F401


def build(spec: Mapping[str, Any]) -> Method:
    """The method a config's `method` ({"name": ..., hyperparameters...}) names, its hyperparameters
    typed and checked: the one check of a method, a UsageError naming what is wrong. `.spec` is the
    spec with every default filled in, as a run's config records it."""
    method = METHODS.get(spec["name"])(**{k: v for k, v in spec.items() if k != "name"})
    method.spec = {"name": spec["name"], **method.hp.model_dump()}
    return method

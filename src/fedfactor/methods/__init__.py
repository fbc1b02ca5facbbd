"""Federated methods, one small file each, registered by name.

To add one: write methods/<name>.py with a subclass of `Method` (methods/base.py, which is FedAvg)
that overrides only the hooks that differ, register it with `@METHODS.register(name, description)`,
and import the module below.
"""

from ..registry import Registry

METHODS = Registry("method")

from . import factorized_fl, fedavg, feddecomp, fedfac, fedprox, local, simfed  # noqa: E402,F401  (registration side effects)
from .base import Context, Method  # noqa: E402,F401

"""Parameterised layers: a layer computes its `.weight` from factors (Factorized-FL, FedDecomp, ...)."""

from .factorized import LAYOUTS, Factorized, factorize, factorized_layers, to_weight

__all__ = ["LAYOUTS", "Factorized", "factorize", "factorized_layers", "to_weight"]

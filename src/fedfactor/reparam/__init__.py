"""Parameterised layers: a layer computes its `.weight` from factors (Factorized-FL, FedDecomp, FedPara, ...)."""

from .factorized import LAYOUTS, Factorized, Reparameterized, factorize, factorized_layers, replace_layers, to_weight
from .hadamard import Hadamard, gamma_for_share, hadamard_layers, hadamardize, rank_bounds, rank_for

__all__ = ["LAYOUTS", "Factorized", "Hadamard", "Reparameterized", "factorize", "factorized_layers", "gamma_for_share",
           "hadamard_layers", "hadamardize", "rank_bounds", "rank_for", "replace_layers", "to_weight"]

"""FedPer (Arivazhagan et al. 2019, "Federated Learning with Personalization Layers").

The model is cut into base layers, shared and averaged as in FedAvg, and the top `personal_layers`
layers (the "personalization layers"), which every client keeps and trains on its own data.
Everything else travels as in FedAvg, BatchNorm running statistics of the base included.

Choices the paper leaves open: docs/methods/fedper.md
"""

from __future__ import annotations

from pydantic import model_validator

from ..errors import UsageError
from ..models import unit_entries, weight_layers
from .base import METHODS, Count, Method, Params as BaseParams


def check_layer_count(key: str, count: int, L: int | None = None) -> None:
    """`count` top layers must leave at least one layer below them; L, the model's layers, once known."""
    if count < 1 or (L is not None and count > L - 1):
        top = "L-1 (L: the model's Conv2d/Linear layers)" if L is None else f"{L - 1} (this model has {L} layers)"
        raise UsageError(f"method.{key} must be in 1..{top} (got {count})")


def top_layer_entries(model, count: int, key: str) -> list[str]:
    """The state entries of the model's top `count` numbered layers; `key` names the hyperparameter."""
    layers = weight_layers(model)
    check_layer_count(key, count, len(layers))
    return [e for i in range(len(layers) - count + 1, len(layers) + 1) for e in unit_entries(model, layers[i])]


@METHODS.register("fedper", "FedPer (Arivazhagan et al. 2019): the top layers (the classifier by default) stay "
                  "personal, the base is averaged as in FedAvg")
class FedPer(Method):
    class Params(BaseParams):
        personal_layers: Count = 1  # the top layers each client keeps (001 5.1: the last one)

        @model_validator(mode="after")
        def _check(self):
            check_layer_count("personal_layers", self.personal_layers)  # the upper end once the model is known
            return self

    hp: Params

    def shared_keys(self) -> list[str]:
        personal = set(top_layer_entries(self.ctx.model, self.hp.personal_layers, "personal_layers"))
        if self.ctx.head_local:
            personal |= set(self.ctx.head_keys)
        return [k for k in self.ctx.float_keys if k not in personal]

"""LG-FedAvg (Liang et al. 2020, "Think Locally, Act Globally: Federated Learning with Local and
Global Representations").

Each client keeps its lower layers local; only the top `global_layers` layers (the classifier by
default) form the global model, averaged as in FedAvg. New clients use an ensemble.

Choices the paper leaves open: docs/methods/lg_fedavg.md
"""

from __future__ import annotations

from typing import Callable

from pydantic import model_validator

from ..errors import UsageError
from ..fl.state import State
from .base import METHODS, Count, Method, Params as BaseParams
from .fedper import check_layer_count, top_layer_entries


@METHODS.register("lg_fedavg", "LG-FedAvg (Liang et al. 2020): lower layers local, the top layers (the classifier "
                  "by default) averaged; new clients use an ensemble")
class LGFedAvg(Method):
    class Params(BaseParams):
        global_layers: Count = 1  # the top layers that are averaged (official code and FL-bench default)

        @model_validator(mode="after")
        def _check(self):
            check_layer_count("global_layers", self.global_layers)  # the upper end once the model is known
            return self

    hp: Params

    def shared_keys(self) -> list[str]:
        shared = set(top_layer_entries(self.ctx.model, self.hp.global_layers, "global_layers"))
        if self.ctx.head_local:
            shared -= set(self.ctx.head_keys)
            if not shared:
                raise UsageError(f"method.global_layers={self.hp.global_layers} shares only the classifier, which "
                                 "stays local here (clients map classes to outputs differently); use "
                                 "method.global_layers >= 2")
        return [k for k in self.ctx.float_keys if k in shared]

    def new_client_models(self, server: dict, k: int, fresh: State,
                          members: Callable[[], list[State]]) -> dict[str, State | list[State]]:
        return {**super().new_client_models(server, k, fresh, members), "ensemble": members()}

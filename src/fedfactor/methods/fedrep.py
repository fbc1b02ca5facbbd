"""FedRep (Collins et al. 2021, "Exploiting Shared Representations for Personalized Federated Learning").

The body (the representation) is shared and averaged; the head (the classifier) is always
personal. A round of local training is two phases (Algorithm 1): the head trains with the body
frozen for `head_epochs` epochs, then the body trains with the head frozen; the client uploads
the body only.

Choices the paper leaves open: docs/methods/fedrep.md
"""

from __future__ import annotations

from typing import Callable, cast

from pydantic import model_validator

from ..fl.state import State
from ..fl.train import Phase
from .base import METHODS, Count, Method, Params as BaseParams, at_least


@METHODS.register("fedrep", "FedRep (Collins et al. 2021): shared body, personal head; each round trains the head "
                  "with the body frozen, then the body with the head frozen")
class FedRep(Method):
    class Params(BaseParams):
        head_epochs: Count = 10  # the FedRep paper's ten head epochs per round

        @model_validator(mode="after")
        def _check(self):
            at_least("head_epochs", self.head_epochs, 1)
            return self

    hp: Params

    def bind(self, ctx) -> None:
        super().bind(ctx)
        self.head = [p for p in ctx.param_keys if p in ctx.head_keys]
        self.body = [p for p in ctx.param_keys if p not in ctx.head_keys]

    def shared_keys(self) -> list[str]:
        return [k for k in self.ctx.float_keys if k not in self.ctx.head_keys]

    def plan(self, k: int, state: State, received: State) -> list[Phase]:
        return [Phase(params=self.head, epochs=self.hp.head_epochs), Phase(params=self.body, epochs=self.ctx.epochs)]

    def new_client_models(self, server: dict, k: int, fresh: State,
                          members: Callable[[], list[State]]) -> dict[str, State | list[State]]:
        models = super().new_client_models(server, k, fresh, members)
        received = cast(State, models["received"])  # the base's received model is one state
        trained, _ = self.ctx.fit(k, received, [Phase(params=self.head, epochs=self.hp.head_epochs)])
        # Training mode moves BatchNorm running statistics even in a frozen body: put the body back.
        return {**models, "localtrain": {**trained, **{key: received[key] for key in self.shared}}}

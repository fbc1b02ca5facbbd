"""FedAvg, written as the four hooks every other method overrides a few of.

A method never touches the network: the round loop calls `download` and `upload` and counts
whatever they return, so communication cost is measured from what is sent.

    download(server, k) -> payload      what client k receives (personalised per client if needed)
    receive(k, state, payload) -> state how the client merges it into its own state (pure)
    local_train(k, received) -> loss    how the client trains (parameter groups, extra loss terms)
    upload(k, state) -> payload         what client k sends (which parameters are shared)
    aggregate(server, uploads, weights) how the server combines uploads into its state

All state is plain dicts of tensors: `server` is a dict the method owns, client states are model
state dicts the simulator keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Mapping

import torch

from ..errors import UsageError
from ..fl.state import State, clone, select, weighted_average


@dataclass
class Context:
    """What the simulator tells a method about the run."""

    model: torch.nn.Module  # the one model object shared by all clients
    num_clients: int
    train_sizes: list[int]
    float_keys: list[str]  # floating-point state entries: parameters and BatchNorm statistics
    head_keys: list[str]  # the classifier's state entries
    head_local: bool  # labels permuted or class groups differ: the head is never aggregated
    epochs: int
    # train(k, parameters, epochs, loss_term) -> mean loss; runs on the model as loaded for client k
    train: Callable[..., float]

    def parameters(self, keys: Iterable[str] | None = None) -> list[torch.nn.Parameter]:
        named = dict(self.model.named_parameters())
        return list(named.values()) if keys is None else [named[k] for k in keys if k in named]


class Method:
    name = "fedavg"
    # Hyperparameters with their defaults; `method.<key>` in the config overrides them.
    defaults: dict[str, Any] = {}

    def __init__(self, ctx: Context, **params: Any):
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            valid = ", ".join(self.defaults) or "none"
            raise UsageError(f"method {self.name!r} has no parameter {unknown[0]!r}; valid: {valid}")
        self.ctx = ctx
        self.hp = SimpleNamespace(**{**self.defaults, **params})
        personal = set(ctx.head_keys) if ctx.head_local else set()
        self.shared = [k for k in ctx.float_keys if k not in personal]

    # -- server side ---------------------------------------------------------------------------
    def init_server(self, init_state: Mapping[str, torch.Tensor]) -> dict:
        return {"global": clone(select(init_state, self.shared))}

    def download(self, server: dict, k: int) -> State:
        return dict(server["global"])

    def aggregate(self, server: dict, uploads: dict[int, State], weights: dict[int, float]) -> dict:
        payloads = [u for u in uploads.values() if u]
        if payloads:
            server["global"] = weighted_average(payloads, [weights[k] for k, u in uploads.items() if u])
        return server

    # -- client side ---------------------------------------------------------------------------
    def receive(self, k: int, state: State, payload: State) -> State:
        return {**state, **payload}

    def local_train(self, k: int, received: State) -> float:
        return self.ctx.train(k, self.ctx.parameters(), self.ctx.epochs)

    def upload(self, k: int, state: State) -> State:
        return select(state, self.shared)

    def evaluation_state(self, server: dict, k: int, state: State) -> State:
        """The model client k holds between rounds: its state merged with what the server sends.

        For FedAvg this is the global model (with the client's own head where heads are local);
        for Stand-Alone the client's own model.
        """
        return self.receive(k, state, self.download(server, k))

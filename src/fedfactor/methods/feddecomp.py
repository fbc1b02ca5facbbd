"""FedDecomp (Wu et al., ACM MM 2024; paper 004) and its ablations.

Every Conv2d and Linear becomes theta = sigma + tau: sigma full rank and shared, tau = B A low rank
and private. A round trains tau for E_lora epochs, then sigma for fl.epochs - E_lora (Algorithm 1);
clients upload sigma, the server averages it uniformly (eq. 7).

Choices the paper leaves open, variants and diagnostics: docs/methods/feddecomp.md
"""

from __future__ import annotations

from typing import Annotated, cast

import torch
from pydantic import model_validator
from torch import nn

from ..errors import UsageError
from ..fl.state import State, clone, select
from ..fl.train import Phase, derive_seed
from ..reparam.lowrank import STYLES, Style, decompose, lowrank_layers
from .base import METHODS, Count, Float, Method, Params as BaseParams, at_least, one_of, variant


@METHODS.register("feddecomp", "FedDecomp (004): theta = shared full-rank sigma + private low-rank tau, "
                  "tau trained first, then sigma")
class FedDecomp(Method):
    recurrent_refused = ("its low-rank tau is added to Conv2d and Linear weights only, so the LSTM weights would be "
                         "shared whole, with no personal part")

    class Params(BaseParams):
        e_lora: Count = 2  # E_lora: epochs on tau per round; E_global = fl.epochs - e_lora
        # alternating (eqs. 5-6) | simultaneous (Table 3)
        training: Annotated[str, one_of("alternating", "simultaneous")] = "alternating"
        # sigma | tau (FedDecomp_Reverse) | all | none (Table 4)
        share: Annotated[str, one_of("sigma", "tau", "all", "none")] = "sigma"
        # official (as run) | paper (the text): tau's shapes, rank rule, init, scale
        style: Annotated[str, one_of(*STYLES)] = "official"
        conv_ratio: Float = 0.8  # R_c (Table 2's best for CIFAR-100 and Tiny-ImageNet; 0.6 for CIFAR-10)
        linear_ratio: Float = 0.4  # R_l (0.6 for CIFAR-10)
        linear_rank: Count = 0  # > 0: this rank for every fully connected tau instead of R_l (official Linear_r)
        # uniform (eq. 7, the official code) | samples (FedAvg's)
        weighting: Annotated[str, one_of("uniform", "samples")] = "uniform"

        @model_validator(mode="after")
        def _check(self):
            for key in ("conv_ratio", "linear_ratio"):
                if not 0 < getattr(self, key) <= 1:
                    raise UsageError(f"method.{key} must be in (0, 1] (got {getattr(self, key)})")
            at_least("e_lora", self.e_lora, 0)
            at_least("linear_rank", self.linear_rank, 0)
            return self

    hp: Params

    def prepare_model(self, model: nn.Module) -> nn.Module:
        # A's draws come from their own stream, derived from the seed the simulator set for the model
        generator = torch.Generator().manual_seed(derive_seed(torch.initial_seed(), 4004))
        return decompose(model, self.hp.conv_ratio, self.hp.linear_ratio, self.hp.linear_rank,
                         cast(Style, self.hp.style), generator)

    def bind(self, ctx) -> None:
        if self.hp.training == "alternating" and self.hp.e_lora > ctx.epochs:
            raise UsageError(f"method.e_lora={self.hp.e_lora} exceeds the {ctx.epochs} local epochs (fl.epochs)")
        self.layers = lowrank_layers(ctx.model)
        self.tau_keys = [f"{n}.{p}" for n in self.layers for p in ("tau_b", "tau_a")]
        self.sigma_keys = [f"{n}.weight" for n in self.layers]
        tau = set(self.tau_keys)
        self.sigma_group = [k for k in ctx.param_keys if k not in tau]  # what the sigma phase trains
        self._moved: list[tuple[torch.Tensor, torch.Tensor]] = []  # this round's (||tau_i||, ||sigma_i - sigma0||)
        super().bind(ctx)

    def shared_keys(self) -> list[str]:
        personal = set(self.ctx.head_keys) if self.ctx.head_local else set()
        tau = set(self.tau_keys)
        share = self.hp.share
        if share == "sigma" and self.hp.training == "alternating" and self.hp.e_lora == self.ctx.epochs:
            share = "none"  # E_global = 0: sigma never trains, nothing is worth sending
        keep = {"sigma": lambda k: k not in tau, "tau": lambda k: k in tau,
                "all": lambda k: True, "none": lambda k: False}[share]
        return [k for k in self.ctx.float_keys if k not in personal and keep(k)]

    # -- server ----------------------------------------------------------------------------------
    def init_server(self, init_state):
        # Called with the run's initial state in every process, a resumed one included.
        self.sigma0 = clone(select(init_state, self.sigma_keys))
        return super().init_server(init_state)

    def aggregate(self, server: dict, uploads: dict[int, State], weights: dict[int, float]) -> dict:
        if self.hp.weighting == "uniform":
            weights = dict.fromkeys(weights, 1.0)
        server = super().aggregate(server, uploads, weights)
        self._log_round(server, uploads)
        return server

    # -- client ----------------------------------------------------------------------------------
    def plan(self, k: int, state: State, received: State) -> list[Phase]:
        E = self.ctx.epochs
        if self.hp.training == "simultaneous":
            return [Phase(epochs=E)]
        phases = [Phase(params=self.tau_keys, epochs=self.hp.e_lora),
                  Phase(params=self.sigma_group, epochs=E - self.hp.e_lora)]
        return [p for p in phases if p.epochs]

    def upload(self, k: int, state: State) -> State:
        # Recorded here, from the trained state every uploading client passes through, rather than in
        # local_train, which the simulator's batched path does not call per client.
        self._moved.append((self._tau_norm(state), _distance(state, self.sigma0, self.sigma_keys)))
        return super().upload(k, state)

    # -- diagnostics -----------------------------------------------------------------------------
    def _tau_norm(self, state: State) -> torch.Tensor:
        squares = [layer.tau(state[f"{n}.tau_b"], state[f"{n}.tau_a"]).square().sum() for n, layer in self.layers.items()]
        return torch.stack(squares).sum().sqrt()

    def _log_round(self, server: dict, uploads: dict[int, State]) -> None:
        moved, self._moved = self._moved, []
        if moved:
            self.ctx.log("feddecomp.delta_tau", torch.stack([t for t, _ in moved]).mean())
        shared_sigma = [k for k in self.sigma_keys if k in self.shared]
        payloads = [u for u in uploads.values() if u]
        if shared_sigma and payloads:
            mean = server["global"]
            self.ctx.log("feddecomp.sigma_distance",
                         torch.stack([_distance(u, mean, shared_sigma) for u in payloads]).mean())
            self.ctx.log("feddecomp.delta_sigma", _distance(mean, self.sigma0, shared_sigma))
        elif moved:
            self.ctx.log("feddecomp.delta_sigma", torch.stack([s for _, s in moved]).mean())


def _distance(a: State, b: State, keys: list[str]) -> torch.Tensor:
    """||a - b||_2 over the entries `keys`, taken together as one vector."""
    return torch.stack([(a[k].double() - b[k].double()).square().sum() for k in keys]).sum().sqrt()


variant(FedDecomp, "feddecomp_text",
        "FedDecomp with tau as the paper's text writes it (eqs. 3-4: its shapes, no 1/r scale; ablation of the "
        "as-run default)",
        style="paper")
variant(FedDecomp, "feddecomp_simultaneous",
        "FedDecomp training sigma and tau together for E epochs (004 Table 3)",
        training="simultaneous")
variant(FedDecomp, "feddecomp_reverse",
        "FedDecomp_Reverse: shares the low-rank tau, keeps the full-rank sigma (004 Table 5)",
        share="tau")
variant(FedDecomp, "feddecomp_lowrank_fedavg",
        "FedAvg w/ Low-Rank: sigma + tau trained together, all shared (004 Table 4)",
        training="simultaneous", share="all")
variant(FedDecomp, "feddecomp_lowrank_local",
        "Local w/ Low-Rank: sigma + tau trained together, nothing shared (004 Table 4)",
        training="simultaneous", share="none")

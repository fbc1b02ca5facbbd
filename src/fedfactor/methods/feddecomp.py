"""FedDecomp (Wu et al., ACM MM 2024; paper 004) and its ablations.

Every Conv2d and Linear becomes theta = sigma + tau (`fedfactor.nn.decompose`): sigma full rank and
shared, tau = B A low rank and private. A round (Algorithm 1): the client takes the global sigma,
trains tau for E_lora epochs with everything else frozen (eq. 5), then sigma for
E_global = fl.epochs - E_lora epochs with tau frozen (eq. 6), each phase with a fresh optimizer (the
official code builds new SGD optimizers every round); it uploads sigma and keeps tau; the server
averages sigma uniformly over the clients (eq. 7; `weighting: samples` weighs by train size).

Choices the paper leaves open, settled as the official code (XinghaoWu/FedDecomp) does:
- "sigma" is everything that is not tau: the layers' weights, biases and BatchNorm. The tau phase
  trains only the factors (BatchNorm affine frozen, its running statistics still updating in train
  mode); the sigma phase trains all the rest; BatchNorm affine parameters and running statistics are
  averaged with sigma.
- Shapes, rank, initialisation and scale of tau: `style` (official, the default: the code behind the
  paper's numbers | paper, the text, as the variant `feddecomp_text`), `conv_ratio` (R_c),
  `linear_ratio` (R_l) and `linear_rank` (the official absolute `Linear_r`), see nn/lowrank.py.
- E_lora: 2 of E = 5 by default, the official `local_p_ep`; the paper does not say which value its
  tables use (Figure 5 sweeps it).

Special cases (section 3.4): E_lora = 0 is FedAvg (tau stays zero; with `weighting: samples` the
same numbers as `fedavg`); E_global = 0 is local training with low-rank parameters: nothing is sent
(the official code would still average BatchNorm running statistics).

Variants: `training: simultaneous` trains sigma and tau together for E epochs (Table 3);
`share: tau` shares the low-rank factors and keeps sigma (FedDecomp_Reverse, Table 5; the phases
are unchanged, "other training strategy is the same"); `share: all` / `none` with simultaneous
training are Table 4's "FedAvg w/ Low-Rank" and "Local w/ Low-Rank".

Diagnostics, per round: `feddecomp.sigma_distance`, the mean over uploading clients of
||sigma_i - mean sigma||_2 over the decomposed layers' shared weights (004 Figure 6);
`feddecomp.delta_sigma` = ||mean sigma^t - sigma^0||_2 (the clients' own sigma, averaged, when
sigma is not shared) and `feddecomp.delta_tau`, the mean over the round's trained clients of
||tau_i^t - tau^0||_2 = ||tau_i^t||_2 (Table 6 reads them at the last round). Norms run over all
decomposed layers' matrices together, tau in the weight's layout and scale.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import UsageError
from ..fl.state import State, clone, select
from ..fl.train import Phase, derive_seed
from ..nn.lowrank import STYLES, decompose, lowrank_layers
from .base import Method, variant
from . import METHODS


@METHODS.register("feddecomp", "FedDecomp (004): theta = shared full-rank sigma + private low-rank tau, "
                  "tau trained first, then sigma")
class FedDecomp(Method):
    name = "feddecomp"
    defaults: dict[str, Any] = {
        "e_lora": 2,  # E_lora: epochs on tau per round; E_global = fl.epochs - e_lora
        "training": "alternating",  # alternating (eqs. 5-6) | simultaneous (Table 3)
        "share": "sigma",  # sigma | tau (FedDecomp_Reverse) | all | none (Table 4)
        "style": "official",  # official (as run) | paper (the text): tau's shapes, rank rule, init, scale
        "conv_ratio": 0.8,  # R_c (Table 2's best for CIFAR-100 and Tiny-ImageNet; 0.6 for CIFAR-10)
        "linear_ratio": 0.4,  # R_l (0.6 for CIFAR-10)
        "linear_rank": 0,  # > 0: this rank for every fully connected tau instead of R_l (official Linear_r)
        "weighting": "uniform",  # uniform (eq. 7, the official code) | samples (FedAvg's)
    }
    CHOICES = {"training": ("alternating", "simultaneous"), "share": ("sigma", "tau", "all", "none"),
               "style": STYLES, "weighting": ("uniform", "samples")}

    @classmethod
    def validate_params(cls, params):
        hp = super().validate_params(params)
        for key in ("conv_ratio", "linear_ratio"):
            if not 0 < hp[key] <= 1:
                raise UsageError(f"method.{key} must be in (0, 1] (got {hp[key]})")
        for key in ("e_lora", "linear_rank"):
            if hp[key] < 0:
                raise UsageError(f"method.{key} must be >= 0 (got {hp[key]})")
        return hp

    def prepare_model(self, model: nn.Module) -> nn.Module:
        # A's draws come from their own stream, derived from the seed the simulator set for the model
        generator = torch.Generator().manual_seed(derive_seed(torch.initial_seed(), 4004))
        return decompose(model, self.hp.conv_ratio, self.hp.linear_ratio, self.hp.linear_rank, self.hp.style,
                         generator)

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


def _variant(name: str, description: str, **changes: Any) -> type:
    return variant(name, description, FedDecomp, **changes)


_variant("feddecomp_text", "FedDecomp with tau as the paper's text writes it (eqs. 3-4: its shapes, no 1/r scale; "
         "ablation of the as-run default)", style="paper")
_variant("feddecomp_simultaneous", "FedDecomp training sigma and tau together for E epochs (004 Table 3)",
         training="simultaneous")
_variant("feddecomp_reverse", "FedDecomp_Reverse: shares the low-rank tau, keeps the full-rank sigma (004 Table 5)",
         share="tau")
_variant("feddecomp_lowrank_fedavg", "FedAvg w/ Low-Rank: sigma + tau trained together, all shared (004 Table 4)",
         training="simultaneous", share="all")
_variant("feddecomp_lowrank_local", "Local w/ Low-Rank: sigma + tau trained together, nothing shared (004 Table 4)",
         training="simultaneous", share="none")

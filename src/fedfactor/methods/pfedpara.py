"""pFedPara (Hyeon-Woo, Ye-Bin and Oh, ICLR 2022), the personalised FedPara; a baseline of 000 Table 1.

Every Conv2d and Linear becomes a low-rank Hadamard layer W = W_1 o (W_2 + 1) (`fedfactor.reparam.hadamard`):
the factors of W_1 are global (sent, sample-weighted mean on the server as FedAvg), those of W_2
personal (never leave the client). 002 C.1 describes it so and its Table 5 counts C2S = S2C = U + V,
the shared factors only. Clients train all their parameters together for the run's epochs and
optimizer (Flower's baselines/fedpara, which reproduces the paper).

Choices the paper leaves open: docs/methods/pfedpara.md
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator
from torch import nn

from ..errors import UsageError
from ..reparam import gamma_for_share, hadamard_layers, hadamardize
from ..reparam.hadamard import INITS
from .base import METHODS, Float, Method, Params as BaseParams, one_of


@METHODS.register("pfedpara", "pFedPara (Hyeon-Woo et al., ICLR 2022): low-rank Hadamard layers W1 o (W2 + 1); "
                  "W1's factors shared, W2's kept local")
class PFedPara(Method):
    recurrent_refused = ("its Hadamard layers replace Conv2d and Linear weights only (FedPara's own LSTM "
                         "parameterisation is not implemented), so the LSTM weights would have no personal part")

    class Params(BaseParams):
        capacity: Float = Field(0.95, gt=0, le=1)  # parameter share of the original model (002 C.2: 90-99 %)
        gamma: int | float | None = None  # FedPara's rank ratio in [0, 1]; when set it replaces capacity
        share_other: bool = False  # also share biases and BatchNorm (parameters and statistics)
        # fedpara: He-normal factors (the authors' code) | scaled: at the replaced layer's scale
        init: Annotated[str, one_of(*INITS)] = "fedpara"

        @field_validator("gamma", mode="before")
        @classmethod
        def _gamma(cls, gamma):
            if gamma is not None and (isinstance(gamma, bool) or not isinstance(gamma, (int, float))
                                      or not 0 <= gamma <= 1):
                raise UsageError(f"method.gamma must be a number in [0, 1] or null (got {gamma!r})")
            return gamma

    hp: Params

    def prepare_model(self, model: nn.Module) -> nn.Module:
        gamma = self.hp.gamma
        if gamma is None:
            try:
                gamma, _ = gamma_for_share(model, self.hp.capacity)
            except ValueError as e:
                raise UsageError(f"method.capacity: {e}") from None
        return hadamardize(model, float(gamma), personal=True, init=self.hp.init)

    def bind(self, ctx) -> None:
        layers = hadamard_layers(ctx.model)
        self.global_keys = [f"{n}.{p}" for n, m in layers.items() for p in m.factor_names(1)]
        self.personal_keys = [f"{n}.{p}" for n, m in layers.items() for p in m.factor_names(2)]
        super().bind(ctx)

    def shared_keys(self) -> list[str]:
        head = set(self.ctx.head_keys) if self.ctx.head_local else set()
        if self.hp.share_other:
            personal = set(self.personal_keys) | head
            return [k for k in self.ctx.float_keys if k not in personal]
        return [k for k in self.global_keys if k not in head]

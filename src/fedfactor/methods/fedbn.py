"""FedBN (Li et al. 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization").

Every BatchNorm layer stays with its client: its affine parameters (weight, bias) and its running
statistics (mean, variance) are never sent; everything else is FedAvg (size-weighted averaging of
all other parameters, the run's local training).

Choices the paper leaves open: docs/methods/fedbn.md
"""

from __future__ import annotations

import logging

from torch import nn

from .base import METHODS, Method

log = logging.getLogger("fedfactor")


def batchnorm_entries(model: nn.Module) -> list[str]:
    """The floating-point state entries of every BatchNorm module of `model`."""
    keys = []
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            prefix = f"{name}." if name else ""
            own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
            keys += [prefix + k for k, t in own if t.is_floating_point()]
    return keys


@METHODS.register("fedbn", "FedBN (Li et al. 2021): FedAvg with every BatchNorm layer (affine parameters and "
                  "running statistics) kept local")
class FedBN(Method):
    def shared_keys(self) -> list[str]:
        local = set(batchnorm_entries(self.ctx.model))
        if not local:
            log.warning("fedbn: the model has no BatchNorm layer, so FedBN shares what FedAvg shares")
        return [k for k in super().shared_keys() if k not in local]

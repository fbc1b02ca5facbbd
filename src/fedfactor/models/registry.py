"""The model registry: `MODELS` (name -> factory), `HeadedModel` and `build_model`.

The model files (nets.py, vision.py, resnets.py) register their factories here; importing
`fedfactor.models` imports them all, so every name is in `MODELS` before `build_model` looks it up.
"""

from __future__ import annotations

import numbers
from typing import Callable

import torch
from torch import nn

from ..errors import UsageError
from ..registry import Registry
from .pretrained import check_pretrained, load_imagenet_weights

# (channels, height, width, num_classes, multiplier=1.0): every layer's width times multiplier
ModelFactory = Callable[..., nn.Module]
MODELS: Registry[ModelFactory] = Registry("model")


class HeadedModel(nn.Module):
    """body (features) -> head (nn.Linear classifier)."""

    head_name = "head"

    def __init__(self, body: nn.Module, head: nn.Linear):
        super().__init__()
        self.body = body
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def scaled(n: int, multiplier: float) -> int:
    """A layer's `n` channels or units at `multiplier` times the width: at least 1."""
    return max(1, round(n * multiplier))


def build_model(
    name: str, channels: int, height: int, width: int, num_classes: int, pretrained: bool = False,
    width_multiplier: float = 1.0,
) -> nn.Module:
    """Build a freshly initialised model; the caller seeds torch beforehand.

    pretrained: load torchvision's ImageNet weights into all but the head (resnet18, vgg16 only).
    width_multiplier: every hidden layer's channels or units times this (every factory's `multiplier`).
    """
    factory = MODELS.get(name)
    sizes = {"channels": channels, "height": height, "width": width, "num_classes": num_classes}
    for what, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise UsageError(f"model {what} must be an integer >= 1 (got {value!r})")
    if pretrained:
        check_pretrained(name, channels)
        if width_multiplier != 1.0:
            raise UsageError(f"the ImageNet weights of {name} fit its full width only; set model.pretrained: false "
                             f"or model.width_multiplier: 1 (got {width_multiplier})")
    model = factory(*(int(v) for v in sizes.values()), multiplier=width_multiplier)
    if pretrained:
        load_imagenet_weights(name, model)
    return model

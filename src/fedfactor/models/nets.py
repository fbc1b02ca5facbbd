"""The backbones: ResNet-9 (Factorized-FL), a McMahan-style CNN and an MLP (FedFac's: vision.py).

Every model keeps its classifier in `self.head` (a final nn.Linear) and everything else in
`self.body`, so personalisation methods can split a state dict by the "head." prefix.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import UsageError
from .registry import MODELS, HeadedModel, scaled


def conv_bn(
    c_in: int, c_out: int, kernel: int = 3, stride: int = 1, padding: int = 1
) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(),
    )


class Residual(nn.Module):
    def __init__(self, *layers: nn.Module):
        super().__init__()
        self.f = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.f(x)


def _resnet9_out_size(size: int) -> int:
    """Spatial size after ResNet-9's conv2 (stride 2), max-pool and unpadded conv8."""
    return ((size - 1) // 2 + 1) // 2 - 2


def resnet9_min_input() -> int:
    return next(s for s in range(1, 64) if _resnet9_out_size(s) >= 1)


@MODELS.register("resnet9", "ResNet-9 of the Factorized-FL supplement (Table 4), 2.57M weights")
def resnet9(channels: int, height: int, width: int, num_classes: int, multiplier: float = 1.0) -> nn.Module:
    if min(_resnet9_out_size(height), _resnet9_out_size(width)) < 1:
        m = resnet9_min_input()
        raise UsageError(
            f"resnet9 needs inputs of at least {m}x{m} pixels (got {height}x{width}); "
            "use the cnn or mlp model for smaller images"
        )
    c1, c2, c3 = (scaled(c, multiplier) for c in (64, 128, 256))
    body = nn.Sequential(
        conv_bn(channels, c1, kernel=3, stride=1, padding=1),
        conv_bn(c1, c2, kernel=5, stride=2, padding=2),
        Residual(conv_bn(c2, c2), conv_bn(c2, c2)),
        conv_bn(c2, c3, kernel=3, padding=1),
        nn.MaxPool2d(2),
        Residual(conv_bn(c3, c3), conv_bn(c3, c3)),
        conv_bn(c3, c3, kernel=3, stride=1, padding=0),
        nn.AdaptiveMaxPool2d(1),
        nn.Flatten(),
    )
    return HeadedModel(body, nn.Linear(c3, num_classes))


@MODELS.register("cnn", "McMahan-style CNN: 2 conv (32, 64, 5x5) + 2 FC (512); 8x8 and up")
def cnn(channels: int, height: int, width: int, num_classes: int, multiplier: float = 1.0) -> nn.Module:
    if height < 4 or width < 4:
        raise UsageError(f"cnn needs inputs of at least 4x4 pixels (got {height}x{width})")
    c1, c2, h = (scaled(c, multiplier) for c in (32, 64, 512))
    body = nn.Sequential(
        nn.Conv2d(channels, c1, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * (height // 4) * (width // 4), h),
        nn.ReLU(),
    )
    return HeadedModel(body, nn.Linear(h, num_classes))


@MODELS.register("cnn_bn", "CNN with BatchNorm: 2 conv_bn (16, 32, 3x3) + FC 64; the default study's model")
def cnn_bn(channels: int, height: int, width: int, num_classes: int, multiplier: float = 1.0) -> nn.Module:
    # The papers train BatchNorm ResNets (Factorized-FL's ResNet-9, FedDecomp's ResNet-8/10), and
    # BatchNorm changes what sharing means (FedBN, Factorized-FL's shared affine, FedDecomp's averaged
    # statistics). This keeps that regime at a size where a 20-client digits run takes seconds: the
    # ResNet-9's conv_bn blocks, two of them, and one hidden layer for FedFac to split.
    if height < 4 or width < 4:
        raise UsageError(f"cnn_bn needs inputs of at least 4x4 pixels (got {height}x{width})")
    c1, c2, h = (scaled(c, multiplier) for c in (16, 32, 64))
    body = nn.Sequential(
        conv_bn(channels, c1),
        nn.MaxPool2d(2),
        conv_bn(c1, c2),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * (height // 4) * (width // 4), h),
        nn.ReLU(),
    )
    return HeadedModel(body, nn.Linear(h, num_classes))


@MODELS.register("mlp", "MLP: flatten, one hidden layer of 200 ReLU units")
def mlp(channels: int, height: int, width: int, num_classes: int, multiplier: float = 1.0) -> nn.Module:
    h = scaled(200, multiplier)
    body = nn.Sequential(
        nn.Flatten(), nn.Linear(channels * height * width, h), nn.ReLU()
    )
    return HeadedModel(body, nn.Linear(h, num_classes))

"""FedDecomp's ResNet-8 (CIFAR-10) and ResNet-10 (CIFAR-100, Tiny-ImageNet).

The official code (XinghaoWu/FedDecomp, models/LoraResnet1.py) builds torchvision's ResNet with one
BasicBlock per stage: ResNet-8 has three stages of 64, 128, 256 channels, ResNet-10 four of 64, 128,
256, 512, and both keep ImageNet's stem (7x7 stride-2 conv, BatchNorm, ReLU, 3x3 stride-2 max-pool)
even on 32x32 images, which the stages then see at 8x8. That produced the paper's numbers, so
`resnet8` and `resnet10` are that architecture; `resnet8_cifar` and `resnet10_cifar` swap the stem
for the usual CIFAR one (3x3 stride-1 conv, no max-pool), an option the paper does not use.

As in the official code: convolutions start Kaiming-normal (fan_out, ReLU), BatchNorm at weight 1
and bias 0, the classifier with nn.Linear's default; projections (the 1x1 downsample convs) are
listed in `projections`, so layer numbers count the residual convs only.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from .registry import MODELS, HeadedModel, scaled


def _stem(channels: int, style: str, out: int) -> list[tuple[str, nn.Module]]:
    if style == "imagenet":
        conv = nn.Conv2d(channels, out, kernel_size=7, stride=2, padding=3, bias=False)
        pool = [("maxpool", nn.MaxPool2d(kernel_size=3, stride=2, padding=1))]
    else:
        conv = nn.Conv2d(channels, out, kernel_size=3, stride=1, padding=1, bias=False)
        pool = []
    return [("conv1", conv), ("bn1", nn.BatchNorm2d(out)), ("relu", nn.ReLU(inplace=True)), *pool]


def small_resnet(widths: tuple[int, ...], channels: int, num_classes: int, stem: str = "imagenet",
                 multiplier: float = 1.0) -> HeadedModel:
    """One BasicBlock per stage of `widths` channels (times `multiplier`); every stage after the first
    halves the size."""
    # imported here: torchvision.models costs every job over a second to import (models/vision.py)
    from torchvision.models.resnet import BasicBlock, conv1x1

    inplanes = scaled(64, multiplier)
    parts = _stem(channels, stem, inplanes)
    for i, width in enumerate(scaled(w, multiplier) for w in widths):
        stride = 1 if i == 0 else 2
        downsample = None
        if stride != 1 or inplanes != width:
            downsample = nn.Sequential(conv1x1(inplanes, width, stride), nn.BatchNorm2d(width))
        parts.append((f"layer{i + 1}", nn.Sequential(BasicBlock(inplanes, width, stride, downsample))))
        inplanes = width
    parts += [("avgpool", nn.AdaptiveAvgPool2d(1)), ("flatten", nn.Flatten())]
    model = HeadedModel(nn.Sequential(OrderedDict(parts)), nn.Linear(inplanes, num_classes))
    for m in model.body.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    # setattr: nn.Module types the attributes it sets as tensors or modules (weight_layers reads this one)
    setattr(model, "projections", tuple(n for n, _ in model.named_modules() if n.endswith(".downsample.0")))
    return model


RESNET8, RESNET10 = (64, 128, 256), (64, 128, 256, 512)


@MODELS.register("resnet8", "FedDecomp's ResNet-8 (CIFAR-10): 3 stages of one BasicBlock, ImageNet stem")
def resnet8(channels: int, height: int, width: int, num_classes: int, multiplier: float = 1.0) -> nn.Module:
    return small_resnet(RESNET8, channels, num_classes, "imagenet", multiplier)


@MODELS.register("resnet10", "FedDecomp's ResNet-10 (CIFAR-100, Tiny-ImageNet): 4 stages, ImageNet stem")
def resnet10(channels: int, height: int, width: int, num_classes: int, multiplier: float = 1.0) -> nn.Module:
    return small_resnet(RESNET10, channels, num_classes, "imagenet", multiplier)


@MODELS.register("resnet8_cifar", "ResNet-8 with a CIFAR stem (3x3 stride-1 conv, no max-pool)")
def resnet8_cifar(channels: int, height: int, width: int, num_classes: int, multiplier: float = 1.0) -> nn.Module:
    return small_resnet(RESNET8, channels, num_classes, "cifar", multiplier)


@MODELS.register("resnet10_cifar", "ResNet-10 with a CIFAR stem (3x3 stride-1 conv, no max-pool)")
def resnet10_cifar(channels: int, height: int, width: int, num_classes: int, multiplier: float = 1.0) -> nn.Module:
    return small_resnet(RESNET10, channels, num_classes, "cifar", multiplier)

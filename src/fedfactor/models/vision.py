"""The FedFac paper's models: torchvision's ResNet-18 and VGG-16 (BN), and the FEMNIST CNN.

They follow the official FedFac code (ffair/FedFac, `my_models.py`): CIFAR-10 trains
`torchvision.models.resnet18` with `fc` replaced by Linear(512, classes), CIFAR-100 trains
`torchvision.models.vgg16_bn` with `classifier[6]` replaced by Linear(4096, classes), both on 32x32
images with torchvision's ImageNet architecture unchanged (ResNet-18's 7x7 stride-2 stem and
max-pool; VGG's 7x7 adaptive average pool feeding 25088 -> 4096 -> 4096). FEMNIST trains the
official `CNNMnist`. Inside `body` the torchvision modules keep their names, so a torchvision state
dict maps on by putting "body." in front of every key but the classifier's.

At `multiplier` below 1 (model.width_multiplier; the tests' smoke runs) every stage, conv and hidden
fc is that much narrower, built from torchvision's own blocks with the same names and initialisation;
the ImageNet weights fit the full width only.

Layer numbering (`weight_layers`, the indices of FedFac's Lambda):
  resnet18     1 = the stem conv, 2..17 = the convs of the eight residual blocks in order, 18 = head.
               The three 1x1 downsample convs are `projections` and not counted, as in the paper, so
               16, 17 are the last block's two convs (torchvision's layer4.1.conv1, layer4.1.conv2).
               The official code counts the projections and groups each conv with its BatchNorm:
               its `--partial_cnn_layer 19+20` is the paper's and our {16, 17}.
  vgg16        1..13 = the convs, 14 = Linear(25088, 4096), 15 = Linear(4096, 4096), 16 = head;
               the official code numbers 15 the same layer.
  femnist_cnn  1 = conv1, 2 = conv2, 3 = fc1, 4 = head (the official fc2).

The ImageNet weights of resnet18 and vgg16 load through pretrained.py. torchvision.models is imported
only when a model of it is built: the import costs over a second (it pulls in torch._dynamo).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from ..errors import UsageError
from .registry import MODELS, HeadedModel, scaled

if TYPE_CHECKING:
    from torchvision.models import ResNet


def _first_conv_for(conv: nn.Conv2d, channels: int) -> nn.Conv2d:
    """torchvision's first conv, re-made for `channels` input channels (grayscale data, no weights)."""
    if channels == conv.in_channels:
        return conv
    # a Conv2d's sizes are pairs (its padding may be a mode); torch types them as any convolution's tuples
    kernel, stride = cast("tuple[int, int]", conv.kernel_size), cast("tuple[int, int]", conv.stride)
    padding = cast("str | tuple[int, int]", conv.padding)
    new = nn.Conv2d(channels, conv.out_channels, kernel, stride, padding, bias=conv.bias is not None)
    # ResNet and VGG initialise every conv this way; the default init would differ from the rest
    nn.init.kaiming_normal_(new.weight, mode="fan_out", nonlinearity="relu")
    if new.bias is not None:
        nn.init.zeros_(new.bias)
    return new


def _narrow_resnet18(tv: ResNet, multiplier: float) -> None:
    """Re-make torchvision's ResNet-18 `tv` in place with every stage `multiplier` times as wide, by its
    own `_make_layer`: the same modules and names, initialised as torchvision initialises them."""
    from torchvision.models.resnet import BasicBlock

    tv.inplanes = scaled(64, multiplier)  # what _make_layer reads as the next stage's input width
    tv.conv1 = nn.Conv2d(3, tv.inplanes, 7, 2, 3, bias=False)
    tv.bn1 = nn.BatchNorm2d(tv.inplanes)
    for i, planes in enumerate((64, 128, 256, 512)):
        setattr(tv, f"layer{i + 1}", tv._make_layer(BasicBlock, scaled(planes, multiplier), 2, stride=min(i, 1) + 1))
    tv.fc = nn.Linear(scaled(512, multiplier), tv.fc.out_features)
    for m in tv.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")


@MODELS.register("resnet18", "torchvision ResNet-18 (ImageNet stem), as FedFac's CIFAR-10; ImageNet weights")
def resnet18(channels: int, height: int, width: int, num_classes: int, multiplier: float = 1.0) -> nn.Module:
    from torchvision import models

    tv = models.resnet18(num_classes=num_classes)  # its fc keeps nn.Linear's default init: our head
    if multiplier != 1.0:
        _narrow_resnet18(tv, multiplier)
    tv.conv1 = _first_conv_for(tv.conv1, channels)
    # ResNet's stride-2 convs and pools pad enough to keep >= 1 pixel: any input size works
    parts = [(n, m) for n, m in tv.named_children() if n != "fc"] + [("flatten", nn.Flatten())]
    model = HeadedModel(nn.Sequential(OrderedDict(parts)), tv.fc)
    # setattr: nn.Module types the attributes it sets as tensors or modules (weight_layers reads this one)
    setattr(model, "projections", tuple(n for n, _ in model.named_modules() if n.endswith(".downsample.0")))
    return model


VGG16_MIN_INPUT = 2 ** 5  # five 2x2 max-pools, each halving the size (rounding down)


@MODELS.register("vgg16", "torchvision VGG-16 (BN), as FedFac's CIFAR-100; 32x32 and up; ImageNet weights")
def vgg16(channels: int, height: int, width: int, num_classes: int, multiplier: float = 1.0) -> nn.Module:
    m = VGG16_MIN_INPUT
    if height < m or width < m:
        raise UsageError(f"vgg16 needs inputs of at least {m}x{m} pixels (got {height}x{width})")
    from torchvision import models

    if multiplier == 1.0:
        tv = models.vgg16_bn()
        features, avgpool, classifier = tv.features, tv.avgpool, tv.classifier[:6]
    else:
        features, avgpool, classifier = _narrow_vgg16(multiplier)
    features[0] = _first_conv_for(features[0], channels)
    body = nn.Sequential(OrderedDict(features=features, avgpool=avgpool, flatten=nn.Flatten(), classifier=classifier))
    # a fresh nn.Linear, as the official code's replacement of classifier[6] (not VGG's N(0, 0.01))
    return HeadedModel(body, nn.Linear(classifier[3].out_features, num_classes))


def _narrow_vgg16(multiplier: float) -> tuple[nn.Sequential, nn.Module, nn.Sequential]:
    """torchvision's VGG-16 (BN) features, pool and classifier (less its last Linear) with every conv
    and hidden fc `multiplier` times as wide: its own `make_layers` and layout, initialised as VGG
    initialises (built directly: the full-width classifier alone holds 120M weights)."""
    from torchvision.models.vgg import cfgs, make_layers

    features = make_layers([v if v == "M" else scaled(int(v), multiplier) for v in cfgs["D"]], batch_norm=True)
    hidden = scaled(4096, multiplier)
    classifier = nn.Sequential(nn.Linear(scaled(512, multiplier) * 7 * 7, hidden), nn.ReLU(True), nn.Dropout(),
                               nn.Linear(hidden, hidden), nn.ReLU(True), nn.Dropout())
    for m in [*features, *classifier]:
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            assert m.bias is not None  # make_layers builds its convs with a bias
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.01)
            nn.init.zeros_(m.bias)
    return features, nn.AdaptiveAvgPool2d((7, 7)), classifier


def _femnist_cnn_out_size(size: int) -> int:
    """Spatial size after conv1 (5x5, unpadded), max-pool 2, conv2 (5x5, unpadded), max-pool 2."""
    return ((size - 4) // 2 - 4) // 2


def femnist_cnn_min_input() -> int:
    return next(s for s in range(1, 64) if _femnist_cnn_out_size(s) >= 1)


@MODELS.register("femnist_cnn", "FedFac's FEMNIST CNN (official CNNMnist): 2 unpadded 5x5 conv, fc 512, dropout")
def femnist_cnn(channels: int, height: int, width: int, num_classes: int, multiplier: float = 1.0) -> nn.Module:
    """The official CNNMnist without its final Softmax.

    The official code feeds softmax outputs to CrossEntropyLoss, a double softmax; our loss is
    cross-entropy on logits, so the head returns logits.
    """
    h, w = _femnist_cnn_out_size(height), _femnist_cnn_out_size(width)
    if min(h, w) < 1:
        m = femnist_cnn_min_input()
        raise UsageError(f"femnist_cnn needs inputs of at least {m}x{m} pixels (got {height}x{width})")
    c1, c2, fc = (scaled(n, multiplier) for n in (32, 64, 512))
    body = nn.Sequential(
        nn.Conv2d(channels, c1, 5),
        nn.MaxPool2d(2),
        nn.ReLU(),
        nn.Conv2d(c1, c2, 5),
        nn.Dropout2d(0.5),
        nn.MaxPool2d(2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(c2 * h * w, fc),  # 1024 inputs at 28x28
        nn.ReLU(),
        nn.Dropout(0.5),
    )
    return HeadedModel(body, nn.Linear(fc, num_classes))


class _SoftmaxOutput(HeadedModel):
    """A HeadedModel whose forward ends in a Softmax: the cross-entropy then sees probabilities."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(super().forward(x), dim=1)


@MODELS.register("femnist_cnn_softmax", "FedFac's FEMNIST CNN as its code runs it: femnist_cnn with a Softmax "
                 "before the cross-entropy (a double softmax)")
def femnist_cnn_softmax(channels: int, height: int, width: int, num_classes: int,
                        multiplier: float = 1.0) -> nn.Module:
    """femnist_cnn with the official CNNMnist's final Softmax (fc2 = Sequential(Linear, Softmax)): the
    official loss, CrossEntropyLoss, applies a second one. Same weights and numbering as femnist_cnn;
    a method that calls the body and head itself (FedRoD, FedEM's components) sees their logits."""
    # a HeadedModel: MODELS.register types every factory as returning an nn.Module
    plain = cast(HeadedModel, femnist_cnn(channels, height, width, num_classes, multiplier))
    return _SoftmaxOutput(plain.body, plain.head)

"""torchvision's ImageNet weights for FedFac's ResNet-18 and VGG-16 (vision.py).

Pretrained weights (`model.pretrained: true`, `build_model(..., pretrained=True)`): the official
scripts start CIFAR-10's ResNet-18 and CIFAR-100's VGG-16 from torchvision's ImageNet weights, so
those FedFac rows need `model.pretrained: true`; FEMNIST's CNN starts from scratch. Everything but
the classifier is loaded; the head stays freshly initialised for the task's classes, as in the
official code. The weights come through torchvision's weights API, which reads
$TORCH_HOME/hub/checkpoints/<file> and downloads the file there when it is missing.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..errors import UsageError

# name -> (torchvision's ImageNet weights enum, the key prefix of torchvision's classifier in them,
# which our head replaces). torchvision.models is imported only when a model of it is built: the
# import costs over a second (it pulls in torch._dynamo), paid by every training job otherwise.
PRETRAINED = {"resnet18": ("ResNet18_Weights", "fc."), "vgg16": ("VGG16_BN_Weights", "classifier.6.")}


def imagenet_weights(name: str):
    """(torchvision's IMAGENET1K_V1 weights of `name`, the key prefix of its classifier)."""
    from torchvision import models

    enum, classifier = PRETRAINED[name]
    return getattr(models, enum).IMAGENET1K_V1, classifier


def check_pretrained(name: str, channels: int) -> None:
    """Fail before building (VGG-16 takes seconds) when `name` cannot start from ImageNet weights."""
    if name not in PRETRAINED:
        raise UsageError(f"model {name!r} has no pretrained weights; model.pretrained: true needs one of: "
                         f"{', '.join(sorted(PRETRAINED))}")
    if channels != 3:
        raise UsageError(f"the ImageNet weights of {name} need 3-channel (RGB) images, but the data has "
                         f"{channels} channel(s); set model.pretrained: false")


def cached_weights_path(name: str) -> str:
    """Where torchvision's weights API looks for (and downloads) the weights file of `name`."""
    weights, _ = imagenet_weights(name)
    return os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(weights.url))


def load_imagenet_weights(name: str, model: nn.Module) -> None:
    """Load torchvision's ImageNet weights into everything but the head (left as initialised)."""
    weights, classifier = imagenet_weights(name)
    path = cached_weights_path(name)
    try:
        state = weights.get_state_dict(progress=False, map_location="cpu")
    except Exception as e:  # no network, HTTP errors, an unreadable file: all leave no usable weights
        if os.path.exists(path):
            raise UsageError(f"{path} does not hold readable weights ({_one_line(e)}); "
                             f"replace it with {weights.url}") from e
        raise UsageError(f"the ImageNet weights of {name} could not be fetched ({_one_line(e)}); "
                         f"download {weights.url} and place it at {path}") from e
    # a new dict without torch's _metadata: BatchNorm then fills in num_batches_tracked, which
    # weights files saved before PyTorch 0.4.1 lack
    body = {f"body.{k}": v for k, v in state.items() if not k.startswith(classifier)}
    try:
        missing, unexpected = model.load_state_dict(body, strict=False)
    except RuntimeError as e:  # shape mismatches
        raise UsageError(f"{path} does not hold torchvision's {name} weights ({_one_line(e)})") from e
    head = getattr(model, "head_name", "head") + "."
    stray = list(unexpected) + [k for k in missing if not k.startswith(head)]
    if stray:
        raise UsageError(f"{path} does not hold torchvision's {name} weights (keys that do not match: "
                         f"{', '.join(stray[:5])})")


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"

"""Batched data augmentation on the tensor's own device.

The data live on the GPU as one normalised tensor, so augmentation works on whole minibatches
there: no PIL, no per-sample Python loop. Randomness comes only from the generator passed in, in
a fixed order (row offsets, column offsets, then flip coins), so a seeded generator reproduces a
batch exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import UsageError

AUGMENT_KINDS = ("none", "crop", "crop_flip")


# The usual paddings: 4 for 32px CIFAR/SVHN, 2 for 28px MNIST (an eighth would give 3 there).
_USUAL_PADS = {32: 4, 28: 2}


def default_pad(height: int) -> int:
    """Crop padding for an image height: 4 for 32px, 2 for 28px, else an eighth (at least 1)."""
    return _USUAL_PADS.get(height, max(1, height // 8))


def augment_batch(
    x: torch.Tensor, kind: str, generator: torch.Generator | None, pad: int | None = None
) -> torch.Tensor:
    """Augment a batch [N, C, H, W]: "none", "crop" (random crop of a zero-padded image) or
    "crop_flip" (the crop, then a horizontal flip of a random half).

    The generator must live on x's device (a CUDA generator for a CUDA batch); None uses torch's
    global generator.
    """
    if kind not in AUGMENT_KINDS:
        raise UsageError(f"unknown augmentation {kind!r}; choose one of: {', '.join(AUGMENT_KINDS)}")
    if kind == "none":
        return x
    if x.dim() != 4:
        raise UsageError(
            f"augmentation {kind!r} needs an image batch [N, C, H, W], got shape {tuple(x.shape)}"
        )
    pad = default_pad(x.shape[2]) if pad is None else pad
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
        raise UsageError(f"crop padding must be an integer >= 0, got {pad!r}")
    out = random_crop(x, pad, generator)
    if kind == "crop_flip":
        out = random_hflip(out, generator)
    return out


def random_crop(x: torch.Tensor, pad: int, generator: torch.Generator | None) -> torch.Tensor:
    """Each image shifted by its own random offset in [-pad, pad]^2, zero-filled at the borders.

    On the normalised data, zero is the training mean colour rather than black.
    """
    n, c, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator, device=x.device)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator, device=x.device)
    rows = dy[:, None] + torch.arange(h, device=x.device)  # [N, H]
    cols = dx[:, None] + torch.arange(w, device=x.device)  # [N, W]
    # One gather for the whole batch: the four index tensors broadcast to [N, C, H, W].
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    channel = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]


def random_hflip(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Each image mirrored left-right with probability 1/2."""
    flip = torch.rand(x.shape[0], generator=generator, device=x.device) < 0.5
    return torch.where(flip[:, None, None, None], x.flip(-1), x)

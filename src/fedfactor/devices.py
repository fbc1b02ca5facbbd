"""Which torch device a run uses."""

from __future__ import annotations

import torch

from .errors import UsageError


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """"auto" is the GPU when there is one; anything else must name an available device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise UsageError(f"device {name!r} is not a torch device; use auto, cpu or cuda[:N]") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {name!r} asked for, but no CUDA device is available; use auto or cpu")
    return device

"""The software and machine a run trained on: what its numbers depend on besides its config.

On CPU the same config, versions, machine and thread count give bit-identical results; change any
of them and accuracies move in their last digits, and over rounds by more (docs/reliability.md).
A run records this with its results (summary.json "versions", MLflow tags `fedfactor.version.*`),
so that two runs that differ can be told apart by more than their config.
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import torch

from . import __version__

CPUINFO = Path("/proc/cpuinfo")


def cpu_model() -> str:
    """The CPU's model name: Linux names it in /proc/cpuinfo, where platform.processor() gives only
    the architecture; elsewhere platform.processor(), the architecture when that is empty too."""
    try:
        with CPUINFO.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:  # not Linux, or a container that hides it
        pass
    return platform.processor() or platform.machine() or "unknown"


def versions(device: torch.device) -> dict[str, str | int]:
    """What a run on `device` depends on beyond its config, as plain JSON values."""
    found: dict[str, str | int] = {
        "fedfactor": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "cpu": cpu_model(),
        # CPU kernels split their sums by thread count, so a run's float rounding depends on it
        "torch_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":  # the GPU, the CUDA and the cuDNN builds pick the kernels
        found["gpu"] = torch.cuda.get_device_name(device)
        found["cuda"] = str(torch.version.cuda)
        found["cudnn"] = str(torch.backends.cudnn.version())
    return found

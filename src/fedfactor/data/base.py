"""What every dataset source shares (datasets.py and leaf.py): the static facts of a dataset, the raw
arrays a source reads, and the wording of messages about files and downloads.

A module of its own so that leaf.py and datasets.py both build on it without importing each other.
"""

from __future__ import annotations

import shlex
import socket
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import UsageError

IMAGE_SIDE = 28  # FEMNIST
SEQUENCE_LENGTH = 80  # Shakespeare: the characters before the one to predict
INPUT_KINDS = ("image", "tokens")


@dataclass(frozen=True)
class DatasetInfo:
    name: str  # registry name, or "npz:PATH"
    channels: int
    height: int
    width: int
    num_classes: int
    augment: str  # default augmentation: "crop_flip", "crop" or "none"
    # "image": pixels, normalised per channel; "tokens": token ids (1 x 1 x sequence length), as is
    input: str = "image"
    # natural clients (writers, speaking roles) the samples come from; 0: none, or not known before
    # the dataset is prepared (load_dataset's and prepare_dataset's info always has the count)
    natural_clients: int = 0


@dataclass
class Arrays:
    """Raw arrays as read from disk: x [n, C, H, W] in the file's dtype, y int64 [n]."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    # int32 [n_train + n_test], train part first, and the natural clients' names; None without
    owners: np.ndarray | None = None
    client_names: Sequence[str] = ()


def one_line(text: Any) -> str:
    return " ".join(str(text).split())


def is_network_error(err: BaseException) -> bool:
    if isinstance(err, (urllib.error.URLError, ConnectionError, TimeoutError, socket.gaierror)):
        return True
    # MNIST folds every mirror's failure into one RuntimeError; a corrupt download says so.
    text = str(err)
    return isinstance(err, RuntimeError) and text.startswith("Error downloading") and "corrupted" not in text


def prepare_command(name: str, root: Path) -> str:
    return f"`fedfactor prepare-data --dataset {name} --root {shlex.quote(str(root))}`"


def check_owners(owners: Any, n: int) -> np.ndarray:
    """owners as int64 [n], refused unless they are n non-negative integers."""
    owners = np.asarray(owners)
    if owners.shape != (n,) or (n and (not np.issubdtype(owners.dtype, np.integer) or owners.min() < 0)):
        raise UsageError(f"owners must be {n} non-negative integers, the natural client of each sample "
                         f"(got {owners.dtype} of shape {list(owners.shape)})")
    return owners.astype(np.int64)

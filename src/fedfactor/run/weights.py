"""client_weights.npz: what a run keeps of its clients' final weights, and how `fedfactor diagnose` reads it back.

A run saves, at its end, the effective weights of its analysed layers for a few clients
(`save_client_weights`); the diagnostics read them without ever unpickling anything, and turn every
damaged, pickled or mismatched file into one error naming it (`open_weights`, `layer_weights`).
"""

from __future__ import annotations

import logging
import zipfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..io import atomic_open

if TYPE_CHECKING:
    from .simulator import Simulator

log = logging.getLogger("fedfactor")

WEIGHTS_FILE = "client_weights.npz"  # final client weights of the analysed layers (fedfactor diagnose)
_UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)  # what numpy and zipfile raise
_REWRITE = "the file is damaged or was not written by fedfactor: re-run the run to write it again"


def save_client_weights(keep_weights: bool, sim: Simulator, path: Path) -> tuple[dict[int, str], list[int]]:
    """Final client weights of the analysed layers, for `fedfactor diagnose`, as float16 arrays.

    Entry "<module>.weight" holds each client's effective weight of the layer in the plain layer's
    shape (rows: output units): u v^T + mu for a factorized layer (mu as trained, not pruned),
    sigma + tau for a low-rank one, the Hadamard product for pFedPara (models.layers.effective_weight).
    Kept small: at most `diagnostics.max_clients` clients, those trained in the last round first.
    Returns the layers ({index: module name}) and the clients kept; nothing when the method analyses
    no layer (FedEM) or `keep_weights` (`diagnostics.keep_weights`) is false.
    """
    # imported here: `fedfactor diagnose` reads this module and needs neither the models nor torch to start
    import torch

    from ..models.layers import effective_weight, layer_entries

    layers = sim.diagnostic_layers()
    entries = [key for name in layers.values() for key in layer_entries(sim.model, name)]
    wanted = sim.diagnosed_clients() if keep_weights and layers else []
    # A trained client keeps these entries only if it was diagnosed under the settings it trained with
    # (Simulator._kept_for_diagnostics); `diagnostics` is not part of a run's fingerprint, so a resumed
    # or kept checkpoint may meet other settings and find some clients without them.
    clients = [k for k in wanted if all(key in sim.states[k] for key in entries)]
    if len(clients) < len(wanted):
        log.warning("%s: clients %s no longer hold the analysed layers' weights (they trained under other "
                    "diagnostics settings); keeping %d client(s)", path, sorted(set(wanted) - set(clients)),
                    len(clients))
    if not clients:
        path.unlink(missing_ok=True)
        return {}, []
    arrays = {f"{name}.weight": torch.stack([effective_weight(sim.model, name, sim.states[k]) for k in clients])
              .to(torch.float16).cpu().numpy() for name in layers.values()}
    with atomic_open(path) as f:
        # numpy types **kwds as possibly its allow_pickle flag; these keys are "<layer>.weight"
        np.savez(f, **arrays)  # type: ignore[arg-type]
    return layers, clients


def open_weights(path: Path) -> tuple[Any, str]:
    """The archive at `path` (a run's client_weights.npz), opened without pickles, or None and why it
    cannot be read."""
    if not zipfile.is_zipfile(path):  # np.load would take anything else for a pickle and refuse it as one
        return None, f"{path} is not an .npz archive (a zip of one .npy array per layer); {_REWRITE}"
    try:
        return np.load(path, allow_pickle=False), ""
    except _UNREADABLE as e:
        return None, f"cannot read {path} ({' '.join(str(e).split())}); {_REWRITE}"


def layer_weights(archive: Any, reason: str, path: Path, index: int, module: str) -> np.ndarray:
    """Layer `index`'s K x d x ... client weights, entry "<module>.weight" of an archive `open_weights`
    returned (with its `reason`); ValueError naming the file when there is none to read."""
    key = f"{module}.weight"
    if archive is None:
        raise ValueError(reason)
    if key not in archive.files:
        have = ", ".join(archive.files) or "none"
        raise ValueError(f"{path} has no entry {key!r} for layer {index} of summary.json's "
                         f"analysed_layers (it has {have}); {_REWRITE}")
    try:
        weights = archive[key]  # allow_pickle=False: an object array is refused, never unpickled
    except _UNREADABLE as e:
        raise ValueError(f"cannot read {key!r} from {path} ({' '.join(str(e).split())}); "
                         f"{_REWRITE}") from None
    if not isinstance(weights, np.ndarray):  # numpy hands out a member it cannot parse as bytes
        raise ValueError(f"{key!r} in {path} is not an .npy array; {_REWRITE}")
    return weights

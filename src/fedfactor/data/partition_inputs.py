"""What `make_partition` and `task_label_maps` are given, checked: the spec (completed by
PartitionConfig, the one source of defaults and ranges), the counts, the labels and their splits.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
from pydantic import ValidationError

from ..config import PartitionConfig, validation_message
from ..errors import UsageError
from .partition_groups import _GROUPS_HINT, GROUP_PRESETS
from .partition_kinds import PARTITIONS, SPLITS


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _resolve_spec(spec: Any) -> dict[str, Any]:
    """The spec completed and checked by PartitionConfig, the one source of defaults and ranges."""
    if not isinstance(spec, dict):
        raise UsageError(
            "partition spec must be a mapping with a kind and its options "
            f"(got {type(spec).__name__})"
        )
    # PartitionConfig falls back on iid, but a spec handed to make_partition without a kind is
    # more likely a mistake than a wish for iid
    if spec.get("kind") is None:
        raise UsageError(
            f"partition spec needs a kind; choose one of: {', '.join(PARTITIONS.names())}"
        )
    try:
        resolved = PartitionConfig.model_validate(spec).model_dump(exclude={"file"})
    except ValidationError as err:
        raise UsageError(validation_message(err, prefix="partition.")) from None
    if spec.get("file") is not None:
        raise UsageError(
            "partition.file names a saved partition (Partition.load reads it); "
            "a spec to build one must leave it out"
        )
    PARTITIONS.get(resolved["kind"])  # unknown kind -> UsageError naming the choices
    # checked under every kind: a setting the kind does not read must still not be nonsense
    if isinstance(resolved["groups"], str) and resolved["groups"] not in GROUP_PRESETS:
        raise UsageError(f"partition.groups: unknown class-group preset {resolved['groups']!r}; {_GROUPS_HINT}")
    return resolved


def _check_counts(num_classes: Any, num_clients: Any) -> None:
    if not _is_int(num_clients) or num_clients < 1:
        raise UsageError(f"num_clients must be an integer >= 1 (got {num_clients!r})")
    if not _is_int(num_classes) or num_classes < 1:
        raise UsageError(f"num_classes must be an integer >= 1 (got {num_classes!r})")


def _check_inputs(
    y: np.ndarray, splits: dict[str, np.ndarray], num_classes: int, num_clients: int, seed: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    _check_counts(num_classes, num_clients)
    if not _is_int(seed) or seed < 0:
        raise UsageError(f"seed must be an integer >= 0 (got {seed!r})")
    y = np.asarray(y)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise UsageError("labels y must be a 1-D integer array")
    y = y.astype(np.int64)
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise UsageError(f"labels must lie in 0..{num_classes - 1} (num_classes={num_classes})")
    if not isinstance(splits, dict) or set(splits) != set(SPLITS):
        raise UsageError(f"splits must have exactly the keys {', '.join(SPLITS)}")
    out = {}
    for s in SPLITS:
        idx = np.asarray(splits[s])
        if idx.ndim != 1 or (len(idx) and not np.issubdtype(idx.dtype, np.integer)):
            raise UsageError(f"split {s!r} must be a 1-D integer index array")
        idx = np.sort(idx.astype(np.int64))
        if len(idx) and (idx[0] < 0 or idx[-1] >= len(y) or np.any(np.diff(idx) == 0)):
            raise UsageError(
                f"split {s!r} holds repeated indices or indices outside 0..{len(y) - 1}"
            )
        out[s] = idx
    if len(np.unique(np.concatenate(list(out.values())))) != sum(map(len, out.values())):
        raise UsageError("the train, val and test splits overlap; they must be disjoint")
    if num_clients > len(out["train"]):
        raise UsageError(
            f"{num_clients} clients but only {len(out['train'])} train samples; use fewer clients"
        )
    return y, out

"""The seeded train/val/test cut of a pooled dataset (`make_splits`).

"pooled" is Factorized-FL's own 80/10/10 cut of all samples, "official" keeps the official test
part, and with the natural client of every sample "pooled" cuts each client's samples on their own.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import UsageError
from .base import check_owners

SPLIT_MODES = ("pooled", "official")


def make_splits(
    n: int,
    n_official_train: int,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    mode: str = "pooled",
    seed: int = 0,
    owners: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Seeded train/val/test indices into the pooled samples, each sorted ascending (int64).

    "pooled" follows Factorized-FL's official code: shuffle all n, take train, then test, and
    leave the remainder to val. "official" keeps the official test part as test and cuts the
    official-train part into train and val in the ratio of their fractions. With `owners` (the
    natural client of each sample), "pooled" cuts each client's samples on their own instead
    (`_per_owner`).
    """
    f_train, f_val, f_test = _check_split_args(n, n_official_train, fractions, mode)
    rng = np.random.default_rng(seed)
    if mode == "pooled" and owners is not None:
        parts = _per_owner(check_owners(owners, n), f_val, f_test, rng)
    elif mode == "pooled":
        perm = rng.permutation(n)
        n_train = round(n * f_train)
        n_test = min(round(n * f_test), n - n_train)
        test_end = n_train + n_test
        parts = {"train": perm[:n_train], "test": perm[n_train:test_end], "val": perm[test_end:]}
    else:
        if n_official_train == n:
            raise UsageError("this dataset has no official test part; use split mode 'pooled'")
        if f_train + f_val == 0:
            raise UsageError("split mode 'official' needs a train or val fraction above 0")
        perm = rng.permutation(n_official_train)
        n_train = round(n_official_train * f_train / (f_train + f_val))
        parts = {"train": perm[:n_train], "val": perm[n_train:], "test": np.arange(n_official_train, n)}
    return {k: np.sort(parts[k]).astype(np.int64) for k in ("train", "val", "test")}


def _per_owner(owners: np.ndarray, f_val: float, f_test: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each natural client's samples shuffled and cut on their own ("we randomly split the dataset in
    each client", FedFac 5.1): test = round(m f_test) but at least one sample (when f_test > 0), val =
    round(m f_val) of the rest, train = the remainder, so 80/0/20 leaves nothing to val."""
    order = np.argsort(owners, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(owners[order])) + 1)
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    for group in groups:
        perm, m = rng.permutation(group), len(group)
        n_test = max(1, round(m * f_test)) if f_test > 0 else 0
        n_val = min(round(m * f_val), m - n_test)
        parts["test"].append(perm[:n_test])
        parts["val"].append(perm[n_test : n_test + n_val])
        parts["train"].append(perm[n_test + n_val :])
    return {k: np.concatenate([np.zeros(0, np.int64), *v]) for k, v in parts.items()}


def _check_split_args(
    n: int, n_official_train: int, fractions: Sequence[float], mode: str
) -> tuple[float, float, float]:
    if mode not in SPLIT_MODES:
        raise UsageError(f"unknown split mode {mode!r}; choose one of: {', '.join(SPLIT_MODES)}")
    if not (isinstance(n, (int, np.integer)) and isinstance(n_official_train, (int, np.integer))):
        raise UsageError(f"n and n_official_train must be integers (got {n!r} and {n_official_train!r})")
    if n < 0 or not 0 <= n_official_train <= n:
        raise UsageError(f"need 0 <= n_official_train <= n (got n={n}, n_official_train={n_official_train})")
    try:
        f = [float(v) for v in fractions]
    except (TypeError, ValueError):
        raise UsageError(
            f"split fractions must be three numbers train, val, test summing to 1 (got {fractions!r})"
        ) from None
    if len(f) != 3 or any(not np.isfinite(v) or v < 0 for v in f) or abs(sum(f) - 1) > 1e-6:
        raise UsageError(
            f"split fractions must be three non-negative numbers train, val, test summing to 1 (got {f!r})"
        )
    return f[0], f[1], f[2]

"""Class groups (domains): the papers' CIFAR-100 presets, and a spec's groups resolved and checked.

The kind class_groups gives each group's clients that group's classes only, and their label maps
number those classes 0..n-1 (`partition_labels.py`).
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError

# Factorized-FL supplement, Table 3 (B.2): five CIFAR-100 domains of ten classes, four clients each.
# The class sets are the paper's (OCR-corrected) label column; each is the union of two standard
# CIFAR-100 superclasses.
CIFAR100_5DOMAINS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("Household Objects", (5, 20, 22, 25, 39, 40, 84, 86, 87, 94)),
    ("Fruits & Foods", (0, 9, 10, 16, 28, 51, 53, 57, 61, 83)),
    ("Trees & Flowers", (47, 52, 54, 56, 59, 62, 70, 82, 92, 96)),
    ("Transport", (8, 13, 41, 48, 58, 69, 81, 85, 89, 90)),
    ("Animals", (3, 34, 42, 43, 63, 64, 66, 75, 88, 97)),
)

# The standard CIFAR-100 coarse labels (SimFed's 20 domains), indexed by fine label in the
# dataset's alphabetical fine-label order.
CIFAR100_SUPERCLASS_NAMES: tuple[str, ...] = (
    "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables",
    "household_electrical_devices", "household_furniture", "insects", "large_carnivores",
    "large_man-made_outdoor_things", "large_natural_outdoor_scenes",
    "large_omnivores_and_herbivores", "medium_mammals", "non-insect_invertebrates", "people",
    "reptiles", "small_mammals", "trees", "vehicles_1", "vehicles_2",
)  # fmt: skip
CIFAR100_FINE_TO_COARSE: tuple[int, ...] = (
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
    6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
    5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
)  # fmt: skip


def _superclass_groups() -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(
        (name, tuple(f for f, c in enumerate(CIFAR100_FINE_TO_COARSE) if c == s))
        for s, name in enumerate(CIFAR100_SUPERCLASS_NAMES)
    )


# preset name -> (named groups, default clients per group)
GROUP_PRESETS: dict[str, tuple[tuple[tuple[str, tuple[int, ...]], ...], int]] = {
    "cifar100_5domains": (CIFAR100_5DOMAINS, 4),
    "cifar100_superclasses": (_superclass_groups(), 1),
}

_GROUPS_HINT = (
    f"a preset name ({', '.join(sorted(GROUP_PRESETS))}) "
    "or a non-empty list of non-empty lists of classes"
)


def _resolve_groups(
    spec: dict[str, Any], num_classes: int, num_clients: int
) -> tuple[list[list[int]], list[str], int, str | None]:
    """(groups, group names, clients per group, preset name or None), all checked."""
    groups_spec, per_group = spec["groups"], spec["clients_per_group"]
    preset: str | None = None
    if isinstance(groups_spec, str):
        if groups_spec not in GROUP_PRESETS:
            raise UsageError(
                f"unknown class-group preset {groups_spec!r}; choose one of: "
                f"{', '.join(sorted(GROUP_PRESETS))}, or give a list of lists of classes"
            )
        preset = groups_spec
        named, preset_per_group = GROUP_PRESETS[preset]
        names = [n for n, _ in named]
        groups = [list(g) for _, g in named]
        per_group = preset_per_group if per_group is None else per_group
    elif groups_spec and all(groups_spec):  # PartitionConfig has made it a list of int lists
        groups = [list(g) for g in groups_spec]
        names = [f"group_{i}" for i in range(len(groups))]
        if per_group is None:  # infer it when the client count allows only one answer
            per_group = max(1, num_clients // len(groups))
    else:
        raise UsageError(f"class_groups needs groups: {_GROUPS_HINT}")

    seen: set[int] = set()
    for g in groups:
        missing = [c for c in g if not 0 <= c < num_classes]
        if missing:
            raise UsageError(
                f"class group {g} names classes {missing} that do not exist; "
                f"classes are 0..{num_classes - 1}"
            )
        overlap = seen.intersection(g) | {c for c in g if g.count(c) > 1}
        if overlap:
            raise UsageError(f"class groups must be disjoint; classes {sorted(overlap)} repeat")
        seen.update(g)
    if num_clients != len(groups) * per_group:
        raise UsageError(
            f"class_groups with {len(groups)} groups x {per_group} clients_per_group needs "
            f"num_clients = {len(groups) * per_group} (got {num_clients})"
        )
    return groups, names, per_group, preset

"""Class groups: the CIFAR-100 presets against the papers' tables (expected values embedded, not read from disk)."""

from __future__ import annotations

import numpy as np

from fedfactor.data import make_partition
from fedfactor.data.partition_groups import CIFAR100_FINE_TO_COARSE, GROUP_PRESETS

from .conftest import TABLE2, assert_covers, assert_disjoint, class_sets


# Factorized-FL supplement Table 3: the domains' CIFAR-100 label sets (corrected label column).
DOMAINS = {
    "Household Objects": [5, 20, 22, 25, 39, 40, 84, 86, 87, 94],
    "Fruits & Foods": [0, 9, 10, 16, 28, 51, 53, 57, 61, 83],
    "Trees & Flowers": [47, 52, 54, 56, 59, 62, 70, 82, 92, 96],
    "Transport": [8, 13, 41, 48, 58, 69, 81, 85, 89, 90],
    "Animals": [3, 34, 42, 43, 63, 64, 66, 75, 88, 97],
}


# A few Table 3 cells: (client number as printed, 1-based; original label; permuted label).
TABLE3_CELLS = [
    (1, 5, 2),  # Household, Bed
    (1, 94, 7),  # Household, Television
    (4, 86, 4),  # Household, Lamp
    (6, 0, 2),  # Fruits & Foods, Apple
    (8, 83, 9),  # Fruits & Foods, Plate
    (10, 54, 1),  # Trees & Flowers, Rose (an OCR-fixed cell)
    (16, 90, 8),  # Transport, Train
    (17, 66, 7),  # Animals, Leopard (an OCR-fixed cell)
    (18, 63, 3),  # Animals, Skunk (an OCR-fixed cell)
    (20, 97, 3),  # Animals, Wolf
]


CIFAR100_FINE = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus "
    "butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch "
    "crab crocodile cup dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo "
    "keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle mountain mouse "
    "mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy "
    "porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper "
    "snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television "
    "tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm"
).split()


SUPERCLASS_MEMBERS = {
    "aquatic_mammals": "beaver dolphin otter seal whale",
    "fish": "aquarium_fish flatfish ray shark trout",
    "flowers": "orchid poppy rose sunflower tulip",
    "food_containers": "bottle bowl can cup plate",
    "fruit_and_vegetables": "apple mushroom orange pear sweet_pepper",
    "household_electrical_devices": "clock keyboard lamp telephone television",
    "household_furniture": "bed chair couch table wardrobe",
    "insects": "bee beetle butterfly caterpillar cockroach",
    "large_carnivores": "bear leopard lion tiger wolf",
    "large_man-made_outdoor_things": "bridge castle house road skyscraper",
    "large_natural_outdoor_scenes": "cloud forest mountain plain sea",
    "large_omnivores_and_herbivores": "camel cattle chimpanzee elephant kangaroo",
    "medium_mammals": "fox porcupine possum raccoon skunk",
    "non-insect_invertebrates": "crab lobster snail spider worm",
    "people": "baby boy girl man woman",
    "reptiles": "crocodile dinosaur lizard snake turtle",
    "small_mammals": "hamster mouse rabbit shrew squirrel",
    "trees": "maple_tree oak_tree palm_tree pine_tree willow_tree",
    "vehicles_1": "bicycle bus motorcycle pickup_truck train",
    "vehicles_2": "lawn_mower rocket streetcar tank tractor",
}


def test_cifar100_5domains_preset_matches_table3(c100):
    named, per_group = GROUP_PRESETS["cifar100_5domains"]
    assert per_group == 4
    assert {name: sorted(g) for name, g in named} == DOMAINS
    assert [name for name, _ in named] == list(DOMAINS)  # the CSV's domain order

    y, splits = c100
    spec = {"kind": "class_groups", "groups": "cifar100_5domains"}
    part = make_partition(y, splits, 100, 20, spec, seed=0)
    assert part.num_classes == 10
    assert part.meta["group_names"] == list(DOMAINS)
    used = sorted(c for g in DOMAINS.values() for c in g)
    assert len(used) == len(set(used)) == 50  # the domains are disjoint
    assert_disjoint(part)
    assert_covers(part, y, splits, classes=used)
    for k, domain in enumerate(DOMAINS.values()):
        for client in range(4 * k, 4 * k + 4):
            assert class_sets(part, y, "train")[client] == set(domain)
            assert class_sets(part, y, "test")[client] <= set(domain)
            np.testing.assert_array_equal(part.label_maps[client][domain], np.arange(10))
            assert np.all(np.delete(part.label_maps[client], domain) == -1)


def test_permuted_domain_labels_match_table3(c100):
    y, splits = c100
    spec = {"kind": "class_groups", "groups": "cifar100_5domains", "permute_labels": True}
    part = make_partition(y, splits, 100, 20, spec, seed=0)
    for client, original, label in TABLE3_CELLS:
        assert part.label_maps[client - 1, original] == label
    # in general: sorted position within the domain, then the client's Table 2 permutation
    for k in range(20):
        domain = list(DOMAINS.values())[k // 4]
        assert part.label_maps[k, domain].tolist() == TABLE2[k]


def test_cifar100_superclasses_preset(c100):
    named, per_group = GROUP_PRESETS["cifar100_superclasses"]
    assert per_group == 1
    assert [n for n, _ in named] == list(SUPERCLASS_MEMBERS)
    for name, group in named:
        assert sorted(CIFAR100_FINE[c] for c in group) == SUPERCLASS_MEMBERS[name].split()
    assert sorted(CIFAR100_FINE_TO_COARSE) == sorted(list(range(20)) * 5)

    y, splits = c100
    spec = {"kind": "class_groups", "groups": "cifar100_superclasses"}
    part = make_partition(y, splits, 100, 20, spec, seed=0)
    assert part.num_classes == 5
    assert_covers(part, y, splits)
    assert part.meta["client_group"] == list(range(20))

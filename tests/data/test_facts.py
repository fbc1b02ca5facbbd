"""Dataset facts: every registered dataset has them, and a generated or own-file one is read."""

import numpy as np
import pytest

from fedfactor.data.datasets import DATASETS, _NPZ_ENTRY, _SYNTHETIC_ENTRY
from fedfactor.data.facts import DATASET_FACTS, dataset_facts
from fedfactor.errors import UsageError


def test_every_registered_dataset_has_its_facts():
    # the two entries that stand for a family of names (synthetic:NAME, npz:PATH) are read, not listed
    named = set(DATASETS.names()) - {_SYNTHETIC_ENTRY, _NPZ_ENTRY}
    assert named == set(DATASET_FACTS)


def test_facts_of_a_stand_in_and_of_an_own_file_are_read_from_their_arrays(tmp_path):
    synthetic = dataset_facts("synthetic:digits", str(tmp_path))
    assert synthetic.download == 0 and synthetic.samples > synthetic.official_train > 0
    path = tmp_path / "mine.npz"
    np.savez(path, x=np.zeros((30, 8, 8), np.uint8), y=np.arange(30) % 3)
    own = dataset_facts(f"npz:{path}", str(tmp_path))
    assert (own.samples, own.extracted) == (30, path.stat().st_size)


def test_a_dataset_without_facts_is_named():
    with pytest.raises(UsageError, match="no sizes for dataset 'nope'.*fedfactor.data.facts"):
        dataset_facts("nope", "data")

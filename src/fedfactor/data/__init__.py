"""Datasets, splits, partitions and augmentation."""

from .augment import augment_batch
from .partition import Partition, make_partition
from .partition_kinds import PARTITIONS
from .partition_labels import task_label_maps
from .datasets import DATASETS, Dataset, DatasetInfo, dataset_info, load_dataset, prepare_dataset
from .splits import make_splits

__all__ = [
    "DATASETS",
    "Dataset",
    "DatasetInfo",
    "PARTITIONS",
    "Partition",
    "make_partition",
    "task_label_maps",
    "augment_batch",
    "dataset_info",
    "load_dataset",
    "make_splits",
    "prepare_dataset",
]

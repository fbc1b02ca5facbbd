"""Datasets, splits, partitions and augmentation."""

from .augment import augment_batch
from .partition import PARTITIONS, Partition, make_partition, task_label_maps
from .datasets import DATASETS, Dataset, DatasetInfo, dataset_info, load_dataset, make_splits, prepare_dataset

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

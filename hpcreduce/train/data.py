"""Data sets the trainers read: examples addressed by index, in two splits, cut into shards.

A trainer asks for the examples of its share by index (see ``partition``: a worker's
share comes from the shards it owns) and hands the batch it gets to the model
unchanged, so a batch is whatever the model expects.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..errors import Problem
from .partition import even_shards

class Dataset:
    """Examples in a ``"train"`` split and a held-out ``"test"`` split."""

    name = "dataset"

    def size(self, split: str) -> int:
        """Number of examples in ``split``."""
        raise NotImplementedError

    def batch(self, split: str, indices: np.ndarray) -> Any:
        """The examples of ``split`` at ``indices``, in the form the model reads."""
        raise NotImplementedError

    def shard_sizes(self, split: str) -> Tuple[int, ...]:
        """Examples in each shard of ``split``, in index order (default: ``partition.even_shards``)."""
        return even_shards(self.size(split))

    def problems(self, part: int, parts: int) -> List[Problem]:
        """What makes this data set unusable, found by checking part ``part`` of ``parts`` of it
        (each rank checks one part; ``run_checks`` joins them); none by default."""
        return []

    def info(self) -> Dict[str, Any]:
        """Facts about the data set for the run's result (sizes, and any reference figures)."""
        return {"name": self.name, "train_examples": self.size("train"),
                "test_examples": self.size("test"), "train_shards": len(self.shard_sizes("train"))}


class ArrayDataset(Dataset):
    """A data set held as named arrays whose first axis indexes the examples; a batch is
    a dict of the same names holding the selected rows."""

    def __init__(self, name: str, train: Mapping[str, np.ndarray], test: Mapping[str, np.ndarray],
                 info: Optional[Mapping[str, Any]] = None):
        self.name = name
        self.splits = {"train": dict(train), "test": dict(test)}
        for split, arrays in self.splits.items():
            lengths = {key: len(value) for key, value in arrays.items()}
            if not lengths or len(set(lengths.values())) != 1:
                raise ValueError(f"{name}: the {split} arrays must be non-empty and of equal "
                                 f"length, got {lengths}")
        self.extra = dict(info or {})

    def size(self, split: str) -> int:
        return len(next(iter(self.splits[split].values())))

    def batch(self, split: str, indices: np.ndarray) -> Dict[str, np.ndarray]:
        return {key: value[indices] for key, value in self.splits[split].items()}

    def info(self) -> Dict[str, Any]:
        return {**super().info(), **self.extra}

"""Tables: what a parameter server holds. Declared by ``ParamSpec``, one per parameter.

A dense table is a tensor, cut into element ranges over the shards; a sparse table is
``shape[0]`` rows keyed by int64 id, each row owned by one shard. A shard finds its own
rows by id through a *position index* (``position_index``): one int per row of the table,
-1 for rows owned elsewhere, so a batch of ids is looked up in one gather.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np


@dataclass(frozen=True)
class ParamSpec:
    """One named parameter. A sparse one is a table of ``shape[0]`` rows keyed by id;
    only the rows a batch touches are pulled, and only their gradients travel."""

    name: str
    shape: Tuple[int, ...]
    dtype: str = "float32"
    sparse: bool = False


def numel(spec: ParamSpec) -> int:
    """Elements of the whole table."""
    return int(np.prod(spec.shape, dtype=np.int64))


def row_width(spec: ParamSpec) -> int:
    """Elements per row of a sparse table (1 for a one-dimensional table)."""
    return int(np.prod(spec.shape[1:], dtype=np.int64))


def position_index(ids: np.ndarray, rows: int) -> np.ndarray:
    """The position index of the sorted ``ids`` a shard owns among a table's ``rows``:
    ``index[ids[i]] == i``, -1 elsewhere (int32 while positions fit, 4 bytes a row)."""
    index = np.full(rows, -1, dtype=np.int32 if len(ids) < 2**31 else np.int64)
    index[ids] = np.arange(len(ids))
    return index

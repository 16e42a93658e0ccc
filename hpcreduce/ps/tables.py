"""Tables: what a parameter server holds. Declared by ``ParamSpec``, one per parameter.

A dense table is a tensor, cut into element ranges over the shards; a sparse table is
``shape[0]`` rows keyed by int64 id, each row owned by one shard. A shard finds its own
rows by id through a ``RowIndex``: a direct index for tables up to 2**22 rows, above that
a bucketed binary search over the sorted ids it owns (kept as int32 while they fit), so a
large table costs a shard memory for its own rows, not for the table's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

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


def id_dtype(rows: int) -> np.dtype:
    """The dtype a shard keeps row ids of a ``rows``-row table in: int32 while they (and the
    bucket edges of ``RowIndex``) fit."""
    return np.dtype(np.int32 if rows <= 2**30 else np.int64)


DENSE_INDEX_ROWS = 1 << 22  # up to here a direct index: 4 B a row of the table (16 MiB at most)
BUCKET_BITS = 6


class RowIndex:
    """Where a shard's rows are: ``index[query]`` gives each queried id's position in the
    sorted ``ids`` the shard owns, -1 for ids owned elsewhere or out of range.

    A table of at most ``DENSE_INDEX_ROWS`` rows gets a direct index (one int32 per row of
    the table, -1 elsewhere; one gather per lookup). A larger one gets buckets of
    ``2**BUCKET_BITS`` consecutive ids: where each bucket's owned ids start (4 B per 64 rows of
    the table), then a vectorised binary search inside the bucket (at most 7 rounds, each
    touching one cache line per id), so a shard's memory grows with its own rows."""

    def __init__(self, ids: np.ndarray, rows: int):
        self.ids, self.rows = ids, rows
        small = np.int32 if len(ids) < 2**31 else np.int64
        self.direct: Optional[np.ndarray] = None
        self.starts: Optional[np.ndarray] = None
        if rows <= DENSE_INDEX_ROWS:
            self.direct = np.full(rows, -1, dtype=small)
            self.direct[ids] = np.arange(len(ids))
        else:
            edges = np.arange(0, rows + (1 << BUCKET_BITS), 1 << BUCKET_BITS, dtype=ids.dtype)
            self.starts = np.searchsorted(ids, edges).astype(small)  # edges of the ids' dtype: no copy of ids

    def __getitem__(self, query) -> np.ndarray:
        query = np.asarray(query)
        if self.direct is not None:
            inside = (query >= 0) & (query < self.rows)
            if inside.all():
                return self.direct[query]
            return np.where(inside, self.direct[np.where(inside, query, 0)], -1)
        return self._search(query)

    def _search(self, query: np.ndarray) -> np.ndarray:
        ids, last = self.ids, len(self.ids) - 1
        if last < 0:
            return np.full(query.shape, -1, dtype=np.int64)
        inside = (query >= 0) & (query < self.rows)
        wanted = np.where(inside, query, 0).astype(np.int64)
        bucket = wanted >> BUCKET_BITS
        low, high = self.starts[bucket].astype(np.int64), self.starts[bucket + 1].astype(np.int64)
        while True:
            open_ = low < high
            if not open_.any():
                break
            middle = (low + high) >> 1
            below = ids[np.minimum(middle, last)] < wanted
            low = np.where(open_ & below, middle + 1, low)
            high = np.where(open_ & ~below, middle, high)
        found = inside & (ids[np.minimum(low, last)] == wanted)
        return np.where(found, low, -1)

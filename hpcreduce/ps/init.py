"""Initial values of a shard's part of each table, made without the whole model.

A server creates only its own dense pieces and sparse rows (``ShardState.create``): it
asks a ``PartInit`` for the elements at given flat indices of a table, a chunk of
``CHUNK`` elements at a time, so no rank ever holds a whole table it does not own.

- ``PartInit(specs, elements)``: ``elements(table, flat)`` gives the initial values of the
  elements at flat indices ``flat`` of table number ``table``. When each value depends
  only on (seed, table, index), as ``counter_normal``'s do, every number of servers K
  starts from the same model.
- ``whole_tables(specs, values)``: from whole tables already made (``start``'s
  ``initial()``, a model without a per-element initialiser): sliced.

``owned_rows`` lists the rows of a sparse table a shard owns, a chunk of ids at a time.
"""
from __future__ import annotations

import math

from typing import Callable, Dict, Mapping, Sequence

import numpy as np

from .placement import Placement
from .tables import ParamSpec, counter_normal, id_dtype, row_width

__all__ = ["CHUNK", "PartInit", "counter_normal", "owned_rows", "whole_tables"]  # counter_normal: tables'

CHUNK = 1 << 20
HASH_ROWS = 1 << 18  # ids hashed at once: K x 2 MiB of scores
Elements = Callable[[int, np.ndarray], np.ndarray]


class PartInit:
    """Initial values of parts of ``specs``'s tables from ``elements(table, flat)``."""

    def __init__(self, specs: Sequence[ParamSpec], elements: Elements):
        self.specs, self.elements = tuple(specs), elements

    def dense(self, table: int, start: int, stop: int) -> np.ndarray:
        """Flat elements ``[start, stop)`` of dense table ``table``."""
        out = np.empty(stop - start, dtype=self.specs[table].dtype)
        for begin in range(start, stop, CHUNK):
            end = min(stop, begin + CHUNK)
            out[begin - start:end - start] = self.elements(table, np.arange(begin, end, dtype=np.int64))
        return out

    def rows(self, table: int, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of sparse table ``table``, shaped (len(ids),) + the row's shape."""
        spec = self.specs[table]
        width = row_width(spec)
        out = np.empty((len(ids), width), dtype=spec.dtype)
        step = max(1, CHUNK // max(width, 1))
        for begin in range(0, len(ids), step):
            chunk = np.asarray(ids[begin:begin + step], dtype=np.int64)
            flat = (chunk[:, None] * width + np.arange(width, dtype=np.int64)).reshape(-1)
            out[begin:begin + len(chunk)] = np.asarray(self.elements(table, flat)).reshape(len(chunk), width)
        return out.reshape((len(ids),) + tuple(spec.shape[1:]))


def whole_tables(specs: Sequence[ParamSpec], values: Mapping[str, np.ndarray]) -> PartInit:
    """A ``PartInit`` slicing whole tables ``values`` (by name)."""
    def elements(table: int, flat: np.ndarray) -> np.ndarray:
        return np.asarray(values[specs[table].name]).reshape(-1)[flat]
    return PartInit(specs, elements)


def owned_rows(placement: Placement, table: int, shards: Sequence[int]) -> Dict[int, np.ndarray]:
    """The sorted row ids of sparse table ``table`` that each of ``shards`` owns
    (``tables.id_dtype``), in one pass hashing ``HASH_ROWS`` ids at a time: never an array
    of every row id. Each shard's ids are written into one array sized for its expected
    share plus eight standard deviations (pages never written cost no memory; grown in the
    unlikely case it is short), so nothing is copied or left fragmented."""
    rows = placement.specs[table].shape[0]
    dtype = id_dtype(rows)
    share = rows / len(placement.shards)
    room = int(share + 8 * math.sqrt(share)) + 1
    out = {shard: np.empty(room, dtype) for shard in shards}
    filled = {shard: 0 for shard in shards}
    for begin in range(0, rows, HASH_ROWS):
        ids = np.arange(begin, min(rows, begin + HASH_ROWS), dtype=np.int64)
        owners = placement.row_owners(table, ids)
        for shard in shards:
            piece = ids[owners == shard]
            end = filled[shard] + len(piece)
            if end > len(out[shard]):
                out[shard] = np.concatenate([out[shard][:filled[shard]], np.empty(end + room // 8, dtype)])
            out[shard][filled[shard]:end] = piece
            filled[shard] = end
    return {shard: out[shard][:filled[shard]] for shard in shards}

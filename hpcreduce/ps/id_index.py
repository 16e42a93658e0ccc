"""A hash index from int64 ids to row slots: no Python object per row.

Open addressing with linear probing over two arrays (``keys`` int64, ``slots`` int64,
-1 for an empty cell, -2 for a removed one), at most half full. ``find``, ``insert``,
``remove`` and ``move`` take whole arrays of ids; the probes are compiled loops
(``kernels.index``: about 1.5 probes per id at half load). Removed cells are reused by
inserts and dropped when the cells are rebuilt. Cost: 16 B per cell, at most 32 B per id
(at half load).
"""
from __future__ import annotations

import numpy as np

from .kernels import kernel

FIND, CELLS, INSERT = kernel("index", "find"), kernel("index", "cells"), kernel("index", "insert")
MIN_CELLS = 1 << 10
EMPTY, GONE = -1, -2
CELL_BYTES = 16  # an int64 key and an int64 slot


def cells_for(count: int) -> int:
    """The cells an index of ``count`` ids needs: a power of two at least twice ``count``."""
    return max(MIN_CELLS, 1 << int(2 * max(count, 1) - 1).bit_length())


class IdIndex:
    """Where each id's row is: ``find(ids)`` gives slots (-1 where an id has none)."""

    def __init__(self, cells: int = MIN_CELLS):
        if cells & (cells - 1):
            raise ValueError(f"an IdIndex has a power-of-two number of cells, got {cells}")
        self.keys = np.zeros(cells, dtype=np.int64)
        self.slots = np.full(cells, EMPTY, dtype=np.int64)
        self.count = 0
        self.removed = 0  # cells marked GONE: probes pass them, inserts reuse them

    @classmethod
    def of(cls, ids: np.ndarray, room: int = 0) -> "IdIndex":
        """An index of ``ids`` (unique) at slots 0..len(ids)-1, with cells for ``room`` more."""
        index = cls(cells_for(len(ids) + room))
        index.insert(ids, np.arange(len(ids), dtype=np.int64))
        return index

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.slots.nbytes

    def find(self, ids: np.ndarray) -> np.ndarray:
        """The slot of each id, -1 for ids not in the index."""
        return FIND(self.keys, self.slots, np.ascontiguousarray(ids, dtype=np.int64))

    def insert(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Add ``ids`` (unique, none in the index yet) at ``slots``; grows the cells to stay
        at most half full (removed cells counted)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if 2 * (self.count + self.removed + len(ids)) > len(self.keys):
            self._rebuild(cells_for(self.count + len(ids)))
        self.removed -= int(INSERT(self.keys, self.slots, ids, np.ascontiguousarray(slots, dtype=np.int64)))
        self.count += len(ids)

    def remove(self, ids: np.ndarray) -> None:
        """Forget ``ids`` (all in the index): their cells are marked GONE."""
        cells = self._cells(np.asarray(ids, dtype=np.int64))
        self.slots[cells] = GONE
        self.count -= len(ids)
        self.removed += len(ids)

    def move(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Point ``ids`` (all in the index) at new ``slots``."""
        self.slots[self._cells(np.asarray(ids, dtype=np.int64))] = slots

    def _cells(self, ids: np.ndarray) -> np.ndarray:
        """The cell holding each id, -1 for ids not in the index."""
        return CELLS(self.keys, self.slots, np.ascontiguousarray(ids, dtype=np.int64))

    def _rebuild(self, cells: int) -> None:
        live = self.slots >= 0
        keys, slots = self.keys[live], self.slots[live]
        self.keys = np.zeros(cells, dtype=np.int64)
        self.slots = np.full(cells, EMPTY, dtype=np.int64)
        self.count = self.removed = 0
        self.insert(keys, slots)

"""A vectorised hash index from int64 ids to row slots: no Python object per row.

Open addressing with linear probing over two arrays (``keys`` int64, ``slots`` int64,
-1 for an empty cell), at most half full. ``find`` and ``insert`` take whole arrays of ids
and run probe rounds on the ids still unresolved, so a round is a few numpy passes and
the rounds shrink geometrically (about 1.5 probes per id at half load). There is no
delete: a table that drops rows builds its index anew (``IdIndex.of``), which is one
insert of every live id. Cost: 16 B per cell, 32 B per id at the largest load.
"""
from __future__ import annotations

import numpy as np

from ..arrays.hashing import GOLDEN, mix64

MIN_CELLS = 1 << 10
EMPTY = -1
CELL_BYTES = 16  # an int64 key and an int64 slot


def _start_cells(ids: np.ndarray, mask: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (mix64(ids.astype(np.uint64) * GOLDEN) & np.uint64(mask)).astype(np.int64)


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
        ids = np.asarray(ids, dtype=np.int64)
        found = np.full(len(ids), EMPTY, dtype=np.int64)
        mask = len(self.keys) - 1
        pending = np.arange(len(ids))
        cells = _start_cells(ids, mask)
        while len(pending):
            slots = self.slots[cells]
            hit = (slots != EMPTY) & (self.keys[cells] == ids[pending])
            found[pending[hit]] = slots[hit]
            going = ~hit & (slots != EMPTY)
            pending, cells = pending[going], (cells[going] + 1) & mask
        return found

    def insert(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Add ``ids`` (unique, none in the index yet) at ``slots``; grows the cells to stay
        at most half full."""
        ids = np.asarray(ids, dtype=np.int64)
        if 2 * (self.count + len(ids)) > len(self.keys):
            self._resize(cells_for(self.count + len(ids)))
        mask = len(self.keys) - 1
        pending = np.arange(len(ids))
        cells = _start_cells(ids, mask)
        while len(pending):
            free = self.slots[cells] == EMPTY
            # among ids aiming at the same free cell the first takes it; the rest probe on
            taken_cells, first = np.unique(cells[free], return_index=True)
            winners = pending[free][first]
            self.keys[taken_cells] = ids[winners]
            self.slots[taken_cells] = slots[winners]
            placed = np.zeros(len(pending), dtype=bool)
            placed[np.flatnonzero(free)[first]] = True
            pending, cells = pending[~placed], (cells[~placed] + 1) & mask
        self.count += len(ids)

    def _resize(self, cells: int) -> None:
        live = self.slots != EMPTY
        keys, slots = self.keys[live], self.slots[live]
        self.keys = np.zeros(cells, dtype=np.int64)
        self.slots = np.full(cells, EMPTY, dtype=np.int64)
        self.count = 0
        self.insert(keys, slots)

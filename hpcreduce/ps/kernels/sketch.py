"""The admission sketch's sighting: a conservative count-min update (see ``dynamic_rows.py``)."""
from __future__ import annotations

import numpy as np
from numba import njit

from .hashing import GOLDEN, mix64


@njit(nogil=True, cache=True)
def sighting(sketch, ids, salt, cap):
    """One more sighting of each id (unique): its count is one more than the smallest of its
    cells (at most ``cap``), and each cell becomes the larger of its count before this call
    and the count, the last id sharing a cell writing last (the vectorised update's rule)."""
    depth, width = sketch.shape
    n = len(ids)
    cells = np.empty((n, depth), np.int64)
    before = np.empty((n, depth), np.uint16)
    counts = np.empty(n, np.int64)
    for i in range(n):
        hashed = np.uint64(ids[i]) * GOLDEN ^ salt
        smallest = np.int64(cap)
        for d in range(depth):
            cell = np.int64(mix64(hashed + np.uint64(d + 1) * GOLDEN) % np.uint64(width))
            cells[i, d] = cell
            before[i, d] = sketch[d, cell]
            smallest = min(smallest, np.int64(before[i, d]))
        counts[i] = min(smallest + 1, cap)
    for i in range(n):
        for d in range(depth):
            sketch[d, cells[i, d]] = max(before[i, d], np.uint16(counts[i]))
    return counts

"""The id index's probes (open addressing, linear probing; see ``id_index.py``), and ``first_touched``
(table-wise rows made on first touch)."""
from __future__ import annotations

import numpy as np
from numba import njit

from .hashing import GOLDEN, mix64

EMPTY, GONE = -1, -2


@njit(nogil=True, cache=True, inline="always")
def _start(key, mask):
    return np.int64(mix64(np.uint64(key) * GOLDEN) & np.uint64(mask))


@njit(nogil=True, cache=True)
def cells(keys, slots, ids):
    """The cell holding each id, -1 for ids not in the index."""
    mask = len(keys) - 1
    out = np.empty(len(ids), np.int64)
    for i in range(len(ids)):
        key = ids[i]
        cell = _start(key, mask)
        while True:
            slot = slots[cell]
            if slot == EMPTY:
                out[i] = -1
                break
            if slot >= 0 and keys[cell] == key:
                out[i] = cell
                break
            cell = (cell + 1) & mask
    return out


@njit(nogil=True, cache=True)
def find(keys, slots, ids):
    """The slot of each id, -1 for ids not in the index (``cells``' probe, each cell read)."""
    out = cells(keys, slots, ids)
    for i in range(len(out)):
        if out[i] >= 0:
            out[i] = slots[out[i]]
    return out


@njit(nogil=True, cache=True)
def insert(keys, slots, ids, new_slots):
    """Put each id (none in the index) at its slot in the first free or removed cell of its
    probe; returns how many removed cells were reused."""
    mask = len(keys) - 1
    reused = 0
    for i in range(len(ids)):
        cell = _start(ids[i], mask)
        while slots[cell] >= 0:
            cell = (cell + 1) & mask
        reused += slots[cell] == GONE
        keys[cell] = ids[i]
        slots[cell] = new_slots[i]
    return reused


@njit(nogil=True, cache=True)
def first_touched(made, ids):
    """The ids whose ``made`` flag is off, each once (in order of first sight), flagged on:
    one pass, no table-sized scratch."""
    out = np.empty(len(ids), np.int64)
    count = 0
    for i in range(len(ids)):
        row = ids[i]
        if not made[row]:
            made[row] = True
            out[count] = row
            count += 1
    return out[:count]

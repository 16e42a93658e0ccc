"""The id index's probes (open addressing, linear probing; see ``id_index.py``), a fixed table's
row positions (``direct_positions``, ``bucket_positions``: ``tables.RowIndex``), a request's id check
(``first_bad_id``), and ``first_touched`` (table-wise rows made on first touch)."""
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


@njit(nogil=True, cache=True)
def direct_positions(direct, query):
    """Each id's position by a direct index (one entry per row of the table), -1 outside it."""
    rows = len(direct)
    out = np.empty(len(query), np.int64)
    for i in range(len(query)):
        q = query[i]
        out[i] = direct[q] if 0 <= q < rows else -1
    return out


@njit(nogil=True, cache=True)
def bucket_positions(starts, ids, query, rows, bits):
    """Each id's position in the sorted ``ids`` by a binary search inside its bucket of ``2**bits``
    ids (``starts``: where each bucket's ids begin), -1 for ids not there or outside ``[0, rows)``."""
    out = np.empty(len(query), np.int64)
    for i in range(len(query)):
        q = query[i]
        out[i] = -1
        if q < 0 or q >= rows:
            continue
        low, high = np.int64(starts[q >> bits]), np.int64(starts[(q >> bits) + 1])
        while low < high:
            middle = (low + high) >> 1
            if ids[middle] < q:
                low = middle + 1
            else:
                high = middle
        if low < len(ids) and ids[low] == q:
            out[i] = low
    return out


@njit(nogil=True, cache=True)
def first_bad_id(ids, low, high, increasing):
    """Where the first id outside ``[low, high]`` is; when there is none and ``increasing``, where the
    first id not above the one before it is; -1 when neither."""
    for i in range(len(ids)):
        if ids[i] < low or ids[i] > high:
            return i
    if increasing:
        for i in range(1, len(ids)):
            if ids[i] <= ids[i - 1]:
                return i
    return -1

"""A worker's shard routing: rendezvous owners of row ids and the group-by (see ``placement.py``)."""
from __future__ import annotations

import numpy as np
from numba import njit

from .hashing import mix64


@njit(nogil=True, cache=True)
def owners(ids, salts):
    """For each id, the index of the salt scoring highest (the first on a tie, as ``argmax``)."""
    out = np.empty(len(ids), np.int64)
    for i in range(len(ids)):
        key = np.uint64(ids[i])
        best, where = mix64(key ^ salts[0]), 0
        for k in range(1, len(salts)):
            score = mix64(key ^ salts[k])
            if score > best:
                best, where = score, k
        out[i] = where
    return out


@njit(nogil=True, cache=True)
def group(owner, groups):
    """A stable counting sort of positions by ``owner`` (0..groups-1): (order, starts), group g
    at ``order[starts[g]:starts[g + 1]]``."""
    starts = np.zeros(groups + 1, np.int64)
    for i in range(len(owner)):
        starts[owner[i] + 1] += 1
    for g in range(groups):
        starts[g + 1] += starts[g]
    fill = starts[:-1].copy()
    order = np.empty(len(owner), np.int64)
    for i in range(len(owner)):
        order[fill[owner[i]]] = i
        fill[owner[i]] += 1
    return order, starts

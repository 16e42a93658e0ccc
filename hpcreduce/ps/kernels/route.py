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


@njit(nogil=True, cache=True)
def unique_inverse(keys, bits):
    """``torch.unique(keys, sorted=True, return_inverse=True)`` for keys in [0, 2**bits): a
    stable LSD radix sort (digits of at most 12 bits), then one walk; (unique, inverse)."""
    n = len(keys)
    passes = max(1, (bits + 11) // 12)
    digit = (bits + passes - 1) // passes
    mask = (1 << digit) - 1
    order, spare = np.arange(n), np.empty(n, np.int64)
    sorted_keys, spare_keys = keys.copy(), np.empty(n, keys.dtype)
    counts = np.empty(mask + 2, np.int64)
    for p in range(passes):
        shift = p * digit
        counts[:] = 0
        for i in range(n):
            counts[((sorted_keys[i] >> shift) & mask) + 1] += 1
        for d in range(mask + 1):
            counts[d + 1] += counts[d]
        for i in range(n):
            d = (sorted_keys[i] >> shift) & mask
            spare[counts[d]] = order[i]
            spare_keys[counts[d]] = sorted_keys[i]
            counts[d] += 1
        order, spare = spare, order
        sorted_keys, spare_keys = spare_keys, sorted_keys
    unique, inverse, u = np.empty(n, keys.dtype), np.empty(n, np.int64), -1
    for i in range(n):
        if u < 0 or sorted_keys[i] != unique[u]:
            u += 1
            unique[u] = sorted_keys[i]
        inverse[order[i]] = u
    return unique[:u + 1].copy(), inverse

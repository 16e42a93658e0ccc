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


@njit(nogil=True, cache=True)
def table_keys(ids, counts, sizes):
    """Ids of tables looked up one after another (``counts[t]`` of table t, whose ids are in
    [0, ``sizes[t]``)) as keys over every table's rows together (table t's ids shifted past the
    rows of the tables before it); (keys, the first id outside its table or -1)."""
    keys = np.empty(len(ids), np.int64)
    k, base = 0, 0
    for t in range(len(counts)):
        for _ in range(counts[t]):
            value = ids[k]
            if value < 0 or value >= sizes[t]:
                return keys, k
            keys[k] = value + base
            k += 1
        base += sizes[t]
    return keys, -1


@njit(nogil=True, cache=True)
def split_keys(unique, sizes):
    """Sorted unique keys (``table_keys``') back to each table's ids; (ids, where each table's
    start among them, one more entry: the end)."""
    local = np.empty(len(unique), np.int64)
    starts = np.empty(len(sizes) + 1, np.int64)
    t, base, end = 0, 0, sizes[0] if len(sizes) else 0
    starts[0] = 0
    for i in range(len(unique)):
        while unique[i] >= end:
            t += 1
            starts[t] = i
            base = end
            end += sizes[t]
        local[i] = unique[i] - base
    while t < len(sizes):
        t += 1
        starts[t] = len(unique)
    return local, starts


@njit(nogil=True, cache=True)
def bag_of(lengths):
    """For bags of ``lengths`` laid one after another: each item's bag."""
    out = np.empty(lengths.sum(), np.int64)
    k = 0
    for b in range(len(lengths)):
        for _ in range(lengths[b]):
            out[k] = b
            k += 1
    return out

"""The owner's side of table-wise pooling: pooled gradients back to row gradients.

``pooled_rows``: for every lookup k of every sender (senders in rank order, each one's lookups
in bag order) ``partial[id] += grad[bag_of[k]] * factor[k]``, then per sender each id's
partial times ``scale`` added into the id's total: the very sums a trainer's pooled backward
(``rows.pooled_grad``), its 1/trainers scaling and the owner's merge of senders (``rows.merge_runs``)
make, bit for bit, without the rows travelling.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def _slot(row, shift):
    return np.int64((np.uint64(row) * np.uint64(0x9E3779B97F4A7C15)) >> shift)


@njit(nogil=True, cache=True)
def pooled_rows(ids, bag_of, factors, grads, starts, live, scale):
    """(ids in first-seen order, their summed gradients) of one table. ``starts[r]``: sender
    r's first lookup (one more entry: the end); ``live[r]``: whether r sent gradients;
    ``factors``: per lookup, or empty (factor 1). Ids are found in two small open-addressing
    tables (the step's, and the sender's: entries of an earlier sender count as empty)."""
    n, width = len(ids), grads.shape[1]
    bits = 1
    while (1 << bits) < 2 * n:
        bits += 1
    cap, shift = 1 << bits, np.uint64(64 - bits)
    mask = cap - 1
    step_key, step_at = np.full(cap, -1, np.int64), np.empty(cap, np.int64)
    own_key, own_at, own_of = np.empty(cap, np.int64), np.empty(cap, np.int64), np.full(cap, -1, np.int64)
    out_ids = np.empty(n, np.int64)
    total = np.zeros((n, width), grads.dtype)
    partial = np.empty((n, width), grads.dtype)
    touched = np.empty(n, np.int64)
    scaled = len(factors) > 0
    u = 0
    for r in range(len(starts) - 1):
        if not live[r]:
            continue
        p = 0
        for k in range(starts[r], starts[r + 1]):
            row = ids[k]
            h = _slot(row, shift)
            while own_of[h] == r and own_key[h] != row:
                h = (h + 1) & mask
            if own_of[h] != r:
                own_of[h], own_key[h], own_at[h] = r, row, p
                touched[p] = row
                for j in range(width):
                    partial[p, j] = 0
                p += 1
            at, bag = own_at[h], bag_of[k]
            if scaled:
                factor = factors[k]
                for j in range(width):
                    partial[at, j] += grads[bag, j] * factor
            else:
                for j in range(width):
                    partial[at, j] += grads[bag, j]
        for q in range(p):
            row = touched[q]
            h = _slot(row, shift)
            while step_key[h] != -1 and step_key[h] != row:
                h = (h + 1) & mask
            if step_key[h] == -1:
                step_key[h], step_at[h] = row, u
                out_ids[u] = row
                u += 1
            at = step_at[h]
            for j in range(width):
                total[at, j] += partial[q, j] * scale
    return out_ids[:u], total[:u]

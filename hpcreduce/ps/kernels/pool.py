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
def pooled_rows(ids, bag_of, factors, grads, starts, live, scale, scratch):
    """(ids in first-seen order, their summed gradients) of one table. ``starts[r]``: sender
    r's first lookup (one more entry: the end); ``live[r]``: whether r sent gradients;
    ``factors``: per lookup, or empty (factor 1); ``scratch``: rows x 3 int64, all -1 (left so)."""
    n, width = len(ids), grads.shape[1]
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
            if scratch[row, 1] != r:
                scratch[row, 1] = r
                scratch[row, 2] = p
                touched[p] = row
                for j in range(width):
                    partial[p, j] = 0
                p += 1
            at, bag = scratch[row, 2], bag_of[k]
            if scaled:
                factor = factors[k]
                for j in range(width):
                    partial[at, j] += grads[bag, j] * factor
            else:
                for j in range(width):
                    partial[at, j] += grads[bag, j]
        for q in range(p):
            row = touched[q]
            if scratch[row, 0] < 0:
                scratch[row, 0] = u
                out_ids[u] = row
                u += 1
            at = scratch[row, 0]
            for j in range(width):
                total[at, j] += partial[q, j] * scale
    for i in range(u):
        scratch[out_ids[i], 0] = -1
        scratch[out_ids[i], 1] = -1
    return out_ids[:u], total[:u]

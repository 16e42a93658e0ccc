"""Optimizer updates on a shard's tables, and summing sparse row gradients.

Dense: the optimizer runs on the whole piece in place. Sparse (lazy): only the rows a
push touches are updated, with their optimizer state, in one compiled pass (``kernels.rows``);
untouched rows and their state do not change. Duplicate ids' gradients are summed by a
compiled loop in the order given (``np.add.at``'s sums, without its cost).
Cost: O(piece) or O(rows pushed).
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple

import numpy as np

from .optimizers import FUSED_DTYPES, Optimizer
from .kernels import kernel

SUM_INTO, GATHER = kernel("rows", "sum_into"), kernel("rows", "gather")


def apply_dense(table, grad: np.ndarray, optimizer: Optimizer, step: int) -> None:
    """One optimizer update of the whole dense piece."""
    optimizer.update(table.values, grad, table.optimizer_state, step)
    table.version += 1


def update_rows(store, positions: np.ndarray, grads: np.ndarray, optimizer: Optimizer, step: int) -> None:
    """One lazy update of the rows at ``positions`` (unique) of a row store's arrays
    (``row_store``): only those rows and their optimizer state change."""
    optimizer.update_rows(rows_2d(store.values), {name: rows_2d(a) for name, a in store.optimizer_state.items()},
                          positions, rows_2d(grads), step)
    store.version += 1


def gather_rows(values: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``values[positions]`` (a copy): a compiled loop for float32/float64 rows."""
    if values.dtype not in FUSED_DTYPES or not values.flags.c_contiguous:
        return values[positions]
    gathered = GATHER(rows_2d(values), np.ascontiguousarray(positions, dtype=np.int64))
    return gathered.reshape((len(gathered),) + values.shape[1:])


def rows_2d(array: np.ndarray) -> np.ndarray:
    """``array`` (rows x any row shape) seen as rows x row width (a view)."""
    return array.reshape(len(array), math.prod(array.shape[1:]))


def sum_rows(parts: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Tuple[np.ndarray, np.ndarray]:
    """Sum row gradients given as (ids, grads) pairs: sorted unique ids, summed rows.

    Rows with the same id are added in the order given, so the result is reproducible.
    """
    if len(parts) == 1:
        return parts[0]
    ids = np.concatenate([p[0] for p in parts])
    grads = np.concatenate([p[1] for p in parts])
    unique, inverse = np.unique(ids, return_inverse=True)
    total = np.zeros((len(unique),) + grads.shape[1:], dtype=grads.dtype)
    if grads.dtype in FUSED_DTYPES:
        SUM_INTO(rows_2d(total), inverse.astype(np.int64, copy=False), rows_2d(grads))
    else:
        np.add.at(total, inverse, grads)
    return unique, total


def joined(pieces: Sequence[np.ndarray]) -> np.ndarray:
    """``np.concatenate(pieces)`` (one dtype and row shape), without the copy when the pieces
    already lie one after another in one buffer (a pull's rows, one gradient split by table):
    then a view of that buffer."""
    first = pieces[0]
    root = first
    while isinstance(root.base, np.ndarray):
        root = root.base
    begin = at = first.__array_interface__["data"][0]
    for piece in pieces:
        if (piece.dtype != first.dtype or piece.shape[1:] != first.shape[1:] or not piece.flags.c_contiguous
                or piece.__array_interface__["data"][0] != at):
            return np.concatenate(pieces)
        at += piece.nbytes
    offset = begin - root.__array_interface__["data"][0]
    if not root.flags.c_contiguous or offset < 0 or offset + (at - begin) > root.nbytes:
        return np.concatenate(pieces)
    span = root.reshape(-1).view(np.uint8)[offset:offset + at - begin]
    return span.view(first.dtype).reshape((-1,) + first.shape[1:])

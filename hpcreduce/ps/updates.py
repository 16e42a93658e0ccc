"""Optimizer updates on a shard's tables, and summing sparse row gradients.

Dense: the optimizer runs on the whole piece in place. Sparse (lazy): only the rows a
push touches are updated, with their optimizer state, in one compiled pass (``kernels.rows``);
untouched rows and their state do not change. Duplicate ids' gradients are summed by a
compiled loop in the order given (``np.add.at``'s sums, without its cost).
Cost: O(piece) or O(rows pushed).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from .optimizers import FUSED_DTYPES, Optimizer
from .kernels import kernel
from .shard_state import TableShard

SUM_INTO = kernel("rows", "sum_into")


def local_rows(table: TableShard, ids: np.ndarray) -> Tuple[np.ndarray, Optional[int]]:
    """Positions of ``ids`` (in range) among the shard's owned rows, and the first id it
    does not own (None when it owns them all)."""
    local = table.position[ids]
    foreign = local < 0
    if foreign.any():
        return local, int(ids[np.argmax(foreign)])
    return local, None


def apply_dense(table: TableShard, grad: np.ndarray, optimizer: Optimizer, step: int) -> None:
    """One optimizer update of the whole dense piece."""
    optimizer.update(table.values, grad, table.optimizer_state, step)
    table.version += 1


def apply_rows(table: TableShard, local: np.ndarray, grads: np.ndarray, optimizer: Optimizer,
               step: int) -> None:
    """One lazy update of the rows at positions ``local`` (unique) of a sparse table (one
    compiled pass: ``Optimizer.update_rows``)."""
    optimizer.update_rows(rows_2d(table.values), {name: rows_2d(array) for name, array in table.optimizer_state.items()},
                          local, rows_2d(grads), step)
    table.version += 1


def rows_2d(array: np.ndarray) -> np.ndarray:
    """``array`` (rows x any row shape) seen as rows x row width (a view)."""
    return array.reshape(len(array), int(np.prod(array.shape[1:], dtype=np.int64)))


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

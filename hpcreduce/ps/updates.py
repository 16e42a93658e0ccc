"""Optimizer updates on a shard's tables, and summing sparse row gradients.

Dense: the optimizer runs on the whole piece in place. Sparse (lazy): only the rows a
push touches are gathered with their optimizer state, updated, and scattered back;
untouched rows and their state do not change. Cost: O(piece) or O(rows pushed).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from .optimizers import Optimizer
from .shard_state import TableShard


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
    """One lazy update of the rows at positions ``local`` (unique) of a sparse table."""
    rows = table.values[local]
    state = {name: array[local] for name, array in table.optimizer_state.items()}
    optimizer.update(rows, grads, state, step)
    table.values[local] = rows
    for name, array in state.items():
        table.optimizer_state[name][local] = array
    table.version += 1


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
    np.add.at(total, inverse, grads)
    return unique, total

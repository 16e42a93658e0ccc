"""Rows changing rank, off the hot path (recovery, checkpoint loads, growth): to their owners, and replicas.

Python objects through ``alltoall``/``sendrecv``: these run once per failure or load, never
per step.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..optimizers import Optimizer
from .layout import ColocatedLayout
from .store import ShardStore

Rows = Tuple[int, np.ndarray, np.ndarray, Dict[str, np.ndarray]]  # table, ids, values, optimizer state


def deliver(comm: MPI.Intracomm, layout: ColocatedLayout, store: ShardStore, rows: Iterable[Rows]) -> None:
    """Send ``rows`` each to its owner under ``layout`` (collective); ``store`` takes what arrives."""
    outgoing: List[List[Rows]] = [[] for _ in range(comm.Get_size())]
    for t, ids, values, state in rows:
        owners = layout.owner_ranks(t, ids)
        for rank in np.unique(owners).tolist():
            chosen = owners == rank
            outgoing[rank].append((t, ids[chosen], values[chosen], {n: a[chosen] for n, a in state.items()}))
    for pieces in comm.alltoall(outgoing):
        for t, ids, values, state in pieces:
            store.take(t, ids, values, state)


def placed(comm: MPI.Intracomm, layout: ColocatedLayout, key: int, optimizers: Mapping[int, Optimizer],
           rows: Iterable[Rows], step: int, lazy: Optional[int]) -> ShardStore:
    """A new shard of key ``key`` holding, of ``rows`` (every rank gives some: a checkpoint's files,
    or the shards of before a growth), those it owns under ``layout``, each table's last step
    applied ``step - 1`` (a step is applied at most once); ``lazy``: the seed of the rows not
    given (``store``). Collective."""
    store = ShardStore.empty(key, layout.specs, optimizers, lazy)
    deliver(comm, layout, store, rows)
    store.last_step = {t: step - 1 for t in store.tables}
    return store


def replicate(comm: MPI.Intracomm, layout: ColocatedLayout, key: int, store: ShardStore) -> Optional[ShardStore]:
    """Send ``store`` whole to the ring successor of ``key``; the predecessor's shard, this rank's
    new replica (None on one rank)."""
    if comm.Get_size() < 2:
        return None
    return comm.sendrecv(store, dest=layout.rank_of(layout.successor[key]),
                         source=layout.rank_of(layout.predecessor[key]))

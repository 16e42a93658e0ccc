"""After a PS run: every table whole, on every rank (only when a caller asks for it).

Collective over every rank (servers and workers), once, after the servers stopped
serving. Cost: one broadcast per dense piece and one per (sparse table, shard): the
model's bytes, from its servers to all ranks.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
from mpi4py import MPI

from .layout import Layout
from .state import ShardState


def gather_params(comm: MPI.Intracomm, layout: Layout,
                    state: Optional[ShardState]) -> Dict[str, np.ndarray]:
    """Every table whole, on every rank, broadcast piece by piece from its server."""
    rank = comm.Get_rank()
    params: Dict[str, np.ndarray] = {}
    for table, spec in enumerate(layout.specs):
        whole = np.empty(spec.shape, dtype=spec.dtype)
        if spec.sparse:
            owners = layout.placement.row_owners(table, np.arange(spec.shape[0], dtype=np.int64))
            for shard, root in sorted(layout.shard_ranks.items()):
                ids = np.flatnonzero(owners == shard)
                rows = state.tables[table].values if rank == root else \
                    np.empty((len(ids),) + tuple(spec.shape[1:]), dtype=spec.dtype)
                comm.Bcast(rows, root=root)
                whole[ids] = rows
        else:
            flat = whole.reshape(-1)
            for piece in layout.placement.pieces[table]:
                root = layout.shard_ranks[piece.shard]
                if rank == root:
                    flat[piece.start:piece.stop] = state.tables[table].values
                comm.Bcast(flat[piece.start:piece.stop], root=root)
        params[spec.name] = whole
    return params

"""After a PS run: parameters read from the servers' shards, collectively, without ever
assembling the whole model unless a caller asks for it.

Collective over every rank (servers and workers), after the servers stopped serving.

- ``gather_dense``: every dense table whole on every rank (one broadcast per piece: the
  dense bytes, which every worker holds anyway to compute);
- ``fetch_rows``: each rank gets the rows of its own ids of a sparse table from the
  servers that own them (two ``Alltoallv``: ids out, rows back; bytes: the rows asked);
- ``gather_params``: every table whole on every rank (one broadcast per dense piece and
  per (sparse table, shard)): only for a model small enough to sit on every rank.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
from mpi4py import MPI

from .layout import Layout
from .shard_state import ShardState
from .tables import row_width


def gather_dense(comm: MPI.Intracomm, layout: Layout, state: Optional[ShardState]) -> Dict[str, np.ndarray]:
    """Every dense table whole, on every rank, broadcast piece by piece from its server."""
    rank = comm.Get_rank()
    params: Dict[str, np.ndarray] = {}
    for table, spec in enumerate(layout.specs):
        if spec.sparse:
            continue
        whole = np.empty(spec.shape, dtype=spec.dtype)
        flat = whole.reshape(-1)
        for piece in layout.placement.pieces[table]:
            root = layout.shard_ranks[piece.shard]
            if rank == root:
                flat[piece.start:piece.stop] = state.tables[table].values
            comm.Bcast(flat[piece.start:piece.stop], root=root)
        params[spec.name] = whole
    return params


def fetch_rows(comm: MPI.Intracomm, layout: Layout, state: Optional[ShardState], table: int,
               ids: np.ndarray) -> np.ndarray:
    """The rows ``ids`` (in range) of sparse table ``table``, aligned with ``ids``, fetched
    from their owners; every rank passes its own ids (collective)."""
    spec = layout.specs[table]
    size, width = comm.Get_size(), row_width(spec)
    ids = np.asarray(ids, dtype=np.int64)
    rank_of_key = np.zeros(max(layout.shard_ranks) + 1, np.int64)
    for key, rank in layout.shard_ranks.items():
        rank_of_key[key] = rank
    ranks = rank_of_key[layout.placement.row_owners(table, ids)]
    order = np.argsort(ranks, kind="stable")
    asked = np.bincount(ranks, minlength=size).astype(np.int64)
    wanted = np.empty(size, np.int64)
    comm.Alltoall(asked, wanted)
    incoming = np.empty(int(wanted.sum()), np.int64)
    comm.Alltoallv([ids[order], (asked, _offsets(asked))], [incoming, (wanted, _offsets(wanted))])
    dtype = np.dtype(spec.dtype)
    answer = np.empty((len(incoming), width), dtype)
    if len(incoming):
        rows = state.tables[table].rows(incoming)
        answer[:] = rows.reshape(len(incoming), width)
    rows = np.empty((len(ids), width), dtype)
    comm.Alltoallv([answer, (wanted * width, _offsets(wanted) * width)],
                   [rows, (asked * width, _offsets(asked) * width)])
    aligned = np.empty_like(rows)
    aligned[order] = rows
    return aligned.reshape((len(ids),) + tuple(spec.shape[1:]))


def _offsets(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def gather_params(comm: MPI.Intracomm, layout: Layout,
                  state: Optional[ShardState]) -> Dict[str, np.ndarray]:
    """Every table whole, on every rank, broadcast piece by piece from its server."""
    rank = comm.Get_rank()
    params = gather_dense(comm, layout, state)
    for table, spec in enumerate(layout.specs):
        if not spec.sparse:
            continue
        whole = np.empty(spec.shape, dtype=spec.dtype)
        owners = layout.placement.row_owners(table, np.arange(spec.shape[0], dtype=np.int64))
        for shard, root in sorted(layout.shard_ranks.items()):
            ids = np.flatnonzero(owners == shard)
            rows = state.tables[table].values if rank == root else \
                np.empty((len(ids),) + tuple(spec.shape[1:]), dtype=spec.dtype)
            comm.Bcast(rows, root=root)
            whole[ids] = rows
        params[spec.name] = whole
    return {spec.name: params[spec.name] for spec in layout.specs}

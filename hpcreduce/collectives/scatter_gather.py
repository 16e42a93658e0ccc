"""The ring allreduce's two halves on their own: ``reduce_scatter`` and ``allgather`` (ZeRO-2).

Both work in place on one flat host array cut into ``len(bounds) - 1`` chunks (rank r's is
``x[bounds[r]:bounds[r + 1]]``, any lengths, empty ones included). ``reduce_scatter``: N-1 ring
steps, rank r sends to r+1 and combines what comes from r-1, and ends holding chunk r reduced
over every rank (the other chunks hold partial sums). ``allgather``: N-1 ring steps passing
finished chunks on, so every rank ends holding every rank's chunk. Each sends and receives
(N-1)/N of the array (half an allreduce's bytes), counted in the context's traffic. The caller
guarantees that every rank calls with the same bounds and dtype (the torch wrapper agreed on its
buckets at construction); a peer's death raises ULFM's error with no request left behind.
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np
from mpi4py import MPI

from ..runtime.context import Context
from ..runtime.failures import abandon, is_process_failure, wait_all
from .ops import ReduceOp

TAG = 0x5253  # "RS"


def reduce_scatter(context: Context, x: np.ndarray, bounds: Sequence[int], op: ReduceOp) -> None:
    """Leave chunk ``context.rank`` of ``x`` reduced over every rank (``op.finish`` applied)."""
    size, rank = context.size, context.rank
    if size > 1:
        scratch = np.empty(max(b - a for a, b in zip(bounds[:-1], bounds[1:])), dtype=x.dtype)
        moved = _ring(context, x, bounds, [((rank - s - 1) % size, (rank - s - 2) % size) for s in range(size - 1)],
                      scratch, op)
        context.traffic.add(*moved)
    op.finish(x[bounds[rank]:bounds[rank + 1]], size)


def allgather(context: Context, x: np.ndarray, bounds: Sequence[int]) -> None:
    """Every rank's chunk of ``x`` (its own in place) into every rank's ``x``."""
    size, rank = context.size, context.rank
    if size > 1:
        context.traffic.add(*_ring(context, x, bounds,
                                   [((rank - s) % size, (rank - s - 1) % size) for s in range(size - 1)]))


def _ring(context: Context, x: np.ndarray, bounds: Sequence[int], steps: List[tuple],
          scratch: np.ndarray = None, op: ReduceOp = None) -> tuple:
    """Run ``steps`` of (chunk sent right, chunk received from the left): received into
    ``scratch`` and combined with ``op``, or (no op) straight into place. Bytes (sent, received)."""
    comm: MPI.Intracomm = context.comm
    right, left = (context.rank + 1) % context.size, (context.rank - 1) % context.size
    sent = received = 0
    for out, into in steps:
        a, b = bounds[into], bounds[into + 1]
        landing = scratch[:b - a] if op is not None else x[a:b]
        requests = [comm.Irecv(landing, left, TAG), comm.Isend(x[bounds[out]:bounds[out + 1]], right, TAG)]
        try:
            wait_all(requests)
        except MPI.Exception as error:
            if is_process_failure(error):
                abandon(comm, requests)
            raise
        if op is not None:
            op.combine(np, x[a:b], landing, x[a:b])
        sent += (bounds[out + 1] - bounds[out]) * x.itemsize
        received += (b - a) * x.itemsize
    return sent, received

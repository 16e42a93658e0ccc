"""The ring allreduce's two halves on their own: reduce-scatter and allgather (ZeRO-2).

``ScatterGather(context, room)`` runs both, in place, on flat host arrays of at most ``room``
bytes cut into ``len(bounds) - 1`` chunks (rank r's is ``x[bounds[r]:bounds[r + 1]]``, any
lengths, empty ones included). ``reduce_scatter`` leaves chunk r of rank r reduced over every
rank (the other chunks hold partial sums); ``allgather`` gives every rank every rank's chunk.
Each rank sends and receives (N-1)/N of the array (half an allreduce's bytes), counted in the
context's traffic.

Where every rank shares one node and fault tolerance is off, both go through the node's shared
window, as the hierarchical allreduce's halves: ``reduce_scatter`` copies the others' chunks
into its slot and, after a node barrier, combines its own chunk from every slot;
``allgather`` writes its chunk into its slot and, after a barrier, copies the others' out. Two
regions per slot, used by the call's parity, make one barrier per call enough: a rank writes
region p of call k + 2 only after every rank passed call k + 1's barrier, so after every rank
finished reading call k. So the context's communicator must be this object's alone (no other
collective may use its window). Elsewhere, N-1 ring steps of messages: rank r sends to r+1 and
combines (or keeps) what comes from r-1; a peer's death raises ULFM's error with no request left
behind. The caller guarantees that every rank calls with the same bounds and dtype (the torch
wrapper agreed on its buckets at construction).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ..runtime.context import Context
from ..runtime.failures import abandon, is_process_failure, wait_all
from .node_window import node_window, shared_exchange
from .ops import ReduceOp

TAG = 0x5253  # "RS"


class ScatterGather:
    """Reduce-scatters and allgathers of arrays up to ``room`` bytes over ``context``'s ranks."""

    def __init__(self, context: Context, room: int):
        self.context = context
        self.room = -(-max(room, 1) // 8) * 8
        self.calls = 0
        self.shared = node_window(context.comm) if context.size > 1 and shared_exchange(context) is not None \
            else None

    def reduce_scatter(self, x: np.ndarray, bounds: Sequence[int], op: ReduceOp) -> None:
        """Leave chunk ``rank`` of ``x`` reduced over every rank (``op.finish`` applied)."""
        size, rank = self.context.size, self.context.rank
        a, b = bounds[rank], bounds[rank + 1]
        if self.shared is not None:
            slots = self._slots(x)
            mine = slots[rank]
            mine[:a], mine[b:] = x[:a], x[b:]  # only the others read this slot, never at [a, b)
            self.shared.fence()
            for other in range(size):
                if other != rank:
                    op.combine(np, x[a:b], slots[other][a:b], x[a:b])
            self.context.traffic.add(x.nbytes - x[a:b].nbytes, x.nbytes - x[a:b].nbytes)
        elif size > 1:
            scratch = np.empty(max(high - low for low, high in zip(bounds[:-1], bounds[1:])), dtype=x.dtype)
            self.context.traffic.add(*self._ring(x, bounds, [((rank - s - 1) % size, (rank - s - 2) % size)
                                                             for s in range(size - 1)], scratch, op))
        op.finish(x[a:b], size)

    def allgather(self, x: np.ndarray, bounds: Sequence[int]) -> None:
        """Every rank's chunk of ``x`` (its own in place) into every rank's ``x``."""
        size, rank = self.context.size, self.context.rank
        a, b = bounds[rank], bounds[rank + 1]
        if self.shared is not None:
            slots = self._slots(x)
            slots[rank][a:b] = x[a:b]
            self.shared.fence()
            for other in range(size):
                if other != rank:
                    low, high = bounds[other], bounds[other + 1]
                    x[low:high] = slots[other][low:high]
            self.context.traffic.add(x[a:b].nbytes, x.nbytes - x[a:b].nbytes)
        elif size > 1:
            self.context.traffic.add(*self._ring(x, bounds, [((rank - s) % size, (rank - s - 1) % size)
                                                             for s in range(size - 1)]))

    def _slots(self, x: np.ndarray) -> List[np.ndarray]:
        """Every rank's region of this call's parity, as ``x``'s dtype and size."""
        if x.nbytes > self.room:
            raise ValueError(f"ScatterGather: {x.nbytes} bytes exceed its room of {self.room}")
        slots, _ = self.shared.areas(2 * self.room, np.dtype(np.uint8))
        parity, self.calls = self.calls & 1, self.calls + 1
        return [slot[parity * self.room:parity * self.room + x.nbytes].view(x.dtype) for slot in slots]

    def _ring(self, x: np.ndarray, bounds: Sequence[int], steps: List[Tuple[int, int]],
              scratch: Optional[np.ndarray] = None, op: Optional[ReduceOp] = None) -> Tuple[int, int]:
        """Run ``steps`` of (chunk sent right, chunk received from the left): received into
        ``scratch`` and combined with ``op``, or (no op) straight into place. Bytes (sent, received)."""
        comm: MPI.Intracomm = self.context.comm
        right, left = (self.context.rank + 1) % self.context.size, (self.context.rank - 1) % self.context.size
        sent = received = 0
        for out, into in steps:
            a, b = bounds[into], bounds[into + 1]
            landing = scratch[:b - a] if scratch is not None else x[a:b]
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

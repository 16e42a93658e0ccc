"""Ring allreduce: N-1 reduce-scatter steps, then N-1 allgather steps, pipelined in segments.

Cost (N ranks, n bytes): 2(N-1) steps; each rank sends and receives 2(N-1)/N * n bytes
and combines (N-1)/N * n bytes of elements.

Rank r sends to r+1 and receives from r-1. The buffer is cut into N chunks (any
length, empty ones included). At step s (0 <= s < 2N-2) rank r receives chunk
(r-s-1) mod N; during the first N-1 steps it combines it with its own input, after
which it holds the finished chunk r+1; the last N-1 steps pass finished chunks on.
Each chunk travels in segments of at most ``segment_bytes``: a segment is forwarded
as soon as it has been combined, so the next step's sends overlap this step's
arithmetic, and receives are posted two steps ahead so data lands in place.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from mpi4py import MPI

from ..runtime.failures import abandon, is_process_failure, wait_all
from .ops import ReduceOp
from .transfer import DirectTransfer, StagedTransfer

TAG = 0x5249  # "RI"
DEFAULT_SEGMENT_BYTES = 1 << 20

Ranges = List[Tuple[int, int]]


def chunk_bounds(n: int, parts: int) -> List[int]:
    """Boundaries of ``parts`` near-equal chunks of ``n`` elements (sizes differ by at most 1)."""
    return [(n * i) // parts for i in range(parts + 1)]


def segments(begin: int, end: int, step: int) -> Ranges:
    """``[begin, end)`` cut into ranges of at most ``step`` elements; one empty range if empty."""
    return [(a, min(end, a + step)) for a in range(begin, end, step)] or [(begin, begin)]


def ring_allreduce(comm: MPI.Intracomm, x, out, op: ReduceOp, transfer: DirectTransfer,
                   segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> Tuple[int, int]:
    """Reduce the flat array ``x`` over ``comm`` into the flat array ``out`` (may alias ``x``).

    Leaves the combined values in ``out`` (``op.finish``, for mean, is the caller's) and
    returns the payload bytes (sent, received) by this rank.
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1:
        if out is not x:
            out[...] = x
        return 0, 0
    right, left = (rank + 1) % size, (rank - 1) % size
    seg = max(1, segment_bytes // x.dtype.itemsize)
    bounds = chunk_bounds(x.size, size)
    chunk = [segments(bounds[i], bounds[i + 1], seg) for i in range(size)]
    steps = 2 * (size - 1)
    transfer.start(x, out)

    sends: Dict[int, List[MPI.Request]] = {0: [comm.Isend(transfer.outgoing(x, a, b), right, TAG)
                                               for a, b in chunk[rank]]}
    # Step 0 sends from x; the allgather receives into out: only when those share memory
    # (in place, or a staged mirror) must step 0's sends finish before those receives.
    waited_sends = -1 if out is x or isinstance(transfer, StagedTransfer) else 0
    receives: Dict[int, List[Tuple[int, int, object, MPI.Request]]] = {}

    def post_receives(step: int) -> None:
        nonlocal waited_sends
        if step >= steps:
            return
        ranges = chunk[(rank - step - 1) % size]
        if step < size - 1:
            slot = "ring.received.%d" % (step & 1)
            scratch = transfer.incoming(slot, ranges[-1][1] - ranges[0][0])
            base = ranges[0][0]
            buffers = [scratch[a - base:b - base] for a, b in ranges]
        else:
            # The chunk lands where a send of step (step+1-size) read from: finish those first.
            while waited_sends < step + 1 - size:
                waited_sends += 1
                wait_all(sends.pop(waited_sends, []))
            buffers = [transfer.gathered(a, b) for a, b in ranges]
        receives[step] = [(a, b, buf, comm.Irecv(buf, left, TAG)) for (a, b), buf in zip(ranges, buffers)]

    try:
        post_receives(0)
        post_receives(1)
        for step in range(steps):
            reducing = step < size - 1
            forwards = sends.setdefault(step + 1, [])
            for a, b, buffer, request in receives[step]:
                request.Wait()
                if reducing:
                    transfer.combine(op, a, b, buffer)
                if step + 1 < steps:
                    source = transfer.outgoing(out, a, b) if reducing else transfer.gathered(a, b)
                    forwards.append(comm.Isend(source, right, TAG))
            del receives[step]
            post_receives(step + 2)
        for step in sorted(sends):
            wait_all(sends[step])
    except MPI.Exception as error:
        if is_process_failure(error):
            pending = [r for group in sends.values() for r in group]
            abandon(comm, pending + [entry[3] for group in receives.values() for entry in group])
        raise
    transfer.finish()
    return _span(chunk, (rank - s for s in range(steps))) * x.itemsize, \
        _span(chunk, (rank - s - 1 for s in range(steps))) * x.itemsize


def _span(chunk: List[Ranges], indices) -> int:
    """Elements in the chunks at ``indices`` (mod the number of chunks)."""
    return sum(chunk[i % len(chunk)][-1][1] - chunk[i % len(chunk)][0][0] for i in indices)

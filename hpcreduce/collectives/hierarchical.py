"""Hierarchical allreduce: node-local reduction in MPI-3 shared memory, leaders across nodes.

Cost (N ranks on M nodes, L ranks on a node, n bytes): every rank copies the (L-1)/L of
its n bytes that the others combine into its slot of a window shared by its node
(``MPI_Win_allocate_shared``) and, after a node barrier, combines its 1/L of the buffer
(its own input and the other L-1 slots) into the node's result (reading n bytes, writing
n/L); after a second barrier the M node leaders (node rank 0) allreduce the node results
with native ``MPI_Allreduce`` (2(M-1)/M * n bytes each way, the only bytes that cross
between nodes) and, after a third barrier (none with M = 1), every rank copies
the n-byte result out (a mean divided in that copy). No message moves within a node.
``hierarchical_pieces`` reads its input from arrays laid end to end where they lie (a torch
bucket's gradients as autograd made them), so the bucket needs no gathering copy.

Every element is combined in slot order (node rank 0, 1, ...) by one rank and the same
result buffer is read by all, so all ranks of a node end with the same bits; leaders get
the same bits from MPI's allreduce. The window is allocated on first use, kept on the
communicator (an MPI attribute; freed with it) and grown collectively when a larger
message comes: every rank of a node grows it in the same call, since all pass the same
size. Under fault tolerance (ULFM) shared windows are not used: ``allreduce`` runs native
``MPI_Allreduce`` or the ring instead (``stepped_aside``). Device arrays asked for by name
are staged through host memory (``auto`` gives them the ring).
"""
from __future__ import annotations

from typing import Iterator, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ..arrays import copy_into, host_pair, is_device_array
from .finite_copy import finish_sum
from .memory import start_address
from .native import native_moved
from .node_window import node_window
from .ops import ReduceOp
from .transfer import DirectTransfer

FAULT_TOLERANT_RING_FROM = 4 << 20


def hierarchical_allreduce(comm: MPI.Intracomm, x, out, op: ReduceOp,
                           transfer: DirectTransfer) -> Tuple[int, int]:
    """Reduce the flat array ``x`` over ``comm`` into ``out`` (may alias ``x``), the operator's
    ``finish`` applied (a mean divided in the copy out: no pass of its own); returns the bytes
    counted as sent and received, as for native: a bandwidth-optimal allreduce's."""
    if is_device_array(x):
        host_x, host_out = host_pair(x, out)
        moved = hierarchical_allreduce(comm, host_x, host_out, op, transfer)
        copy_into(out, host_out)
        return moved
    return hierarchical_pieces(comm, [x], out, op)[:2]


def hierarchical_pieces(comm: MPI.Intracomm, pieces: Sequence[np.ndarray], out: np.ndarray,
                        op: ReduceOp, summed: bool = False, in_place: bool = False) -> Tuple[int, int, float]:
    """``hierarchical_allreduce`` of the host arrays ``pieces`` laid end to end (flat, ``out``'s
    dtype, ``out.size`` values in all; any may be a view of ``out`` at its own place): each is
    read where it lies, so a buffer of scattered arrays needs no gathering copy of its own;
    ``in_place``: the result is copied out into the pieces themselves, ``out`` is left alone.
    The third value is the result's sum when ``summed`` (taken in the copy out, ``finish_sum``:
    the same on every rank), else 0."""
    if comm.Get_size() == 1:
        for piece, start in _placed(pieces):
            if not in_place and start_address(piece) != start_address(out[start:start + piece.size]):
                out[start:start + piece.size] = piece
        if not summed or out.dtype.kind != "f":
            return 0, 0, 0.0
        return 0, 0, sum(float(np.sum(x, dtype=np.float64)) for x in (pieces if in_place else [out]))
    shared = node_window(comm)
    n, size, me = out.size, shared.node_size, shared.node_rank
    slots, result = shared.areas(out.nbytes, out.dtype)
    a, b = n * me // size, n * (me + 1) // size
    mine = slots[me]
    for piece, start in _placed(pieces):  # only the others read this slot, never at [a, b)
        stop = start + piece.size
        if start < a:
            mine[start:min(stop, a)] = piece[:min(stop, a) - start]
        if stop > b:
            mine[max(start, b):stop] = piece[max(start, b) - start:]
    shared.fence()
    for piece, start in _placed(pieces):
        low, high = max(start, a), min(start + piece.size, b)
        if low >= high:
            continue
        parts = [piece[low - start:high - start] if other == me else slots[other][low:high] for other in range(size)]
        if size == 1:
            result[low:high] = parts[0]
        else:
            op.combine(np, parts[0], parts[1], result[low:high])
            for part in parts[2:]:
                op.combine(np, result[low:high], part, result[low:high])
    shared.fence()
    if shared.nodes > 1:
        if shared.leaders is not None:
            shared.leaders.Allreduce(MPI.IN_PLACE, result, op=op.mpi_op)
        shared.fence()
    total = 0.0
    for target, start in (_placed(pieces) if in_place else [(out, 0)]):
        if summed:
            total += finish_sum(op, result[start:start + target.size], target, comm.Get_size())
        else:
            op.finish_into(result[start:start + target.size], target, comm.Get_size())
    moved = native_moved(out.nbytes, comm.Get_size())
    return moved, moved, total


def _placed(pieces: Sequence[np.ndarray]) -> Iterator[Tuple[np.ndarray, int]]:
    """Each piece with the offset where it starts in the buffer they make end to end."""
    start = 0
    for piece in pieces:
        yield piece, start
        start += piece.size


def stepped_aside(algorithm: str, fault_tolerant: bool, nbytes: int) -> str:
    """The algorithm to run for ``algorithm``: under fault tolerance, where shared windows are
    not used, messages instead of hierarchical (native up to 4 MiB, the ring above, as measured
    on tcp) and of one_shot (native); the same choice on every rank (fault tolerance is on for
    the whole job or not)."""
    if fault_tolerant and algorithm == "hierarchical":
        return "native" if nbytes <= FAULT_TOLERANT_RING_FROM else "ring"
    return "native" if fault_tolerant and algorithm == "one_shot" else algorithm

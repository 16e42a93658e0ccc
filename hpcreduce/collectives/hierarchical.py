"""Hierarchical allreduce: node-local reduction in MPI-3 shared memory, leaders across nodes.

Cost (N ranks on M nodes, L ranks on a node, n bytes): every rank copies the (L-1)/L of
its n bytes that the others combine into its slot of a window shared by its node
(``MPI_Win_allocate_shared``) and, after a node barrier, combines its 1/L of the buffer
(its own input and the other L-1 slots) into the node's result (reading n bytes, writing
n/L); after a second barrier the M node leaders (node rank 0) allreduce the node results
with native ``MPI_Allreduce`` (2(M-1)/M * n bytes each way, the only bytes that cross
between nodes) and, after a third barrier (none with M = 1), every rank copies
the n-byte result out. No message moves within a node.

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

from typing import Tuple

import numpy as np
from mpi4py import MPI

from ..arrays import copy_into, host_pair, is_device_array
from .native import native_moved
from .node_window import node_window
from .ops import ReduceOp
from .transfer import DirectTransfer

FAULT_TOLERANT_RING_FROM = 4 << 20


def hierarchical_allreduce(comm: MPI.Intracomm, x, out, op: ReduceOp,
                           transfer: DirectTransfer) -> Tuple[int, int]:
    """Reduce the flat array ``x`` over ``comm`` into ``out`` (may alias ``x``); returns the
    bytes counted as sent and received, as for native: a bandwidth-optimal allreduce's."""
    if is_device_array(x):
        host_x, host_out = host_pair(x, out)
        moved = hierarchical_allreduce(comm, host_x, host_out, op, transfer)
        copy_into(out, host_out)
        return moved
    if comm.Get_size() == 1:
        if out is not x:
            out[...] = x
        return 0, 0
    shared = node_window(comm)
    n, size = x.size, shared.node_size
    slots, result = shared.areas(x.nbytes, x.dtype)
    a, b = n * shared.node_rank // size, n * (shared.node_rank + 1) // size
    mine = slots[shared.node_rank]
    mine[:a], mine[b:] = x[:a], x[b:]  # only the others read this slot, never at [a, b)
    shared.fence()
    parts = [x[a:b] if other == shared.node_rank else slots[other][a:b] for other in range(size)]
    if size == 1:
        result[a:b] = parts[0]
    else:
        op.combine(np, parts[0], parts[1], result[a:b])
        for part in parts[2:]:
            op.combine(np, result[a:b], part, result[a:b])
    shared.fence()
    if shared.nodes > 1:
        if shared.leaders is not None:
            shared.leaders.Allreduce(MPI.IN_PLACE, result, op=op.mpi_op)
        shared.fence()
    out[...] = result
    moved = native_moved(x.nbytes, comm.Get_size())
    return moved, moved


def stepped_aside(algorithm: str, fault_tolerant: bool, nbytes: int) -> str:
    """The algorithm to run for ``algorithm``: under fault tolerance, where shared windows are
    not used, messages instead of hierarchical (native up to 4 MiB, the ring above, as measured
    on tcp) and of one_shot (native); the same choice on every rank (fault tolerance is on for
    the whole job or not)."""
    if fault_tolerant and algorithm == "hierarchical":
        return "native" if nbytes <= FAULT_TOLERANT_RING_FROM else "ring"
    return "native" if fault_tolerant and algorithm == "one_shot" else algorithm

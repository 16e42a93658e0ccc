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

from typing import List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..arrays import copy_into, is_device_array, to_host
from .native import native_moved
from .ops import ReduceOp
from .transfer import DirectTransfer

_keyval: Optional[int] = None
FAULT_TOLERANT_RING_FROM = 4 << 20


class NodeWindow:
    """The node communicator, the leaders' communicator (node rank 0 of each node; None
    elsewhere) and a shared window of ``capacity`` bytes: L slots and a result area."""

    def __init__(self, comm: MPI.Intracomm):
        self.node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        self.node_rank, self.node_size = self.node.Get_rank(), self.node.Get_size()
        leaders = comm.Split(0 if self.node_rank == 0 else MPI.UNDEFINED, comm.Get_rank())
        self.leaders = None if leaders == MPI.COMM_NULL else leaders
        self.nodes = self.node.bcast(self.leaders.Get_size() if self.leaders is not None else 0, root=0)
        self.window: Optional[MPI.Win] = None
        self.capacity = 0

    def areas(self, nbytes: int, dtype: np.dtype) -> Tuple[List[np.ndarray], np.ndarray]:
        """L slots and the result area, ``nbytes`` each as ``dtype`` (collective over the node
        when the window grows). The areas sit a fixed stride apart (the capacity over L + 1),
        whatever the message size, so a rank that already writes its slot for the next call
        never touches the result area a slower rank is still copying out."""
        slot = -(-max(nbytes, 1) // 8) * 8
        if (self.node_size + 1) * slot > self.capacity:
            capacity = max((self.node_size + 1) * slot, 2 * self.capacity)
            self._release_window()  # collective: every rank has copied out the last result
            self.window = MPI.Win.Allocate_shared(capacity if self.node_rank == 0 else 0, 1, comm=self.node)
            self.window.Lock_all(MPI.MODE_NOCHECK)
            self.capacity = capacity
        memory, _ = self.window.Shared_query(0)
        shared = np.frombuffer(memory, dtype=np.uint8)
        stride = self.capacity // (self.node_size + 1) // 8 * 8
        area = [shared[j * stride:j * stride + nbytes].view(dtype) for j in range(self.node_size + 1)]
        return area[:-1], area[-1]

    def fence(self) -> None:
        """Every rank of the node has finished its writes to the window (and sees the others')."""
        self.window.Sync()
        self.node.Barrier()
        self.window.Sync()

    def free(self) -> None:
        self._release_window()
        for comm in (self.node, self.leaders):
            if comm is not None:
                comm.Free()

    def _release_window(self) -> None:
        if self.window is not None:
            self.window.Unlock_all()
            self.window.Free()
            self.window = None
            self.capacity = 0


def node_window(comm: MPI.Intracomm) -> NodeWindow:
    """``comm``'s NodeWindow, made on first use (collectively) and freed with ``comm``."""
    global _keyval
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=lambda _comm, _key, found: found.free())
    found = comm.Get_attr(_keyval)
    if found is None:
        found = NodeWindow(comm)
        comm.Set_attr(_keyval, found)
    return found


def hierarchical_allreduce(comm: MPI.Intracomm, x, out, op: ReduceOp,
                           transfer: DirectTransfer) -> Tuple[int, int]:
    """Reduce the flat array ``x`` over ``comm`` into ``out`` (may alias ``x``); returns the
    bytes counted as sent and received, as for native: a bandwidth-optimal allreduce's."""
    if is_device_array(x):
        host_x = to_host(x)
        host_out = np.empty_like(host_x)
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
    on tcp); the same choice on every rank (fault tolerance is on for the whole job or not)."""
    if fault_tolerant and algorithm == "hierarchical":
        return "native" if nbytes <= FAULT_TOLERANT_RING_FROM else "ring"
    return algorithm

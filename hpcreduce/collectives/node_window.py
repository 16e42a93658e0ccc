"""What the ranks of one node share: their communicator, the leaders' communicator, and MPI-3
shared windows (the hierarchical allreduce's slots, the exchange of checks and one-shot
payloads). Made on first use, collectively, kept on the communicator as an MPI attribute and
freed with it; never under fault tolerance (see ``exchange``).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..runtime.context import Context
from .exchange import SharedExchange

_keyval: Optional[int] = None


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
        self._exchange: Optional[SharedExchange] = None

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

    def exchange(self) -> SharedExchange:
        """The node's ``SharedExchange`` (collective over the node when first asked for)."""
        if self._exchange is None:
            self._exchange = SharedExchange(self.node)
        return self._exchange

    def free(self) -> None:
        if self._exchange is not None:
            self._exchange.free()
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


EXCHANGE = "exchange.shared"
"""The context-cache slot of the context's exchange (False where it has none)."""


def shared_exchange(context: Context) -> Optional[SharedExchange]:
    """The exchange that carries ``context``'s checks where all its ranks share one node and
    fault tolerance is off (collective on the first call per communicator), else None (checks
    then travel as an ``MPI_Allreduce``). Kept in the context's cache."""
    found = context.cache.get(EXCHANGE)
    if found is None:
        found = False
        if not context.ft and context.size > 1:
            shared = node_window(context.comm)
            if shared.nodes == 1:
                found = shared.exchange()
        context.cache[EXCHANGE] = found
    return found or None

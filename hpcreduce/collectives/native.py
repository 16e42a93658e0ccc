"""The MPI library's own ``MPI_Allreduce``, as one of the algorithms ``auto`` picks from.

Cost: whatever the library chooses (often recursive doubling for small and a ring or
Rabenseifner's algorithm for large messages); measured against in ``bench allreduce``.
"""
from __future__ import annotations

from typing import Tuple

from mpi4py import MPI

from .ops import ReduceOp
from ..arrays import synchronize
from .transfer import DirectTransfer, StagedTransfer


def native_allreduce(comm: MPI.Intracomm, x, out, op: ReduceOp,
                     transfer: DirectTransfer) -> Tuple[int, int]:
    """``MPI_Allreduce`` of the flat array ``x`` into ``out`` (may alias ``x``).

    Returns the bytes a bandwidth-optimal allreduce sends and receives, 2(N-1)/N * n
    each: MPI does not say what its own algorithm moved.

    With a staged transfer the whole buffer is copied to host memory, reduced there by
    MPI, and copied back: MPI's own arithmetic cannot run on the device.
    """
    if isinstance(transfer, StagedTransfer):
        transfer.start(x, out)
        comm.Allreduce(MPI.IN_PLACE, transfer.outgoing(x, 0, x.size), op=op.mpi_op)
        transfer.finish()
    else:
        synchronize(x)
        comm.Allreduce(MPI.IN_PLACE if out is x else x, out, op=op.mpi_op)
    moved = native_moved(x.nbytes, comm.Get_size())
    return moved, moved


def native_moved(nbytes: int, size: int) -> int:
    """What a bandwidth-optimal allreduce of ``nbytes`` sends (and receives) per rank: 2(N-1)/N * n."""
    return 2 * (size - 1) * nbytes // size

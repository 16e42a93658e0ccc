"""Recursive-doubling allreduce, the latency-bound algorithm for small messages.

Cost (N ranks, n bytes, P the largest power of two <= N): log2(P) steps, each sending
and receiving n bytes and combining n bytes; when N is not a power of two, 2 more
steps fold the N-P extra ranks in before and hand them the result after.

Ranks 2i and 2i+1 for i < N-P first combine into the odd one, the even one sits out;
the P remaining ranks exchange whole buffers with the partner whose (renumbered) index
differs in bit k at step k, and combine. Every rank combines the same operands in the
same order up to commutation, so all ranks end bitwise identical.
"""
from __future__ import annotations

from typing import Tuple

from mpi4py import MPI

from .ops import ReduceOp
from .transfer import DirectTransfer

TAG = 0x5244  # "RD"


def recursive_doubling_allreduce(comm: MPI.Intracomm, x, out, op: ReduceOp,
                                 transfer: DirectTransfer) -> Tuple[int, int]:
    """Reduce the flat array ``x`` over ``comm`` into ``out`` (may alias ``x``);
    return the payload bytes (sent, received) by this rank."""
    size, rank = comm.Get_size(), comm.Get_rank()
    if out is not x:
        out[...] = x
    if size == 1:
        return 0, 0
    n = out.size
    transfer.start(out, out)
    power = 1 << (size.bit_length() - 1)
    extra = size - power
    if rank < 2 * extra and rank % 2 == 0:
        comm.Send(transfer.outgoing(out, 0, n), rank + 1, TAG)
        comm.Recv(transfer.gathered(0, n), rank + 1, TAG)
        transfer.finish()
        return out.nbytes, out.nbytes
    index = rank // 2 if rank < 2 * extra else rank - extra
    if rank < 2 * extra:
        received = transfer.incoming("rd.received", n)
        comm.Recv(received, rank - 1, TAG)
        transfer.combine(op, 0, n, received)
    mask = 1
    while mask < power:
        peer_index = index ^ mask
        peer = peer_index * 2 + 1 if peer_index < extra else peer_index + extra
        received = transfer.incoming("rd.received", n)
        comm.Sendrecv(transfer.outgoing(out, 0, n), peer, TAG, received, peer, TAG)
        transfer.combine(op, 0, n, received)
        mask <<= 1
    exchanges = power.bit_length() - 1
    if rank < 2 * extra:
        comm.Send(transfer.outgoing(out, 0, n), rank - 1, TAG)
        return (exchanges + 1) * out.nbytes, (exchanges + 1) * out.nbytes
    return exchanges * out.nbytes, exchanges * out.nbytes

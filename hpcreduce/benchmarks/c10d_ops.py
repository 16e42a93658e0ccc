"""One call of each torch.distributed operation, on a given process group, for ``bench c10d``.

``calls(nbytes, group)`` gives every operation's call at a message of ``nbytes`` (the whole
tensor: all_reduce's, broadcast's, the gathered output of the gathers, the input of the
reduce-scatters, each rank's send buffer of the all-to-alls), float32 zeros (a sum of zeros
stays finite however often it runs), made once so only the operation is timed. Roots are rank 0;
send/recv pairs ranks 2k and 2k+1 (a rank without a partner sits it out).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import torch
import torch.distributed as dist

Call = Callable[[], object]


def calls(nbytes: int, group: Optional[dist.ProcessGroup]) -> Dict[str, Call]:
    """Every operation's call (``c10d.OPERATIONS``) on ``group`` (None: the default group) at ``nbytes``."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    part = max(1, nbytes // 4 // world)
    whole = torch.zeros(part * world)
    piece = torch.zeros(part)
    pieces = [torch.zeros(part) for _ in range(world)]
    received = [torch.zeros(part) for _ in range(world)]
    out = torch.empty_like(whole)
    partner = rank ^ 1
    paired = partner < world

    def send_recv() -> None:
        if not paired:
            return
        peer = dist.get_global_rank(group, partner) if group is not None else partner
        if rank % 2 == 0:
            dist.send(whole, peer, group=group)
            dist.recv(out, peer, group=group)
        else:
            dist.recv(out, peer, group=group)
            dist.send(whole, peer, group=group)

    def batch_isend_irecv() -> None:
        after, before = (rank + 1) % world, (rank - 1) % world
        if group is not None:
            after, before = dist.get_global_rank(group, after), dist.get_global_rank(group, before)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, whole, after, group),
                                            dist.P2POp(dist.irecv, out, before, group)]):
            work.wait()

    return {
        "all_reduce": lambda: dist.all_reduce(whole, group=group),
        "broadcast": lambda: dist.broadcast(whole, 0, group=group),
        "reduce": lambda: dist.reduce(whole, 0, group=group),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, piece, group=group),
        "all_gather": lambda: dist.all_gather(received, piece, group=group),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(piece, whole, group=group),
        "reduce_scatter": lambda: dist.reduce_scatter(piece, pieces, group=group),
        "all_to_all_single": lambda: dist.all_to_all_single(out, whole, group=group),
        "all_to_all": lambda: dist.all_to_all(received, pieces, group=group),
        "gather": lambda: dist.gather(piece, received if rank == 0 else None, 0, group=group),
        "scatter": lambda: dist.scatter(piece, pieces if rank == 0 else None, 0, group=group),
        "send_recv": send_recv,
        "batch_isend_irecv": batch_isend_irecv,
        "barrier": lambda: dist.barrier(group=group),
    }


def unsupported(call: Call) -> Optional[str]:
    """Why ``call`` does not run on its group (gloo has no list all_to_all, for one), or None."""
    try:
        call()
    except (RuntimeError, NotImplementedError, ValueError) as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    return None

"""One Sandblaster recovery, collective over the survivors (``--mode sandblaster --ft``).

The survivors shrink (servers keep their order, so they stay first) and re-derive the roles:
the surviving servers, a dead server's slices now served by their replica holders
(``Placement.after_loss``), the coordinator at rank K' (a worker promoted if the coordinator
died), the rest workers. Every server then takes the newest record of the coordinator's
committed state any server holds, and the run starts again from it. A failure during this
starts the round again on what is left (``ft.rounds``).
Cost: one small allgather and the broadcast of the records.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ...errors import TrainingError
from ...ft.events import RecoveryEvent
from ...ft.membership import Membership
from ...ft.rounds import Shrunk, shrink_until_restored
from ...runtime.context import Context
from ...sandblaster import Roles, unit_size
from ...sandblaster.placement import Placement
from ...sandblaster.record import Committed
from ...sandblaster.server import ServerState


@dataclass
class Lineup:
    """Who does what: the roles, the placement of the slices and the newest records of the
    coordinator's committed state (at the start, and after each recovery)."""

    roles: Roles
    placement: Placement
    records: List[np.ndarray]

    @classmethod
    def initial(cls, servers: int, size: int, length: int, replicate: bool) -> "Lineup":
        """K = ``servers`` servers of a vector of ``length`` (``replicate``: each slice on two)."""
        return cls(Roles(servers, size), Placement.initial(length, servers, replicate=replicate), [])

    def unit(self, batch: int, asked: Optional[int]) -> int:
        """Examples per work unit of a pass over ``batch`` (``asked``, or split over the workers)."""
        return unit_size(batch, asked, len(self.roles.workers))


def recover(ctx: Context, members: Membership, before: Lineup, server: Optional[ServerState], iteration: int,
            detected: float, before_shrink: Callable[[], None]) -> Tuple[Lineup, RecoveryEvent]:
    """Collective: shrink to the survivors (``members`` drops the lost ids), re-derive roles and
    placement, share the newest record; the event of the failure seen at ``detected``."""
    event = RecoveryEvent("failure", iteration, ctx.size, detected)
    now = [before]

    def restore(shrunk: Shrunk) -> List[np.ndarray]:
        event.lost += members.shrink(shrunk)
        event.rounds += shrunk.rounds
        event.shrink_s = time.time() - event.detected_at
        servers = sum(new is not None for new in shrunk.new_rank[:now[0].roles.servers])
        now[0] = Lineup(Roles(servers, ctx.size), now[0].placement.after_loss(shrunk.new_rank), [])
        if not now[0].roles.workers:
            raise TrainingError("sandblaster: no worker is left (%d ranks for %d servers and the coordinator): "
                                "nothing left to recover from" % (ctx.size, servers))
        return newest_records(ctx.comm, server)

    records = shrink_until_restored(ctx, restore, f"sandblaster recovery at iteration {iteration}",
                                    before_shrink=before_shrink)
    event.step = Committed.from_array(records[-1]).iteration + 1 if records else 1
    event.ranks_after = ctx.size
    event.restore_s = time.time() - event.detected_at - event.shrink_s
    return Lineup(now[0].roles, now[0].placement, records), event


def newest_records(comm: MPI.Intracomm, server: Optional[ServerState]) -> List[np.ndarray]:
    """The longest list of records any server holds (collective)."""
    counts = comm.allgather(len(server.records) if server else -1)
    best = int(np.argmax(counts))
    return comm.bcast(server.records if comm.Get_rank() == best else None, root=best)

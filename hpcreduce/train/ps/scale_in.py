"""Scale-in of a fault-tolerant PS run: ranks that leave gracefully (``--leave``, a discovery
file listing fewer hosts or ranks).

Rank 0 names the leavers (``resize_requests``) and revokes, as for growth; the recovery
round that follows plans them out like dead ranks, but they are alive and take part: a
leaving server's shards move from it (its own state, not the replica) to the remaining
servers in the rebalance and the replicas are rebuilt; a leaving worker's unacknowledged
push is re-pushed (ASP/SSP) or recomputed by the others from the restart step (BSP), its
training shards go to the others. Once the round is committed ``leave`` splits the
communicator without them (``runtime.spawn.split_off``) and they exit with status 0
(``leave_job``); what they acknowledged stays counted (``Epoch.departed``). Rank 0 keeps
the events: if it leaves, it hands them to the next rank 0 first.
Cost: the recovery round, one split.
"""
from __future__ import annotations

from dataclasses import replace
from typing import List, Tuple

from ...ft.events import RecoveryEvent
from ...ft.watchdog import watchdog
from ...ps.layout import Layout
from ...runtime.context import Context
from ...runtime.spawn import leave_job, split_off
from .ps_recovery import PSRecoveryEvent, Settled


def leave(ctx: Context, settled: Settled, event: PSRecoveryEvent, requested: float,
          events: List[RecoveryEvent]) -> Tuple[Settled, Layout, List[RecoveryEvent]]:
    """Collective, after a committed round with leavers: they exit, the others go on over the
    split communicator. Returns the round with the leavers gone, its layout in the new ranks
    and the events as rank 0 keeps them (never returns on a leaver)."""
    plan, before, epoch = settled.plan, settled.layout, settled.epoch
    ids = [epoch.members.ids[rank] for rank in plan.leaving]
    if 0 in plan.leaving:
        with watchdog.guard("leave: the events to the next rank 0"):
            events = ctx.comm.bcast(events, root=0)
    with watchdog.guard("leave: the split without the leavers"):
        staying = split_off(ctx.comm, ctx.rank in plan.leaving)
    if staying is None:
        leave_job(ctx.comm, finalize=ctx.joined)
    new_rank = {old: new for new, old in enumerate(r for r in range(ctx.size) if r not in plan.leaving)}
    ctx.replace_comm(staying)
    members = replace(epoch.members, ids=list(epoch.members.ids))
    members.leave(ids)
    if not event.lost:
        event.kind = "leave"
    event.left, event.requested_at, event.ranks_after = ids, requested, ctx.size
    left = epoch.but(comm=staying, members=members, departed=epoch.departed + tuple(settled.departed),
                     resized_before=max(epoch.resized_before, plan.left[1]))
    return replace(settled, epoch=left), before.renumbered(new_rank), events

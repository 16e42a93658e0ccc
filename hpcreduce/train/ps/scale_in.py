"""Scale-in of a fault-tolerant PS run: ranks that leave gracefully (``--leave``, a discovery
file listing fewer hosts or ranks).

Rank 0 names the leavers (``progress.StepHooks``) and revokes, as for growth; the recovery
round that follows plans them out like dead ranks, but they are alive and take part: a
leaving server's shards move from it (its own state, not the replica) to the remaining
servers in the rebalance and the replicas are rebuilt; a leaving worker's unacknowledged
push is re-pushed (ASP/SSP) or recomputed by the others from the restart step (BSP), its
training shards go to the others. Once the round is committed ``leave`` splits the
communicator without them (``runtime.spawn.split_off``) and they exit with status 0
(``leave_job``); what they acknowledged stays counted (``ElasticPS.departed``). Rank 0 keeps
the events: if it leaves, it hands them to the next rank 0 first.
Cost: the recovery round, one split.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...ft.watchdog import watchdog
from ...ps.layout import Layout
from ...runtime.spawn import leave_job, split_off
from .recovery import PSRecoveryEvent, Settled

if TYPE_CHECKING:
    from .ps_driver import ElasticPS


def leave(run: "ElasticPS", event: PSRecoveryEvent, settled: Settled, requested: float) -> Layout:
    """Collective, after a committed round with leavers: they exit, the others go on over the
    split communicator; returns the round's layout in the new ranks (never returns on a leaver)."""
    ctx, plan, before = run.ctx, settled.plan, settled.layout
    ids = [run.members.ids[rank] for rank in plan.leaving]
    if 0 in plan.leaving:
        with watchdog.guard("leave: the events to the next rank 0"):
            run.events.events = ctx.comm.bcast(run.events.events, root=0)
    with watchdog.guard("leave: the split without the leavers"):
        staying = split_off(ctx.comm, ctx.rank in plan.leaving)
    if staying is None:
        leave_job(ctx.comm, finalize=ctx.joined)
    new_rank = {old: new for new, old in enumerate(r for r in range(ctx.size) if r not in plan.leaving)}
    ctx.replace_comm(staying)
    run.members.leave(ids)
    run.departed += settled.departed
    run.hooks.grown_before = max(run.hooks.grown_before, plan.left[1])
    run.hooks.leave_wanted = ((), 0)
    if not event.lost:
        event.kind = "leave"
    event.left, event.requested_at, event.ranks_after = ids, requested, ctx.size
    return before.rebuilt({key: new_rank[rank] for key, rank in before.shard_ranks.items()},
                          [new_rank[rank] for rank in before.worker_ranks], before.worker_slots, before.slot_count)

"""Growth of a fault-tolerant PS run: newcomers are workers, appended after every rank.

Rank 0 asks for growth (``progress.StepHooks``) by revoking the communicator; the recovery
that follows carries the request in its plan, and once it is committed every rank calls
``grow``: spawn and merge (``runtime.spawn``), a new layout with the newcomers' slots
(never used before) and one broadcast of the layout to the newcomers, who ``join``: they
take the layout and become workers at the slowest clock (BSP: the restart step), pulling
every dense table at their first step (even off the ``--fetch-every`` schedule). Shards
make room for the new slots; the training shards are re-split over the grown set of workers
(``partition.owned_shards``: the newcomers read their share), recorded in the event. Cost: one spawn and merge, one broadcast of a few hundred bytes.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict

from ...ft.watchdog import watchdog
from ...ps.layout import Layout
from ...ps.recovery_plan import Committed, Plan
from ...ps.worker import Worker
from ...runtime.launch import this_program
from ...runtime.spawn import spawn_and_merge
from .recovery import PSRecoveryEvent
from ..partition import assignment

if TYPE_CHECKING:
    from .elastic import ElasticPS


def grow(run: "ElasticPS", count: int, kind: str, plan: Plan, step: int) -> None:
    """Spawn ``count`` workers and merge them in after every rank (collective); ``step``:
    growth is done for steps up to it."""
    ctx = run.ctx
    event = run.events.add(PSRecoveryEvent(kind, plan.resume_step, ctx.size, time.time()))
    with watchdog.guard(f"{kind}: spawn and merge"):
        merged = spawn_and_merge(ctx.comm, count, this_program())
    ctx.replace_comm(merged)
    event.joined = run.members.grow(count)
    old = run.committed.layout
    slots = list(range(old.slot_count, old.slot_count + count))
    layout = old.rebuilt(old.shard_ranks, list(old.worker_ranks) + list(range(ctx.size - count, ctx.size)),
                         list(old.worker_slots) + slots, old.slot_count + count)
    clock = plan.restart if plan.restart is not None else min(plan.clocks.values())
    run.committed = Committed(layout, run.committed.next_key)
    run.hooks.grown_before = max(run.hooks.grown_before, step)
    started = time.time()
    with watchdog.guard(f"{kind}: the layout to the newcomers"):
        ctx.comm.bcast(_control(run, clock), root=0)
    for state in run.holdings.everything():
        state.grow(layout.slot_count)
        state.clocks[slots] = clock
    run.worker_side.rejoin(ctx, layout)
    event.data_shards = assignment([run.members.ids[rank] for rank in layout.worker_ranks],
                                   run.dataset.shard_sizes("train"))
    run.build_roles(layout)
    event.ranks_after, event.restore_s = ctx.size, time.time() - started
    run.hooks.growth_wanted = (0, 0)


def _control(run: "ElasticPS", clock: int) -> Dict[str, Any]:
    layout = run.committed.layout
    return {**run.members.control(), "shard_ranks": layout.shard_ranks, "worker_ranks": layout.worker_ranks,
            "worker_slots": layout.worker_slots, "slot_count": layout.slot_count, "ring": layout.ring,
            "next_key": run.committed.next_key, "grown_before": run.hooks.grown_before, "clock": clock}


def join(run: "ElasticPS", control: Dict[str, Any]) -> None:
    """A spawned newcomer, with the job's broadcast ``control``: take the layout, become a worker."""
    ctx = run.ctx
    layout = Layout(run.specs, control["shard_ranks"], control["worker_ranks"], control["worker_slots"],
                    control["slot_count"], control["ring"])
    run.committed = Committed(layout, control["next_key"])
    run.hooks.grown_before = control["grown_before"]
    run.hooks.struck = run.hooks.struck_recovery = control["clock"]
    loop = run.new_loop(Worker(ctx.comm, layout, ctx.traffic, guard=watchdog.guard, clock=control["clock"]))
    loop.refetch = True  # its first step reads every dense table, whatever --fetch-every says
    run.worker_side.loop = loop
    run.observer.reporter = layout.worker_ranks[0]

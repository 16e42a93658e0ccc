"""One parameter-server recovery, collective over the survivors (``--mode ps`` with ULFM).

After a rank died (or the communicator was revoked to grow the job), every survivor:

1. shrinks the communicator (``ft.rounds``; survivors keep their order, so servers stay
   first) and gathers everyone's ``Report``; ``ps.recovery_plan.make_plan`` gives the
   same plan everywhere;
2. takes over shards: a dead server's shard from the replica its backup holds, a shard
   lost with its replica from the latest checkpoint (under BSP every shard then goes back
   to that checkpoint), and with no server left the first worker is promoted to server;
3. BSP: every shard applies the buffered steps below the restart step and drops the later
   ones, which the workers compute again over the new split of the batch. ASP/SSP: every
   worker re-pushes its unacknowledged push; shards drop what they already have
   (``ps.rebalance``). After this the system is quiescent;
4. rebalances: the placement is recomputed over the live shard keys and fragments move
   to their new owners; replicas are rebuilt (each server sends its shard to its backup);
5. commits with ``Agree``: only then is anything installed (``ElasticPS.install``); a
   failure anywhere in 1-5 starts the round again on what is left.

Cost: two small allgathers, one alltoall of the re-pushed gradients (ASP), one alltoall
of the bytes that change owner, one shard per server to its backup, one agreement.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

from ...errors import PSTrainingError
from ...ft.events import RecoveryEvent
from ...ft.rounds import Shrunk, shrink_until_restored
from ...ps.layout import Layout
from ...ps.rebalance import deliver_repushes, rebalance, rebuild_replica, settle_bsp
from ...ps.recovery_plan import Plan, make_plan
from ...ps.shard_state import ShardState
from . import shard_checkpoints
from ..partition import assignment

if TYPE_CHECKING:
    from .ps_driver import ElasticPS


@dataclass
class PSRecoveryEvent(RecoveryEvent):
    """A recovery of PS mode: ``RecoveryEvent`` plus what happened to the shards.

    ``lost_servers``/``lost_workers``: ids by role; ``shards_adopted``: shard keys served from
    their replica; ``shards_restored``: keys rebuilt from checkpoint ``checkpoint_step``;
    ``updates_lost``: acknowledged pushes (pieces) the restored state lacks; ``restart_step``:
    BSP, the step every worker computes again from (from 1); ``promoted``: the id of a worker
    made server; ``repushed``: pieces re-pushed; ``rebalance_s``/``moved_bytes``: the move of
    shard data to the new placement; ``data_shards``: ``[worker id, [shards]]`` of the training
    shards each live worker reads after the recovery (a lost worker's shards reassigned).
    Membership changes (kinds ``server-growth`` and ``leave``) also carry ``requested_at``
    (``time.time()`` when rank 0 asked for them; with ``next_step_at``: their whole cost) and
    ``moved_bytes``; ``left``: the ids that left.
    """

    lost_servers: List[int] = field(default_factory=list)
    lost_workers: List[int] = field(default_factory=list)
    shards_adopted: List[int] = field(default_factory=list)
    shards_restored: List[int] = field(default_factory=list)
    checkpoint_step: Optional[int] = None
    updates_lost: int = 0
    restart_step: Optional[int] = None
    promoted: Optional[int] = None
    repushed: int = 0
    rebalance_s: float = 0.0
    moved_bytes: int = 0
    data_shards: List[List[Any]] = field(default_factory=list)

    def line(self) -> str:
        extras = [f"servers lost {self.lost_servers}" if self.lost_servers else "",
                  f"workers lost {self.lost_workers}" if self.lost_workers else "",
                  f"shards adopted from replicas {self.shards_adopted}" if self.shards_adopted else "",
                  f"shards restored from the checkpoint of step {self.checkpoint_step} "
                  f"{self.shards_restored}, {self.updates_lost} acknowledged updates lost"
                  if self.shards_restored else "",
                  f"worker id {self.promoted} promoted to server" if self.promoted is not None else "",
                  f"BSP restarts at step {self.restart_step}" if self.restart_step else "",
                  f"rebalance {self.rebalance_s * 1e3:.1f} ms ({self.moved_bytes} B moved)"
                  if self.moved_bytes else "",
                  f"training shards re-split over {len(self.data_shards)} workers" if self.data_shards else ""]
        return super().line() + "".join(f"; {extra}" for extra in extras if extra)


@dataclass
class Settled:
    """A round's result, installed at the commit."""

    plan: Plan
    layout: Layout
    state: Optional[ShardState] = None
    replica: Optional[ShardState] = None
    repushed: List[Tuple[int, int]] = field(default_factory=list)   # (table, key) of my pieces
    departed: List[Tuple[int, int, int]] = field(default_factory=list)  # leaving workers' (slot, made, lost)


def recover(run: "ElasticPS") -> Tuple[PSRecoveryEvent, Settled]:
    """Collective: recover ``run``; returns the event and what to install."""
    ctx, layout = run.ctx, run.committed.layout
    server_ids = {run.members.ids[rank] for rank in layout.shard_ranks.values()}
    event = PSRecoveryEvent("failure", 0, ctx.size, run.detected or time.time())

    def restore(shrunk: Shrunk) -> Settled:
        for identity in run.members.shrink(shrunk):
            event.lost.append(identity)
            (event.lost_servers if identity in server_ids else event.lost_workers).append(identity)
        event.rounds += shrunk.rounds
        event.shrink_s = time.time() - event.detected_at
        return _round(run, event)

    settled = shrink_until_restored(ctx, restore, "PS recovery")
    event.ranks_after = ctx.size
    event.restore_s = time.time() - event.detected_at - event.shrink_s
    return event, settled


def _round(run: "ElasticPS", event: PSRecoveryEvent) -> Settled:
    comm, committed = run.ctx.comm, run.committed
    plan = make_plan(comm.allgather(run.report()), committed, run.consistency.aggregates, time.time())
    if plan.fatal:
        raise PSTrainingError("parameter-server recovery failed: ", plan.fatal)
    event.detected_at = min(event.detected_at, plan.detected_at)
    event.step = plan.resume_step
    run.hooks.strike_recovery(plan.step)
    _take_over(run, plan)
    settled = Settled(plan, plan.layout(committed.layout))
    if plan.restart is not None:
        settle_bsp(run.holdings, plan.restart, run.optimizers, run.consistency)
    else:
        items = run.worker_side.repushes(committed.layout, plan.holders)
        event.repushed = deliver_repushes(comm, run.holdings, items, run.optimizers, run.consistency)
        settled.repushed = [(item.table, item.key) for _, item in items]
    started = time.time()
    settled.state, moved = rebalance(comm, run.holdings, plan, committed.layout, settled.layout, run.optimizers)
    event.moved_bytes = comm.allreduce(moved) if moved >= 0 else 0
    kept = run.holdings.replica if moved < 0 and plan.restart is not None else None
    settled.replica = rebuild_replica(comm, settled.layout, settled.state, kept)
    event.rebalance_s = time.time() - started if moved >= 0 else 0.0
    event.shards_adopted, event.shards_restored = plan.adopted, plan.restored
    event.checkpoint_step = plan.checkpoint if plan.restored else None
    event.restart_step = plan.restart + 1 if plan.restart is not None else None
    event.promoted = run.members.ids[plan.promoted] if plan.promoted is not None else None
    event.updates_lost = comm.allreduce(run.worker_side.count_lost(plan))
    event.data_shards = assignment([run.members.ids[rank] for rank in settled.layout.worker_ranks],
                                   run.dataset.shard_sizes("train"))
    if plan.leaving:
        settled.departed = list(filter(None, comm.allgather(_departing(run, plan, len(settled.repushed)))))
    return settled


def _departing(run: "ElasticPS", plan: Plan, repushed: int) -> Optional[Tuple[int, int, int]]:
    """A leaving worker's (slot, pieces acknowledged, updates lost), its re-pushed ones
    counted; None on other ranks."""
    loop = run.worker_side.loop
    if run.ctx.rank not in plan.leaving or loop is None:
        return None
    made = sum(1 for entry in loop.pushed if plan.restart is None or entry[0] < plan.restart)
    return loop.worker.slot, made + repushed, run.worker_side.lost_updates + run.worker_side.count_lost(plan)


def _take_over(run: "ElasticPS", plan: Plan) -> None:
    """Adopt replicas, promote a worker, rebuild lost shards from the checkpoint (in place:
    a later round sees them as held)."""
    rank, holdings, layout = run.ctx.rank, run.holdings, run.committed.layout
    replica = holdings.replica
    if replica is not None and replica.shard in plan.adopted and plan.holders[replica.shard] == rank:
        holdings.adopt_replica()
    if plan.promoted == rank:
        run.promote(plan.own_keys[rank])
    if not plan.restored:
        return
    mine = [key for key, holder in plan.holders.items() if holder == rank]
    rebuild = mine if plan.rollback else [key for key in plan.restored if key in mine]
    saved = None
    if rebuild:
        saved = shard_checkpoints.load_states(run.fault.checkpoint_dir, plan.checkpoint, run.specs, run.optimizers)
        first = min(layout.shard_ranks)
        for key in rebuild:
            counted = [key] + ([s.shard for s in saved if s.shard not in layout.shard_ranks]
                               if plan.rollback and key == first else [])
            holdings.states[key] = shard_checkpoints.restore(saved, key, run.specs, layout.placement, run.optimizers,
                                                      layout.slot_count, counted)
    holder = plan.holders[plan.restored[0]]
    pushes = shard_checkpoints.last_pushes(saved) if rank == holder else None
    run.worker_side.note_restore(plan, run.ctx.comm.bcast(pushes, root=holder))

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
5. commits with ``Agree``: only then is anything installed (``settle`` gives the next epoch,
   the driver installs it); a failure anywhere in 1-5 starts the round again on what is left,
   from what the failed round had taken over.

Cost: two small allgathers, one alltoall of the re-pushed gradients (ASP), one alltoall
of the bytes that change owner, one shard per server to its backup, one agreement.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

from ...errors import PSTrainingError
from ...ft.events import RecoveryEvent
from ...ft.rounds import Shrunk, shrink_until_restored
from ...ps.holdings import ShardHoldings
from ...ps.layout import Layout
from ...ps.rebalance import deliver_repushes, rebalance, rebuild_replica, settle_bsp
from ...ps.recovery_plan import Plan, Report, make_plan
from ...ps.shard_state import ShardState
from ...runtime.context import Context
from . import shard_checkpoints
from ..partition import assignment
from .epoch import Departed, Epoch
from .progress import PSKills
from .ps_setup import PSSetup
from .worker_side import PushRecord

if TYPE_CHECKING:
    from .resize_requests import Resize


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
    """A round's result, installed at the commit: ``epoch``: the survivors' epoch with the
    shards taken over (not yet settled); ``restored``: the restored shards' record of pushes."""

    plan: Plan
    layout: Layout
    epoch: Epoch
    state: Optional[ShardState] = None
    replica: Optional[ShardState] = None
    repushed: List[Tuple[int, int]] = field(default_factory=list)   # (table, key) of my pieces
    departed: List[Departed] = field(default_factory=list)           # leaving workers' (slot, made, lost)
    restored: PushRecord = field(default_factory=dict)
    dense_from: Optional[str] = None  # BSP rolled back to a checkpoint: its folder (hybrid's dense replica too)


def recover(ctx: Context, setup: PSSetup, epoch: Epoch, asked: "Resize", kills: PSKills,
            detected: float) -> Tuple[PSRecoveryEvent, Settled]:
    """Collective: recover from a failure (or a revoke asking for a change) seen first at
    ``detected``; ``asked``: the changes this rank asked for (rank 0). Returns the event and
    what to install (``settle``)."""
    report = partial(_report, ctx, setup, asked, detected)
    server_ids = set(epoch.server_ids)
    event = PSRecoveryEvent("failure", 0, ctx.size, detected)
    working = [epoch, {}]  # what the rounds so far took over (a later round sees it as held)

    def restore(shrunk: Shrunk) -> Settled:
        current = working[0]
        members = replace(current.members, ids=list(current.members.ids))
        for identity in members.shrink(shrunk):
            event.lost.append(identity)
            (event.lost_servers if identity in server_ids else event.lost_workers).append(identity)
        working[0] = current.but(comm=ctx.comm, members=members)
        event.rounds += shrunk.rounds
        event.shrink_s = time.time() - event.detected_at
        return _round(ctx, setup, working, report, kills, event)

    settled = shrink_until_restored(ctx, restore, "PS recovery")
    event.ranks_after = ctx.size
    event.restore_s = time.time() - event.detected_at - event.shrink_s
    return event, settled


def _report(ctx: Context, setup: PSSetup, asked: "Resize", detected: float, epoch: Epoch) -> Report:
    """What this rank holds, for the recovery plan (rank 0 also names the latest complete checkpoint)."""
    slot, clock, outgoing = epoch.worker.slot_and_clock()
    folder = setup.fault.checkpoint_dir
    return Report(epoch.members.me, epoch.holdings.own_key, epoch.holdings.applied_steps(),
                  epoch.holdings.replica_applied(), slot, clock, outgoing, detected, asked.growth,
                  shard_checkpoints.latest_complete(folder) if ctx.rank == 0 else None,
                  server_growth=asked.server_growth, leaving=asked.leave)


def _round(ctx: Context, setup: PSSetup, working: List[Any], report: Callable[[Epoch], Report], kills: PSKills,
           event: PSRecoveryEvent) -> Settled:
    comm, tables, start = ctx.comm, setup.tables, working[0]
    plan = make_plan(comm.allgather(report(start)), start.committed, tables.consistency.aggregates, time.time())
    if plan.fatal:
        raise PSTrainingError("parameter-server recovery failed: ", plan.fatal)
    event.detected_at = min(event.detected_at, plan.detected_at)
    event.step = plan.resume_step
    kills.recovery(plan.step, start.members.me, start.members.ids)
    working[0] = current = _take_over(ctx, setup, start, plan, working[1])
    holdings, committed = current.holdings, current.layout
    settled = Settled(plan, plan.layout(committed), current, restored=working[1],
                      dense_from=setup.fault.checkpoint_dir if plan.rollback else None)
    if plan.restart is not None:
        settle_bsp(holdings, plan.restart, tables.optimizers, tables.consistency)
    else:
        items = current.worker.repushes(committed, plan.holders)
        event.repushed = deliver_repushes(comm, holdings, items, tables.optimizers, tables.consistency)
        settled.repushed = [(item.table, item.key) for _, item in items]
    started = time.time()
    settled.state, moved = rebalance(comm, holdings, plan, committed, settled.layout, tables.optimizers)
    event.moved_bytes = comm.allreduce(moved) if moved >= 0 else 0
    kept = holdings.replica if moved < 0 and plan.restart is not None else None
    settled.replica = rebuild_replica(comm, settled.layout, settled.state, kept)
    event.rebalance_s = time.time() - started if moved >= 0 else 0.0
    event.shards_adopted, event.shards_restored = plan.adopted, plan.restored
    event.checkpoint_step = plan.checkpoint if plan.restored else None
    event.restart_step = plan.restart + 1 if plan.restart is not None else None
    event.promoted = current.members.ids[plan.promoted] if plan.promoted is not None else None
    event.updates_lost = comm.allreduce(current.worker.count_lost(plan, settled.restored))
    event.data_shards = assignment(current.worker_ids(settled.layout), setup.train_shards)
    if plan.leaving:
        settled.departed = list(filter(None, comm.allgather(_departing(ctx, current, settled))))
    return settled


def _departing(ctx: Context, epoch: Epoch, settled: Settled) -> Optional[Departed]:
    """A leaving worker's (slot, pieces acknowledged, updates lost), its re-pushed ones
    counted; None on other ranks."""
    plan, side = settled.plan, epoch.worker
    loop = side.loop
    if ctx.rank not in plan.leaving or loop is None:
        return None
    made = sum(1 for entry in loop.pushed if plan.restart is None or entry[0] < plan.restart)
    return (loop.worker.slot, made + len(settled.repushed),
            side.lost_updates + side.count_lost(plan, settled.restored))


def _take_over(ctx: Context, setup: PSSetup, epoch: Epoch, plan: Plan, restored: PushRecord) -> Epoch:
    """Adopt replicas, promote a worker, rebuild lost shards from the checkpoint; the restored
    shards' record of pushes goes into ``restored``. Returns the epoch holding them."""
    rank, holdings, worker, layout = ctx.rank, epoch.holdings, epoch.worker, epoch.layout
    replica = holdings.replica
    if replica is not None and replica.shard in plan.adopted and plan.holders[replica.shard] == rank:
        holdings = holdings.with_replica_adopted()
    if plan.promoted == rank:
        worker = worker.promoted()
        holdings = replace(holdings, own_key=plan.own_keys[rank])
    if not plan.restored:
        return epoch.but(holdings=holdings, worker=worker)
    mine = [key for key, holder in plan.holders.items() if holder == rank]
    rebuild = mine if plan.rollback else [key for key in plan.restored if key in mine]
    saved = None
    if rebuild:
        tables = setup.tables
        saved = shard_checkpoints.load_states(setup.fault.checkpoint_dir, plan.checkpoint, tables.specs,
                                              tables.optimizers)
        first = min(layout.shard_ranks)
        rebuilt = {}
        for key in rebuild:
            counted = [key] + ([s.shard for s in saved if s.shard not in layout.shard_ranks]
                               if plan.rollback and key == first else [])
            rebuilt[key] = shard_checkpoints.restore(saved, key, tables.specs, layout.placement, tables.optimizers,
                                                     layout.slot_count, counted)
        holdings = holdings.with_states(rebuilt)
    holder = plan.holders[plan.restored[0]]
    pushes = shard_checkpoints.last_pushes(saved) if rank == holder else None
    record = ctx.comm.bcast(pushes, root=holder)
    restored.update({key: record.get(key, {}) for key in plan.restored})
    return epoch.but(holdings=holdings, worker=worker)


def settle(ctx: Context, settled: Settled, layout: Layout) -> Epoch:
    """The epoch a committed round leaves (``layout``: the round's, in the ranks of
    ``ctx.comm``, after any leave): loops settled, this server's shard and replica held, the
    plan's clocks set, the layout and next key committed."""
    plan, epoch = settled.plan, settled.epoch
    holdings = ShardHoldings()
    if layout.is_server(ctx.rank):
        holdings = ShardHoldings.serving(epoch.holdings.own_key, settled.state, settled.replica)
        for slot, clock in plan.clocks.items():
            settled.state.clocks[slot] = clock
    return epoch.but(comm=ctx.comm, layout=layout, next_key=plan.next_key, holdings=holdings,
                     worker=epoch.worker.settled(ctx, plan, layout, settled.repushed, settled.restored,
                                                 settled.dense_from),
                     resume_mark=min(plan.clocks.values()))

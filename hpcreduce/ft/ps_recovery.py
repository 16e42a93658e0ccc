"""One parameter-server recovery, collective over the survivors (``hpcreduce train --mode ps --ft``).

After a rank died (or the communicator was revoked to grow the job), every survivor:

1. shrinks the communicator (``recovery.shrink_and_rebuild``; survivors keep their order,
   so servers stay first) and gathers everyone's ``Report``; ``ps_plan.make_plan`` gives
   the same plan everywhere;
2. takes over shards: a dead server's shard from the replica its backup holds, a shard
   lost with its replica from the latest checkpoint (under BSP every shard then goes back
   to that checkpoint), and with no server left the first worker is promoted to server;
3. BSP: every shard applies the buffered steps below the restart step (complete, since
   some shard applied them) and drops the later ones, which the workers compute again
   over the new split of the batch. ASP/SSP: every worker re-pushes its unacknowledged
   push to the shards of the placement it was sent under; shards drop what they already
   have (exactly once by (worker, step)). After this the system is quiescent;
4. rebalances: the placement is recomputed over the live shard keys and fragments move
   to their new owners (``ps_fragments``); replicas are rebuilt (each server sends its
   shard to its backup);
5. commits with ``Agree``: only then is anything installed; a failure anywhere in 1-5
   makes the rank that sees it revoke and agree "failed", so every rank leaves the round
   through the same agreement and the round starts again (a rank never sits in ``Agree``
   while another shrinks).

Cost: two small allgathers, one alltoall of the re-pushed gradients (ASP), one alltoall
of the bytes that change owner, one shard per server to its backup, one agreement.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..ps.engine import ShardEngine
from ..ps.errors import PSTrainingError
from ..ps.layout import Layout
from ..ps.protocol import Status
from ..ps.state import ShardState
from ..runtime.failures import abandon, is_process_failure
from . import ps_checkpoint
from .events import RecoveryEvent
from .ps_fragments import assemble, cut, merge_counters, new_state
from .ps_plan import Plan, make_plan
from .recovery import agree_all, shrink_and_rebuild
from .watchdog import watchdog


@dataclass
class PSRecoveryEvent(RecoveryEvent):
    """A recovery of PS mode: ``RecoveryEvent`` plus what happened to the shards.

    ``lost_servers``/``lost_workers``: ids by role; ``shards_adopted``: shard keys served from
    their replica; ``shards_restored``: keys rebuilt from checkpoint ``checkpoint_step``;
    ``updates_lost``: acknowledged pushes (pieces) the restored state lacks; ``restart_step``:
    BSP, the step every worker computes again from (from 1); ``promoted``: the id of a worker
    made server; ``repushed``: pieces re-pushed; ``rebalance_s``/``moved_bytes``: the move of
    shard data to the new placement.
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
                  if self.moved_bytes else ""]
        return super().line() + "".join(f"; {extra}" for extra in extras if extra)


@dataclass
class Settled:
    """A round's result, installed at the commit."""

    plan: Plan
    layout: Layout
    state: Optional[ShardState] = None
    replica: Optional[ShardState] = None
    repushed: List[Tuple[int, int]] = field(default_factory=list)   # (table, key) of my pieces


def recover(run: Any) -> Tuple[PSRecoveryEvent, Settled]:
    """Collective: recover ``run`` (an ``ElasticPS``); returns the event and what was installed."""
    ctx, committed = run.ctx, run.committed
    server_ids = {run.members.ids[rank] for rank in committed.layout.shard_ranks.values()}
    event = PSRecoveryEvent("failure", 0, ctx.size, run.detected or time.time())
    while True:
        with watchdog.guard("PS recovery (revoke, shrink, agree)"):
            shrunk = shrink_and_rebuild(ctx.comm)
        run.ctx.replace_comm(shrunk.comm)
        for identity in run.members.shrink(shrunk):
            event.lost.append(identity)
            (event.lost_servers if identity in server_ids else event.lost_workers).append(identity)
        event.rounds += shrunk.rounds
        event.shrink_s = time.time() - event.detected_at
        done = True
        try:
            with watchdog.guard("PS recovery (plan, restore, rebalance, replicas)"):
                settled = _round(run, event)
        except MPI.Exception as error:
            if not is_process_failure(error, ctx.comm):
                raise
            abandon(ctx.comm, [])  # revoke: every rank leaves the round for the agreement
            done = False
        with watchdog.guard("PS recovery (commit agreement)"):
            if agree_all(ctx.comm, done):
                break
    event.ranks_after = ctx.size
    event.restore_s = time.time() - event.detected_at - event.shrink_s
    return event, settled


def _round(run: Any, event: PSRecoveryEvent) -> Settled:
    comm, committed = run.ctx.comm, run.committed
    reports = comm.allgather(run.report())
    plan = make_plan(reports, committed, run.consistency.aggregates, time.time())
    if plan.fatal:
        raise PSTrainingError(f"parameter-server recovery failed: {plan.fatal}")
    event.detected_at = min(event.detected_at, plan.detected_at)
    event.step = plan.resume_step
    run.strike_recovery(plan.step)
    _take_over(run, plan)
    layout = plan.layout(committed.layout)
    settled = Settled(plan, layout)
    if plan.restart is not None:
        for state in _all_states(run):
            ShardEngine(state, run.optimizers, run.consistency, measured=False).settle(plan.restart)
    else:
        settled.repushed = _repush(run, plan, event)
    started = time.time()
    moved = _rebalance(run, plan, layout, settled)
    event.moved_bytes = comm.allreduce(moved) if moved >= 0 else 0
    _rebuild_replicas(run, plan, layout, settled, moved >= 0)
    event.rebalance_s = time.time() - started if moved >= 0 else 0.0
    event.shards_adopted, event.shards_restored = plan.adopted, plan.restored
    event.checkpoint_step = plan.checkpoint if plan.restored else None
    event.restart_step = plan.restart + 1 if plan.restart is not None else None
    event.promoted = run.members.ids[plan.promoted] if plan.promoted is not None else None
    event.updates_lost = comm.allreduce(run.count_lost(plan))
    return settled


def _all_states(run: Any) -> List[ShardState]:
    return list(run.states.values()) + ([run.replica] if run.replica is not None else [])


def _take_over(run: Any, plan: Plan) -> None:
    """Adopt replicas, promote a worker, rebuild lost shards from the checkpoint (in place:
    a later round sees them as held)."""
    rank = run.ctx.rank
    if run.replica is not None and run.replica.shard in plan.adopted and plan.holders[run.replica.shard] == rank:
        run.states[run.replica.shard], run.replica = run.replica, None
    if plan.promoted == rank:
        run.promote(plan.own_keys[rank])
    if not plan.restored:
        return
    mine = [key for key, holder in plan.holders.items() if holder == rank]
    rebuild = mine if plan.rollback else [key for key in plan.restored if key in mine]
    saved = None
    if rebuild:
        saved = ps_checkpoint.load_states(run.fault.checkpoint_dir, plan.checkpoint, run.specs, run.optimizers)
        placement = run.committed.layout.placement
        first = min(run.committed.layout.shard_ranks)
        for key in rebuild:
            counted = [key] + ([s.shard for s in saved if s.shard not in run.committed.layout.shard_ranks]
                               if plan.rollback and key == first else [])
            run.states[key] = ps_checkpoint.restore(saved, key, run.specs, placement, run.optimizers,
                                                    run.committed.layout.slot_count, counted)
    holder = plan.holders[plan.restored[0]]
    pushes = ps_checkpoint.last_pushes(saved) if rank == holder else None
    run.note_restore(plan, run.ctx.comm.bcast(pushes, root=holder))


def _repush(run: Any, plan: Plan, event: PSRecoveryEvent) -> List[Tuple[int, int]]:
    """ASP/SSP: every unacknowledged push again, to the shards of the placement it was sent
    under; returns (table, key) of this rank's pieces once every shard took them."""
    comm = run.ctx.comm
    items = run.outgoing_pieces(plan.holders) if run.loop is not None and run.loop.outgoing else []
    sends: List[List[tuple]] = [[] for _ in range(comm.Get_size())]
    for destination, item in items:
        sends[destination].append(item)
    answers = [[_apply_repush(run, item) for item in received] for received in comm.alltoall(sends)]
    statuses = [status for received in comm.alltoall(answers) for status in received]
    event.repushed = comm.allreduce(len(items))
    refused = [status for status in statuses if status not in (Status.OK, Status.DUPLICATE)]
    if refused:
        raise PSTrainingError(f"a re-pushed gradient was refused after recovery: {Status(refused[0]).name}")
    return [(item[1], item[0]) for _, item in items]


def _apply_repush(run: Any, item: tuple) -> int:
    key, table_id, slot, step, start, ids, values = item
    state = run.states[key]
    table = state.tables[table_id]
    if ids is None:
        if start != table.start or values.size != table.values.size:
            return int(Status.BAD_SIZE)
        gradient = values
    else:
        local = table.position[ids]
        if (local < 0).any():
            return int(Status.NOT_OWNER)
        gradient = (local, values)
    return int(ShardEngine(state, run.optimizers, run.consistency).accept(slot, step, table_id, gradient))


def _rebalance(run: Any, plan: Plan, layout: Layout, settled: Settled) -> int:
    """Move shard data to the new placement (into ``settled.state``); the bytes this rank
    sent to others, or -1 when nothing changes owner (then nothing moves at all)."""
    comm, rank = run.ctx.comm, run.ctx.rank
    unchanged = (not plan.restored and set(plan.holders) == set(layout.shard_ranks)
                 and all(plan.holders[key] == rank_of for key, rank_of in layout.shard_ranks.items()))
    if unchanged:
        settled.state = run.states.get(run.own_key) if run.own_key is not None else None
        return -1
    sends: List[list] = [[] for _ in range(comm.Get_size())]
    kept, moved = [], 0
    rows_stay = set(layout.shard_ranks) <= set(run.committed.layout.shard_ranks)
    for state in run.states.values():
        for key, fragments in cut(state, layout.placement, rows_stay=rows_stay).items():
            destination = layout.shard_ranks[key]
            if destination == rank:
                kept += fragments
            else:
                sends[destination] += fragments
                moved += sum(f.nbytes for f in fragments)
    received = kept + [f for part in comm.alltoall(sends) for f in part]
    if layout.is_server(rank):
        key = layout.shard_of(rank)
        slots = layout.slot_count
        applied = max([s.applied_steps for s in run.states.values()], default=0)
        state = new_state(key, assemble(key, run.specs, layout.placement, received, run.optimizers, slots),
                          slots, plan.restart if plan.restart is not None else applied)
        merge_counters(state, run.states.values())
        settled.state = state
    return moved


def _rebuild_replicas(run: Any, plan: Plan, layout: Layout, settled: Settled, moved: bool) -> None:
    """Each server sends its shard to its backup and receives its predecessor's (two or more
    servers); kept as they are when nothing moved and BSP settled them like their primaries."""
    keys = sorted(layout.shard_ranks)
    rank = run.ctx.rank
    if len(keys) < 2 or not layout.is_server(rank):
        return
    if not moved and plan.restart is not None and run.replica is not None:
        settled.replica = run.replica
        return
    position = keys.index(layout.shard_of(rank))
    backup = layout.shard_ranks[keys[(position + 1) % len(keys)]]
    primary = layout.shard_ranks[keys[position - 1]]
    settled.replica = run.ctx.comm.sendrecv(settled.state, dest=backup, source=primary)


def lost_pieces(pushed: List[Tuple[int, int, int]], slot: int, restored: Dict[int, Dict[int, np.ndarray]]
                ) -> List[Tuple[int, int, int]]:
    """The logged pieces (step, table, key) a checkpoint restore lost: pushed to a restored
    shard key after the checkpoint's record of this slot's last push to that table."""
    lost = []
    for step, table, key in pushed:
        record = restored.get(key, {}).get(table)
        if record is not None and step > (record[slot] if slot < len(record) else -1):
            lost.append((step, table, key))
    return lost

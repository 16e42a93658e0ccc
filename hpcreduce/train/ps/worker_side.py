"""The worker side of one rank in a fault-tolerant PS run, through recoveries.

A worker rank runs a ``WorkerLoop`` (``loop``); a worker promoted to server when no
server survived keeps the loop it ran (``former``), for its log and its count of
acknowledged pushes. After a recovery the plan decides what happens to each loop:
BSP restarts it at the plan's step; otherwise its unacknowledged push counts as
delivered once re-pushed, and its next read fetches every dense table again. When a
shard was rebuilt from a checkpoint, the acknowledged pushes that checkpoint lacks are
the *lost updates*: counted, and dropped from the loop's log of pushes.

``--replace`` under ASP/SSP (``Takeover``): the replacement of a dead worker takes its
*seat*: its slot, its index among the workers (so every worker's share of a batch is what it
was before the failure, and the newcomer reads the dead worker's data shards) and its
unfinished work: it starts at the first step of the push window holding the last push any
server got from that slot (``resume_step``), recomputes it from the same examples and pushes
it under the same slot, so a piece some server already applied answers DUPLICATE and every
piece counts once; no global batch loses the dead worker's share. Its count of pushes made
starts from the pieces the servers had applied for the slot at the takeover (``applied``);
pieces answered DUPLICATE are not counted again. BSP needs none of this (every worker
restarts at the restart step over the new split): newcomers get new slots there, as do
the replacements of lost servers (extra workers: the batches are re-split from then on).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ...ps.holdings import ShardHoldings
from ...ps.layout import Layout
from ...ps.rebalance import Repush, repush_items
from ...ps.recovery_plan import Plan
from ...ps.worker import Worker
from ...runtime.context import Context
from ...ft.watchdog import watchdog
from .dense_checkpoints import load_dense
from .loop import CLOCK, PUSH, WorkerLoop

PushRecord = Dict[int, Dict[int, np.ndarray]]  # shard key -> table -> last step pushed, per slot


@dataclass(frozen=True)
class WorkerSide:
    """``loop``: this rank's worker loop (None on a server); ``former``: the loop it ran
    before it was promoted; ``lost_updates``: acknowledged pieces lost to checkpoint restores.
    A value: every change gives a new one (the loops themselves are the worker's own)."""

    loop: Optional[WorkerLoop] = None
    former: Optional[WorkerLoop] = None
    lost_updates: int = 0

    @property
    def loop_or_former(self) -> Optional[WorkerLoop]:
        return self.loop or self.former

    def promoted(self) -> "WorkerSide":
        """This worker becomes a server: its loop stops (it is kept as ``former``)."""
        return replace(self, loop=None, former=self.loop)

    def slot_and_clock(self) -> Tuple[Optional[int], int, bool]:
        """(slot, clock, whether a push is unacknowledged) of the running loop, for the report."""
        loop = self.loop
        if loop is None:
            return None, 0, False
        return loop.worker.slot, loop.worker.clock_value, loop.outgoing is not None

    def repushes(self, layout: Layout, holders: Mapping[int, int]) -> List[Tuple[int, Repush]]:
        """The pieces of this worker's unacknowledged push, cut by the placement it was sent under."""
        loop = self.loop
        if loop is None or loop.outgoing is None:
            return []
        out = loop.outgoing
        return repush_items(layout, holders, loop.worker.slot, out.step, out.dense, out.rows)

    def count_lost(self, plan: Plan, restored: PushRecord) -> int:
        """Acknowledged pieces of this rank's pushes that the restored state lacks (``restored``:
        the restored shards' record of pushes)."""
        loop = self.loop_or_former
        if loop is None:
            return 0
        if plan.rollback:
            return sum(1 for entry in loop.pushed if entry[0] >= plan.restart)
        return len(lost_pieces(loop.pushed, loop.worker.slot, restored))

    def settled(self, ctx: Context, plan: Plan, layout: Layout, repushed: List[Tuple[int, int]],
                restored: PushRecord, dense_from: Optional[str] = None) -> "WorkerSide":
        """Every loop after a committed recovery (``layout``: the new one; ``repushed``: the
        (table, shard key) of this worker's re-pushed pieces; ``restored``: as ``count_lost``;
        ``dense_from``: BSP went back to the checkpoint of the restart step in that folder, and
        a hybrid worker's dense replica goes back with the tables)."""
        lost = self.lost_updates + self.count_lost(plan, restored)
        for loop in filter(None, (self.loop, self.former)):
            self._settle(loop, ctx, plan, layout, repushed, restored)
            if dense_from and loop.replica is not None and plan.restart is not None:
                load_dense(dense_from, plan.restart, loop.replica)
        return replace(self, lost_updates=lost)

    def _settle(self, loop: WorkerLoop, ctx: Context, plan: Plan, layout: Layout,
                repushed: List[Tuple[int, int]], restored: PushRecord) -> None:
        if not plan.rollback and restored:
            lost = set(lost_pieces(loop.pushed, loop.worker.slot, restored))
            loop.pushed = [entry for entry in loop.pushed if entry not in lost]
        if loop is self.former:
            if plan.restart is not None:
                loop.restart(plan.restart)
            return
        loop.worker = Worker(ctx.comm, layout, ctx.traffic, guard=watchdog.guard,
                             clock=plan.clocks[loop.worker.slot])
        if plan.restart is not None:
            loop.restart(plan.restart)  # BSP: everything from the restart step on is computed again
            return
        if loop.outgoing is not None:
            loop.acknowledged(repushed)
            if loop.stage == PUSH:
                loop.stage = CLOCK
        loop.refetch = True

    def rejoined(self, ctx: Context, layout: Layout) -> "WorkerSide":
        """After growth: the running loop's worker over the new communicator and layout."""
        if self.loop is not None:
            self.loop.worker = Worker(ctx.comm, layout, ctx.traffic, guard=watchdog.guard,
                                      clock=self.loop.worker.clock_value)
        return self


def lost_pieces(pushed: List[Tuple[int, int, int]], slot: int, restored: PushRecord) -> List[Tuple[int, int, int]]:
    """The logged pieces (step, table, key) a checkpoint restore lost: pushed to a restored
    shard key after the checkpoint's record of this slot's last push to that table."""
    lost = []
    for step, table, key in pushed:
        record = restored.get(key, {}).get(table)
        if record is not None and step > (record[slot] if slot < len(record) else -1):
            lost.append((step, table, key))
    return lost


@dataclass(frozen=True)
class Takeover:
    """A dead worker's seat for its replacement: ``index`` among the workers, ``slot``, the
    ``step`` (from 0) the newcomer starts at, and the pieces the servers had ``applied`` for the slot."""

    index: int
    slot: int
    step: int = 0
    applied: int = 0


def dead_seats(before: Layout, plan: Plan) -> List[Takeover]:
    """The seats (index, slot) of ``before``'s workers that died (not promoted), by index;
    none under BSP (``plan.restart``), when a worker was promoted or ranks leave in the same
    round (the seats moved: newcomers get new slots)."""
    if plan.restart is not None or plan.promoted is not None or plan.leaving:
        return []
    live = {slot for _, slot in plan.live_workers}
    return [Takeover(index, slot) for index, slot in enumerate(before.worker_slots) if slot not in live]


def resume_step(last_push: int, push_every: int) -> int:
    """The first step of the push window that holds step ``last_push`` (0 when it is -1)."""
    return max(0, last_push // push_every * push_every)


def takeover_points(comm: MPI.Intracomm, holdings: ShardHoldings, seats: Sequence[Takeover],
                    push_every: int) -> List[Takeover]:
    """``seats`` with their start step and applied pieces, from every server's own shard
    (collective over the job before the newcomers are spawned; the same on every rank)."""
    state = holdings.own
    last = np.full(len(seats), -1, np.int64)
    applied = np.zeros(len(seats), np.int64)
    for i, seat in enumerate(seats):
        if state is not None:
            last[i] = max([table.last_push[seat.slot] for table in state.tables.values()], default=-1)
            applied[i] = state.applied[seat.slot]
    comm.Allreduce(MPI.IN_PLACE, last, op=MPI.MAX)
    comm.Allreduce(MPI.IN_PLACE, applied, op=MPI.SUM)
    return [Takeover(seat.index, seat.slot, resume_step(int(last[i]), push_every), int(applied[i]))
            for i, seat in enumerate(seats)]


def seat_newcomers(old: Layout, newcomers: Sequence[int], seats: Sequence[Takeover]) -> Tuple[Layout, List[int]]:
    """The layout with ``newcomers`` (ranks) in: the first ones in the dead workers' ``seats``
    (taken in index order, so every other worker keeps its index), the rest appended with new
    slots; returns it and those new slots."""
    ranks, slots = list(old.worker_ranks), list(old.worker_slots)
    taken = list(zip(sorted(seats, key=lambda seat: seat.index), newcomers))
    for seat, rank in taken:
        ranks.insert(seat.index, rank)
        slots.insert(seat.index, seat.slot)
    fresh = list(range(old.slot_count, old.slot_count + len(newcomers) - len(taken)))
    layout = old.rebuilt(old.shard_ranks, ranks + list(newcomers[len(taken):]), slots + fresh,
                         old.slot_count + len(fresh))
    return layout, fresh


TAKEN_OVER = (-1, -1, -1)  # a logged piece the dead worker's servers had applied before the takeover


def take_seat(loop: WorkerLoop, seat: Takeover) -> None:
    """A replacement's loop in ``seat``: the pieces applied for the slot count as made, and
    its first push does not count again what the servers already have (DUPLICATE)."""
    loop.pushed = [TAKEN_OVER] * seat.applied
    loop.taking_over = True

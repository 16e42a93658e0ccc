"""Growth of a fault-tolerant PS run: newcomer workers (appended after every rank) and
newcomer shard servers (``--grow-servers``; placed after the servers, so servers stay first).

Rank 0 asks for growth (``resize_requests``) by revoking the communicator; the recovery that
follows carries the request in its plan, and once it is committed every rank calls
``grow_workers``: spawn and merge (``runtime.spawn``), a new layout with the newcomers' slots
(never used before) and one broadcast of a ``Welcome`` to the newcomers, who ``join``: they
take the layout and become workers at the slowest clock (BSP: the restart step), pulling
every dense table at their first step (even off the ``--fetch-every`` schedule). Shards
make room for the new slots; the training shards are re-split over the grown set of workers
(``partition.owned_shards``: the newcomers read their share), recorded in the event. Cost:
one spawn and merge, one broadcast of a few hundred bytes.

Server growth (``grow_servers``), at the same quiescent point after the recovery round:
spawn and merge, one broadcast, an ``MPI_Comm_split`` that puts the newcomers right after
the servers (new ranks; stable ids follow), new shard keys, the placement recomputed over
all keys and the fragments that change owner moved in one alltoall (``ps.rebalance.move_shards``:
rendezvous hashing moves only the rows the new keys take; dense ranges are re-cut), the
replicas rebuilt, the workers re-routed. Counters stay with the servers that counted them.
Cost: a spawn, a split, the bytes that change owner, one shard per server to its backup.
Each function takes the epoch before and returns the one after (and the event); the
driver installs it.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ...ft.membership import Membership
from ...ft.watchdog import watchdog
from ...ps.holdings import ShardHoldings
from ...ps.layout import Layout
from ...ps.rebalance import move_shards, rebuild_replica
from ...ps.worker import Worker
from ...runtime.context import Context
from ...runtime.failures import fatal_failures
from ...runtime.launch import this_program
from ...runtime.nodes import rank_nodes
from ...runtime.spawn import spawn_and_merge
from ..partition import assignment
from .epoch import Epoch, Welcome
from .loop import WorkerLoop
from .ps_setup import PSSetup
from .ps_recovery import PSRecoveryEvent
from .worker_side import Takeover, WorkerSide, seat_newcomers, take_seat, takeover_points

NewLoop = Callable[[Worker], WorkerLoop]


def grow_workers(ctx: Context, setup: PSSetup, epoch: Epoch, count: int, kind: str, clock: int, at_step: int,
                 done_before: int, seats: Sequence[Takeover] = ()) -> Tuple[Epoch, PSRecoveryEvent]:
    """Spawn ``count`` workers and merge them in after every rank (collective); they start at
    ``clock`` (``at_step``: the step of the event, from 1); growth is then done for steps up to
    ``done_before``; ``seats``: dead workers' seats the first newcomers take (``--replace``
    under ASP/SSP, see ``worker_side``)."""
    with fatal_failures(f"the {kind} at step {at_step} (spawning {count} worker(s))", lambda: ctx.comm):
        event = PSRecoveryEvent(kind, at_step, ctx.size, time.time())
        seats = takeover_points(ctx.comm, epoch.holdings, seats, setup.ps.push_every) if seats else []
        with watchdog.guard(f"{kind}: spawn and merge"):
            merged = spawn_and_merge(ctx.comm, count, this_program())
        ctx.replace_comm(merged)
        members = replace(epoch.members, ids=list(epoch.members.ids))
        event.joined = members.grow(count)
        newcomers = list(range(ctx.size - count, ctx.size))
        layout, slots = seat_newcomers(epoch.layout, newcomers, seats)
        grown = epoch.but(comm=merged, members=members, resized_before=max(epoch.resized_before, done_before))
        started = time.time()
        with watchdog.guard(f"{kind}: the layout to the newcomers"):
            ctx.comm.bcast(Welcome.of(grown.but(layout=layout), clock, seats=dict(zip(newcomers, seats))), root=0)
        for state in epoch.holdings.everything():
            state.grow(layout.slot_count)
            state.clocks[slots] = clock
            for seat in seats:
                state.clocks[seat.slot] = seat.step
        grown = grown.but(layout=layout, worker=epoch.worker.rejoined(ctx, layout))
        event.data_shards = assignment(grown.worker_ids(), setup.train_shards)
        event.ranks_after, event.restore_s = ctx.size, time.time() - started
        return _with_nodes(ctx, grown), event


def grow_servers(ctx: Context, setup: PSSetup, epoch: Epoch, count: int, done_before: int,
                 requested_at: float) -> Tuple[Epoch, PSRecoveryEvent]:
    """Spawn ``count`` shard servers and rebalance the shards over them (collective, at the
    quiescent point after a committed round); growth is then done for steps up to ``done_before``."""
    with fatal_failures(f"server growth (spawning {count} server(s), the split, the rebalance)", lambda: ctx.comm):
        old = epoch.layout
        event = PSRecoveryEvent("server-growth", epoch.resume_mark + 1, ctx.size, requested_at)
        event.requested_at = requested_at
        with watchdog.guard("server growth: spawn and merge"):
            merged = spawn_and_merge(ctx.comm, count, this_program())
        size = ctx.size
        ctx.replace_comm(merged)
        members = replace(epoch.members, ids=list(epoch.members.ids))
        event.joined = members.grow(count)
        servers = sorted(old.shard_ranks.values())
        order = servers + list(range(size, size + count)) + [r for r in range(size) if r not in servers]
        keys = list(range(epoch.next_key, epoch.next_key + count))
        grown = epoch.but(comm=merged, members=members, resized_before=max(epoch.resized_before, done_before))
        layout = Layout.with_servers(setup.tables.specs, old.wire(), order, keys)
        started = time.time()
        own = epoch.holdings.own  # rank 0 is a server: its clocks and applied steps are everybody's
        with watchdog.guard("server growth: the layout to the newcomers"):
            welcome = ctx.comm.bcast(Welcome.of(grown, epoch.resume_mark, order=order, server_keys=keys,
                                                clocks=own.clocks, applied=own.applied_steps)
                                     if ctx.rank == 0 else None, root=0)
        comm, members = _in_order(ctx, members, order)
        grown = grown.but(comm=comm, members=members, layout=layout, next_key=keys[-1] + 1)
        moving = time.time()
        grown, event.moved_bytes = _rebalanced(ctx, setup, grown, welcome, epoch.holdings.own_key)
        event.rebalance_s = time.time() - moving
        grown = grown.but(worker=grown.worker.rejoined(ctx, grown.layout))
        event.ranks_after, event.restore_s = ctx.size, time.time() - started
        return _with_nodes(ctx, grown), event


def join(ctx: Context, setup: PSSetup, welcome: Welcome, new_loop: NewLoop) -> Epoch:
    """A spawned newcomer, with the job's ``welcome``: take the layout and become a worker, or
    (``server_keys`` given) a shard server."""
    with fatal_failures("a newcomer's start (layout, split, rebalance)", lambda: ctx.comm):
        members = Membership.from_control(welcome.members, ctx.rank)
        if welcome.server_keys:  # the split first: the job's ranks wait in it
            key = welcome.server_keys[list(welcome.order).index(ctx.rank) - len(welcome.layout["shard_ranks"])]
            comm, members = _in_order(ctx, members, welcome.order)
            layout = Layout.with_servers(setup.tables.specs, welcome.layout, welcome.order, welcome.server_keys)
            epoch = Epoch(comm, layout, members, welcome.server_keys[-1] + 1, resized_before=welcome.resized_before,
                          resume_mark=welcome.clock)
            epoch, _ = _rebalanced(ctx, setup, epoch, welcome, key)
            return _with_nodes(ctx, epoch)
        layout = Layout.from_wire(setup.tables.specs, welcome.layout)
        seat = welcome.seats.get(ctx.rank)
        loop = new_loop(Worker(ctx.comm, layout, ctx.traffic, guard=watchdog.guard,
                               clock=welcome.clock if seat is None else seat.step))
        if seat is not None:
            take_seat(loop, seat)
        loop.refetch = True  # its first step reads every dense table, whatever --fetch-every says
        epoch = Epoch(ctx.comm, layout, members, welcome.next_key, resized_before=welcome.resized_before)
        return _with_nodes(ctx, epoch.but(worker=WorkerSide(loop)))


def _in_order(ctx: Context, members: Membership, order: Sequence[int]) -> Tuple[MPI.Intracomm, Membership]:
    """Collective over the merged communicator: the ranks renumbered in ``order`` (servers
    first), and the membership in that order."""
    with watchdog.guard("server growth: the split that keeps servers first"):
        ordered = ctx.comm.Split(0, list(order).index(ctx.rank))
    ctx.replace_comm(ordered)
    return ordered, replace(members, ids=[members.ids[rank] for rank in order])


def _rebalanced(ctx: Context, setup: PSSetup, epoch: Epoch, welcome: Welcome,
                own_key: Optional[int]) -> Tuple[Epoch, int]:
    """Move the shards to the epoch's layout, rebuild the replicas; returns the epoch holding
    them and the bytes every rank moved."""
    layout, tables = epoch.layout, setup.tables
    with watchdog.guard("server growth: moving shard fragments"):
        state, moved = move_shards(ctx.comm, epoch.holdings, layout, tables.optimizers, welcome.applied,
                                   rows_stay=False)
        replica = rebuild_replica(ctx.comm, layout, state, None)
        total = ctx.comm.allreduce(moved)
    if state is not None:
        state.clocks[:] = np.asarray(welcome.clocks).copy()
    return epoch.but(holdings=ShardHoldings.serving(own_key, state, replica)), total


def _with_nodes(ctx: Context, epoch: Epoch) -> Epoch:
    """Collective, the job's last step of growth, newcomers too: every rank's node, by stable id
    (for a discovery file of hosts)."""
    return epoch.but(nodes={**epoch.nodes, **dict(zip(epoch.members.ids, rank_nodes(ctx.comm)))})


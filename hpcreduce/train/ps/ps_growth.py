"""Growth of a fault-tolerant PS run: newcomer workers (appended after every rank) and
newcomer shard servers (``--grow-servers``; placed after the servers, so servers stay first).

Rank 0 asks for growth (``progress.StepHooks``) by revoking the communicator; the recovery
that follows carries the request in its plan, and once it is committed every rank calls
``grow``: spawn and merge (``runtime.spawn``), a new layout with the newcomers' slots
(never used before) and one broadcast of the layout to the newcomers, who ``join``: they
take the layout and become workers at the slowest clock (BSP: the restart step), pulling
every dense table at their first step (even off the ``--fetch-every`` schedule). Shards
make room for the new slots; the training shards are re-split over the grown set of workers
(``partition.owned_shards``: the newcomers read their share), recorded in the event. Cost: one spawn and merge, one broadcast of a few hundred bytes.

Server growth (``grow_servers``), at the same quiescent point after the recovery round:
spawn and merge, one broadcast, an ``MPI_Comm_split`` that puts the newcomers right after
the servers (new ranks; stable ids follow), new shard keys, the placement recomputed over
all keys and the fragments that change owner moved in one alltoall (``ps.rebalance.move_shards``:
rendezvous hashing moves only the rows the new keys take; dense ranges are re-cut), the
replicas rebuilt, the workers re-routed. Counters stay with the servers that counted them.
Cost: a spawn, a split, the bytes that change owner, one shard per server to its backup.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Sequence

import numpy as np

from ...ft.watchdog import watchdog
from ...ps.layout import Layout
from ...ps.rebalance import move_shards, rebuild_replica
from ...ps.recovery_plan import Committed, Plan
from ...ps.worker import Worker
from ...runtime.launch import this_program
from ...runtime.nodes import rank_nodes
from ...runtime.spawn import spawn_and_merge
from .recovery import PSRecoveryEvent
from .worker_side import Takeover, seat_newcomers, take_seat, takeover_points
from ..partition import assignment

if TYPE_CHECKING:
    from .ps_driver import ElasticPS


def grow(run: "ElasticPS", count: int, kind: str, plan: Plan, step: int, takeover: Sequence[Takeover] = ()) -> None:
    """Spawn ``count`` workers and merge them in after every rank (collective); ``step``:
    growth is done for steps up to it; ``takeover``: dead workers' seats the first newcomers
    take (``--replace`` under ASP/SSP, see ``worker_side``)."""
    ctx = run.ctx
    event = run.events.add(PSRecoveryEvent(kind, plan.resume_step, ctx.size, time.time()))
    seats = takeover_points(ctx.comm, run.holdings, takeover, run.config.push_every) if takeover else []
    with watchdog.guard(f"{kind}: spawn and merge"):
        merged = spawn_and_merge(ctx.comm, count, this_program())
    ctx.replace_comm(merged)
    event.joined = run.members.grow(count)
    old = run.committed.layout
    newcomers = list(range(ctx.size - count, ctx.size))
    layout, slots = seat_newcomers(old, newcomers, seats)
    clock = plan.restart if plan.restart is not None else min(plan.clocks.values())
    run.committed = Committed(layout, run.committed.next_key)
    run.hooks.grown_before = max(run.hooks.grown_before, step)
    started = time.time()
    with watchdog.guard(f"{kind}: the layout to the newcomers"):
        ctx.comm.bcast({**_control(run, clock), "takeover": {rank: seat for rank, seat in zip(newcomers, seats)}},
                       root=0)
    for state in run.holdings.everything():
        state.grow(layout.slot_count)
        state.clocks[slots] = clock
        for seat in seats:
            state.clocks[seat.slot] = seat.step
    run.worker_side.rejoin(ctx, layout)
    event.data_shards = assignment([run.members.ids[rank] for rank in layout.worker_ranks],
                                   run.dataset.shard_sizes("train"))
    run.build_roles(layout)
    event.ranks_after, event.restore_s = ctx.size, time.time() - started
    run.hooks.growth_wanted = (0, 0)
    _learn_nodes(run)


def _control(run: "ElasticPS", clock: int) -> Dict[str, Any]:
    layout = run.committed.layout
    return {**run.members.control(), "shard_ranks": layout.shard_ranks, "worker_ranks": layout.worker_ranks,
            "worker_slots": layout.worker_slots, "slot_count": layout.slot_count, "ring": layout.ring,
            "key_nodes": layout.key_nodes,
            "next_key": run.committed.next_key, "grown_before": run.hooks.grown_before, "clock": clock}


def grow_servers(run: "ElasticPS", count: int, step: int, requested_at: float) -> None:
    """Spawn ``count`` shard servers and rebalance the shards over them (collective, at the
    quiescent point after a committed round); ``step``: growth is done for steps up to it."""
    ctx, old = run.ctx, run.committed.layout
    event = run.events.add(PSRecoveryEvent("server-growth", run.hooks.resume_mark + 1, ctx.size, requested_at))
    event.requested_at = requested_at
    with watchdog.guard("server growth: spawn and merge"):
        merged = spawn_and_merge(ctx.comm, count, this_program())
    size = ctx.size
    ctx.replace_comm(merged)
    event.joined = run.members.grow(count)
    servers = sorted(old.shard_ranks.values())
    order = servers + list(range(size, size + count)) + [r for r in range(size) if r not in servers]
    keys = list(range(run.committed.next_key, run.committed.next_key + count))
    new_rank = {rank: position for position, rank in enumerate(order)}
    layout = old.rebuilt({**{key: new_rank[rank] for key, rank in old.shard_ranks.items()},
                          **{key: len(servers) + i for i, key in enumerate(keys)}},
                         [new_rank[rank] for rank in old.worker_ranks], old.worker_slots, old.slot_count)
    run.hooks.grown_before = max(run.hooks.grown_before, step)
    started = time.time()
    own = run.holdings.own  # rank 0 is a server: its clocks and applied steps are everybody's
    with watchdog.guard("server growth: the layout to the newcomers"):
        control = ctx.comm.bcast({**_control(run, run.hooks.resume_mark), "order": order, "server_keys": keys,
                                  "clocks": own.clocks, "applied": own.applied_steps} if ctx.rank == 0 else None,
                                 root=0)
    run.committed = Committed(layout, keys[-1] + 1)
    _reorder(run, order)
    moving = time.time()
    event.moved_bytes = _rebalance(run, control["clocks"].copy(), control["applied"], run.holdings.own_key)
    event.rebalance_s = time.time() - moving
    run.worker_side.rejoin(ctx, layout)
    run.build_roles(layout)
    event.ranks_after, event.restore_s = ctx.size, time.time() - started
    run.hooks.servers_wanted = (0, 0)
    _learn_nodes(run)


def _learn_nodes(run: "ElasticPS") -> None:
    """Collective, the job's last step of growth, newcomers too: every rank's node, by stable id
    (for a discovery file of hosts)."""
    run.hooks.nodes.update(zip(run.members.ids, rank_nodes(run.ctx.comm)))


def _reorder(run: "ElasticPS", order: List[int]) -> None:
    """Collective over the merged communicator: renumber the ranks in ``order`` (servers first)."""
    ctx = run.ctx
    with watchdog.guard("server growth: the split that keeps servers first"):
        ordered = ctx.comm.Split(0, order.index(ctx.rank))
    ctx.replace_comm(ordered)
    run.members.ids = [run.members.ids[rank] for rank in order]


def _rebalance(run: "ElasticPS", clocks: np.ndarray, applied: int, own_key) -> int:
    """Move the shards to the committed layout, rebuild the replicas; returns the bytes moved."""
    ctx, layout = run.ctx, run.committed.layout
    with watchdog.guard("server growth: moving shard fragments"):
        state, moved = move_shards(ctx.comm, run.holdings, layout, run.optimizers, applied, rows_stay=False)
        replica = rebuild_replica(ctx.comm, layout, state, None)
        total = ctx.comm.allreduce(moved)
    if state is not None:
        state.clocks[:] = clocks
    run.holdings.settle(own_key, state, replica)
    return total


def join(run: "ElasticPS", control: Dict[str, Any]) -> None:
    """A spawned newcomer, with the job's broadcast ``control``: take the layout, become a
    worker, or (``server_keys`` given) a shard server."""
    ctx = run.ctx
    if "server_keys" in control:
        _join_as_server(run, control)
        return
    layout = Layout(run.specs, control["shard_ranks"], control["worker_ranks"], control["worker_slots"],
                    control["slot_count"], control["ring"], control["key_nodes"])
    run.committed = Committed(layout, control["next_key"])
    run.hooks.grown_before = control["grown_before"]
    run.hooks.struck = run.hooks.struck_recovery = control["clock"]
    seat = control.get("takeover", {}).get(ctx.rank)
    loop = run.new_loop(Worker(ctx.comm, layout, ctx.traffic, guard=watchdog.guard,
                               clock=control["clock"] if seat is None else seat.step))
    if seat is not None:
        take_seat(loop, seat)
    loop.refetch = True  # its first step reads every dense table, whatever --fetch-every says
    run.worker_side.loop = loop
    run.observer.reporter = layout.worker_ranks[0]
    _learn_nodes(run)


def _join_as_server(run: "ElasticPS", control: Dict[str, Any]) -> None:
    """A newcomer shard server: renumber with the job, receive its shard and replica."""
    ctx, order = run.ctx, control["order"]
    key = control["server_keys"][order.index(ctx.rank) - len(control["shard_ranks"])]
    _reorder(run, order)
    new_rank = {rank: position for position, rank in enumerate(order)}
    layout = Layout(run.specs, {**{k: new_rank[r] for k, r in control["shard_ranks"].items()},
                                **{k: len(control["shard_ranks"]) + i for i, k in enumerate(control["server_keys"])}},
                    [new_rank[r] for r in control["worker_ranks"]], control["worker_slots"], control["slot_count"],
                    control["ring"], control["key_nodes"])
    run.committed = Committed(layout, control["server_keys"][-1] + 1)
    run.hooks.grown_before = control["grown_before"]
    run.hooks.struck = run.hooks.struck_recovery = run.hooks.checkpointed = control["clock"]
    run.hooks.resume_mark = control["clock"]
    _rebalance(run, control["clocks"], control["applied"], key)
    run.build_roles(layout)
    _learn_nodes(run)

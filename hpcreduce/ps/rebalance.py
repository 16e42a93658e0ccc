"""The collective moves of a recovery: re-pushes, the rebalance, the replicas.

Collective over the survivors, after ``recovery_plan.make_plan`` gave every rank the same
plan and each rank took over what the plan gives it (``ShardHoldings``):

- ``settle_bsp``: BSP; every shard held applies the buffered steps below the restart
  step and drops the later ones (``ShardEngine.settle``);
- ``deliver_repushes``: ASP/SSP; every worker's unacknowledged push goes again to the
  shards of the placement it was sent under (``repush_items`` cuts it), which drop what
  they already have (exactly once by (slot, step));
- ``rebalance``: the placement is recomputed over the live shard keys and the fragments
  that change owner move (``move_shards``, with ``fragments``; also when servers join or leave);
- ``rebuild_replica``: each server sends its shard to its backup and receives its
  predecessor's.

Cost: one alltoall of the re-pushed gradients, one alltoall of the bytes that change
owner, one shard per server to its backup.
"""
from __future__ import annotations

from typing import List, Mapping, NamedTuple, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..errors import PSTrainingError
from .consistency import Consistency
from .engine import ShardEngine
from .fragments import assemble, cut
from .holdings import ShardHoldings
from .layout import Layout
from .optimizers import Optimizer
from .protocol import Status
from .recovery_plan import Plan
from .shard_state import ShardState

Optimizers = Mapping[int, Optimizer]


class Repush(NamedTuple):
    """One piece of a push sent again: to shard ``key``, table ``table``, from ``slot`` at
    ``step``; dense from element ``start`` (``ids`` None), or sparse rows ``ids``."""

    key: int
    table: int
    slot: int
    step: int
    start: int
    ids: Optional[np.ndarray]
    values: np.ndarray


def settle_bsp(holdings: ShardHoldings, restart: int, optimizers: Optimizers, consistency: Consistency) -> None:
    """BSP: every held shard applies the steps below ``restart`` and forgets the later ones."""
    for state in holdings.everything():
        ShardEngine(state, optimizers, consistency, measured=False).settle(restart)


def repush_items(layout: Layout, holders: Mapping[int, int], slot: int, step: int,
                 dense: Mapping[str, np.ndarray], rows: Mapping[str, Tuple[np.ndarray, np.ndarray]]
                 ) -> List[Tuple[int, Repush]]:
    """(rank holding the shard now, piece) for every piece of a push of ``slot`` at ``step``,
    cut by the placement of ``layout`` it was sent under."""
    items = []
    for name, grad in dense.items():
        t = layout.table_ids[name]
        flat = grad.reshape(-1)
        for piece in layout.placement.pieces[t]:
            items.append((holders[piece.shard], Repush(piece.shard, t, slot, step, piece.start, None,
                                                       flat[piece.start:piece.stop])))
    for name, (ids, grads) in rows.items():
        t = layout.table_ids[name]
        owners = layout.placement.row_owners(t, ids)
        for key in sorted(set(owners.tolist())):
            mask = owners == key
            items.append((holders[key], Repush(key, t, slot, step, 0, ids[mask], grads[mask])))
    return items


def deliver_repushes(comm: MPI.Intracomm, holdings: ShardHoldings, items: List[Tuple[int, Repush]],
                     optimizers: Optimizers, consistency: Consistency) -> int:
    """Send this rank's re-pushed pieces to the ranks holding their shards now, take those
    sent here; returns how many pieces every rank re-pushed. A refused piece raises
    ``PSTrainingError`` on every rank."""
    sends: List[List[Repush]] = [[] for _ in range(comm.Get_size())]
    for destination, item in items:
        sends[destination].append(item)
    answers = [[_accept(holdings, item, optimizers, consistency) for item in received]
               for received in comm.alltoall(sends)]
    statuses = [status for received in comm.alltoall(answers) for status in received]
    refused = next((s for s in statuses if s not in (Status.OK, Status.DUPLICATE)), 0)
    counts = comm.allgather((len(items), refused))
    refused = max(code for _, code in counts)
    if refused:
        raise PSTrainingError(f"a re-pushed gradient was refused after recovery: {Status(refused).name}")
    return sum(count for count, _ in counts)


def _accept(holdings: ShardHoldings, item: Repush, optimizers: Optimizers, consistency: Consistency) -> int:
    state = holdings.states[item.key]
    table = state.tables[item.table]
    if item.ids is None:
        if item.start != table.start or item.values.size != table.values.size:
            return int(Status.BAD_SIZE)
        gradient = item.values
    elif table.foreign(item.ids) is not None:
        return int(Status.NOT_OWNER)
    else:
        gradient = (item.ids, item.values)
    return int(ShardEngine(state, optimizers, consistency).accept(item.slot, item.step, item.table, gradient))


def rebalance(comm: MPI.Intracomm, holdings: ShardHoldings, plan: Plan, before: Layout, after: Layout,
              optimizers: Optimizers) -> Tuple[Optional[ShardState], int]:
    """Move shard data from ``before``'s placement to ``after``'s; returns this rank's new
    shard (None on a worker) and the bytes it sent to others, or -1 when nothing changes
    owner (then nothing moves at all: the same on every rank)."""
    unchanged = (not plan.restored and set(plan.holders) == set(after.shard_ranks)
                 and all(plan.holders[key] == owner for key, owner in after.shard_ranks.items()))
    if unchanged:
        return holdings.own, -1
    applied = max([s.applied_steps for s in holdings.states.values()], default=0)
    return move_shards(comm, holdings, after, optimizers, plan.restart if plan.restart is not None else applied,
                       rows_stay=set(after.shard_ranks) <= set(before.shard_ranks))


def move_shards(comm: MPI.Intracomm, holdings: ShardHoldings, after: Layout, optimizers: Optimizers,
                applied_steps: int, *, rows_stay: bool) -> Tuple[Optional[ShardState], int]:
    """Collective, at a quiescent point: cut every state held along ``after``'s placement,
    move the fragments to their owners (ranks of ``comm``), assemble this rank's shard (None
    on a worker; counters kept by the server that counted them); returns it and the bytes sent.
    ``rows_stay``: no shard key was added, so live shards keep their sparse rows unhashed."""
    rank = comm.Get_rank()
    sends: List[Tuple[list, list]] = [([], []) for _ in range(comm.Get_size())]
    moved = 0
    for state in holdings.states.values():
        for key, fragments in cut(state, after.placement, rows_stay=rows_stay).items():
            destination = after.shard_ranks[key]
            sends[destination][0].extend(fragments)
            moved += sum(f.nbytes for f in fragments) if destination != rank else 0
    if holdings.states and not after.is_server(rank):  # a server leaving: its counters go to the first server
        sends[min(after.shard_ranks.values())][1].extend(_counters_of(holdings.states.values()))
    kept, sends[rank] = sends[rank], ([], [])  # never pickled
    parts = [kept] + comm.alltoall(sends)
    if not after.is_server(rank):
        return None, moved
    key = after.shard_of(rank)
    state = ShardState.empty(key, assemble(key, after.specs, after.placement,
                                           [f for fragments, _ in parts for f in fragments], optimizers,
                                           after.slot_count), after.slot_count, applied_steps)
    state.merge_counters(list(holdings.states.values()) + [c for _, counters in parts for c in counters])
    return state, moved


def _counters_of(states) -> List[ShardState]:
    """Counter-only copies of ``states`` (no tables), to hand to another server."""
    copies = []
    for state in states:
        copy = ShardState.empty(state.shard, {}, state.slot_count)
        copy.merge_counters([state])
        copies.append(copy)
    return copies


def rebuild_replica(comm: MPI.Intracomm, layout: Layout, state: Optional[ShardState],
                    kept: Optional[ShardState]) -> Optional[ShardState]:
    """This server's replica of its predecessor's shard after a recovery (two or more
    servers): ``kept`` when given (the same choice on every server), else received from
    the predecessor while this shard goes to its backup."""
    rank = comm.Get_rank()
    if len(layout.shard_ranks) < 2 or not layout.is_server(rank):
        return None
    if kept is not None:
        return kept
    backup, primary = layout.neighbours(layout.shard_of(rank))
    return comm.sendrecv(state, dest=layout.shard_ranks[backup], source=layout.shard_ranks[primary])

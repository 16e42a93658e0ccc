"""Leaves and growth: asked for from the loop (``request_resize``), carried out by ``run``.

``request_resize(state, at)`` evaluates the policy's ``ft.resize.GrowthRule`` for moment
``at`` (a step, or a commit): the ``--leave``/``--grow`` entries due and, when it is read
then, the discovery file (rank 0 reads it, every rank gets the answer; a problem with it is
echoed once and changes nothing). When ranks are to leave or join it raises
``ResizeRequested`` on every rank at once (after one agreement when the file asked: a rank
failing meanwhile is recovered from first). ``run`` then calls ``leave`` (the communicator is
split without the leavers, in one ``attempt``; they exit 0 at once, ``runtime.spawn.leave_job``)
and ``grow`` (``spawn_and_merge``; the newcomers get the membership and the bookkeeping,
then the values). Cost of a read: a small broadcast, an allgather of node names when hosts
count, and an agreement when it asks for a change.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from ..ft.resize import Wanted, discovery_warning
from ..ft.rounds import attempt
from ..ft.watchdog import watchdog
from ..runtime.failures import fatal_failures
from ..runtime.launch import this_program
from ..runtime.nodes import rank_nodes
from ..runtime.spawn import leave_job, spawn_and_merge, split_off
from .agreement import agreed
from .job import Change

if TYPE_CHECKING:
    from .state import State


class ResizeRequested(Exception):
    """Raised on every rank at once when ranks are to leave or join before moment ``at``:
    ``leaving`` (stable ids, sorted), then ``count`` ranks to spawn; ``requested_at``: when
    that was decided (wall clock). ``run`` catches it, carries it out and calls the loop again."""

    def __init__(self, at: int, leaving: Sequence[int], count: int, requested_at: float):
        super().__init__(f"before {at}: {len(leaving)} rank(s) leave, {count} join")
        self.at, self.leaving, self.count, self.requested_at = at, list(leaving), count, requested_at


def request_resize(state: "State", at: int) -> None:
    """Raise ``ResizeRequested`` when the policy asks for leaves or growth before ``at`` (once
    for each moment: those up to ``job.resized_before`` are done)."""
    job, ctx = state.job, state.context
    rule = job.policy.growth
    if at <= job.resized_before:
        return
    requested, polled = time.time(), rule.reads_target(at)
    wanted, nodes = _poll(state, at) if polled else (None, [])
    leaving = rule.leavers(job.resized_before, at, job.members.ids, nodes, wanted)
    count = rule.count(job.resized_before, at, ctx.size - len(leaving), wanted)
    if leaving or count:
        if polled:  # acted on only once every rank has the file's answer (a failure meanwhile: Interrupted)
            agreed(ctx, lambda: None, f"discovery file before step {at}")
        raise ResizeRequested(at, leaving, count, requested)
    job.resized_before = at


def _poll(state: "State", at: int) -> Tuple[Optional[Wanted], List[str]]:
    """What the discovery file asks for (rank 0 reads it; everyone gets the answer) and the
    node of every rank (gathered first when the policy checks the file's hosts, else only for
    a file of hosts). A problem with the file is a warning (once, on rank 0) and changes nothing;
    rank 0's read never raises (``GrowthRule.wanted``), so no rank is left in the broadcast."""
    job, ctx = state.job, state.context
    check = job.policy.known_hosts
    with watchdog.guard(f"discovery file before step {at}"):
        nodes = rank_nodes(ctx.comm) if check else None
        found = job.policy.growth.wanted(at, check(nodes) if check else None) if ctx.rank == 0 else None
        found = ctx.comm.bcast(found, root=0)
        if nodes is None and isinstance(found, Wanted) and found.hosts is not None:
            nodes = rank_nodes(ctx.comm)
    note = discovery_warning(found)
    if note and note != job.warned and ctx.rank == 0:
        job.policy.warn(f"warning: {note}")
    job.warned = note
    return (None if isinstance(found, str) else found), nodes or []


def leave(state: "State", request: ResizeRequested) -> Optional[float]:
    """The ranks ``request.leaving`` leave: the communicator is split without them (one
    attempt) and they exit. None once done; when a rank failed meanwhile, the moment this rank
    saw it (nothing changed: recover, and the leave is asked for again)."""
    ctx, job = state.context, state.job
    going = job.members.me in request.leaving
    state._leaving(None, going)
    outcome = attempt(ctx.comm, lambda: [split_off(ctx.comm, going)], f"leave at step {request.at} (split)")
    if not outcome.committed:
        if outcome.result and outcome.result[0] is not None:
            outcome.result[0].Free()
        return outcome.failed_at or time.time()
    staying = outcome.result[0]
    if staying is None:  # a spawned rank finalizes: its exit would end its spawned job (``leave_job``)
        leave_job(ctx.comm, finalize=ctx.joined)
    change = Change("leave", request.at, ctx.size, request.requested_at, requested_at=request.requested_at)
    ctx.replace_comm(staying)
    state._leaving(ctx)
    job.members.leave(request.leaving)
    change.left = list(request.leaving)
    change.ranks_after = ctx.size
    change.restore_s = time.time() - request.requested_at
    change.data_shards = job.policy.data_shards(job.members.ids)
    state._reset(change)
    return None


def grow(state: "State", count: int, kind: str, at: int) -> None:
    """Spawn ``count`` ranks running this program, merged in after the current ones; send them
    the membership, the bookkeeping and the values. ``kind``: growth or replacement. A rank
    dying meanwhile ends the job with one clear error (``fatal_failures``)."""
    ctx, job = state.context, state.job
    change = Change(kind, at, ctx.size, time.time())
    with fatal_failures(f"the {kind} at step {at} (spawning {count} rank(s))", lambda: ctx.comm):
        with watchdog.guard(f"{kind} at step {at} (spawn and merge)"):
            merged = spawn_and_merge(ctx.comm, count, this_program())
        ctx.replace_comm(merged)
        change.joined = job.members.grow(count)
        begun = time.time()
        with watchdog.guard(f"{kind} at step {at} (state to newcomers)"):
            ctx.comm.bcast(job.control(), root=0)
            state.sync()
    change.ranks_after = ctx.size
    change.restore_s = time.time() - begun
    change.data_shards = job.policy.data_shards(job.members.ids)
    state._reset(change)

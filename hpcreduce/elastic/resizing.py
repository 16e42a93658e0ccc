"""Leaves and growth, asked for from the loop or a commit (``state.request_resize``: a
``ResizeRequested`` on every rank at once) and carried out by ``run``: ``leave`` (the
communicator is split without the leavers, in one ``attempt``; they exit 0 at once,
``runtime.spawn.leave_job``) and ``grow`` (``spawn_and_merge``; the newcomers get the membership and the bookkeeping,
then the values).
"""
from __future__ import annotations

import time
from typing import Optional

from ..ft.rounds import attempt
from ..ft.watchdog import watchdog
from ..runtime.failures import fatal_failures
from ..runtime.launch import this_program
from ..runtime.spawn import leave_job, spawn_and_merge, split_off
from .job import Change
from .state import ResizeRequested, State


def leave(state: State, request: ResizeRequested) -> Optional[float]:
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


def grow(state: State, count: int, kind: str, at: int) -> None:
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

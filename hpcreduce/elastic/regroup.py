"""After a failure, and for a newcomer: the ranks agree on who is left and on rank 0's values.

``recover``: the survivors shrink (``ft.rounds.shrink_until_restored``: revoke, shrink,
agree, in rounds while ranks keep failing; they keep their order), every one restores its
last commit and takes rank 0's (``State.sync``); the policy's ``recovery`` kills strike
between revoke and shrink; with ``Policy.replace`` one rank is then spawned per rank lost.
``join``: a newcomer takes the membership and the bookkeeping, then rank 0's values, as the
job's ranks send them (``resizing.grow``).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..ft.rounds import Shrunk, shrink_until_restored
from ..runtime.failures import fatal_failures
from .job import Change
from .resizing import grow

if TYPE_CHECKING:
    from .state import State


def recover(state: "State", detected: float) -> None:
    """Shrink to the survivors, restore every rank's last commit, take rank 0's (``detected``:
    when this rank saw the failure, or learned of it)."""
    ctx, job = state.context, state.job
    at = job.policy.step_of(state)
    change = Change("failure", at, ctx.size, detected)

    def restore(shrunk: Shrunk) -> None:
        change.lost += job.members.shrink(shrunk)
        change.rounds += shrunk.rounds
        change.shrink_s = time.time() - change.detected_at
        state._recover_values()

    shrink_until_restored(ctx, restore, f"recovery at step {at}", before_shrink=lambda: job.policy.kills.strike(
        "recovery", at, job.members.me, job.members.ids))
    change.ranks_after = ctx.size
    change.restore_s = time.time() - change.detected_at - change.shrink_s
    change.data_shards = job.policy.data_shards(job.members.ids)
    state._reset(change)
    if job.policy.replace and change.lost:
        grow(state, len(change.lost), "replacement", at)


def join(state: "State") -> None:
    """A newcomer: take the membership, the bookkeeping and rank 0's values, as the job sends them."""
    started, ctx = time.time(), state.context
    with fatal_failures("a newcomer's start (the state sent to it)", lambda: ctx.comm):
        state._adopt(ctx.comm.bcast(None, root=0))
        state.sync()
    change = Change("joined", state.job.policy.step_of(state), state.context.size, started)
    change.joined = [state.members.me]
    change.ranks_after = state.context.size
    state._reset(change)

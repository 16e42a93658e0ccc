"""``run``: call a user's training function until it returns on every live rank.

Each call of ``func(state)`` is one ULFM attempt (``ft.rounds.attempt``): it ends with one
agreement, so a rank that returned while a peer failed goes back into the loop with the
others instead of leaving them waiting. A failed attempt is followed by the recovery of
``ft.rounds`` (revoke, shrink, agree; survivors keep their order), after which every
survivor restores its last commit and takes rank 0's (``State.sync``). Growth asked for
at a commit spawns the ranks (the same program), merges them in after the current ranks
and sends them the membership and the state. Either way the reset callbacks run and
``func(state)`` is called again.
Cost while nothing fails: one ``MPI_Comm_agree`` per call of ``func`` (not per step).
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable, TypeVar

from ..ft.rounds import attempt, shrink_until_restored
from ..runtime.context import agreed_launch_settings
from ..runtime.launch import mark_done, this_program
from ..runtime.spawn import spawn_and_merge
from .state import GrowthRequested, State

T = TypeVar("T")


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Wrap ``func(state, *args, **kwargs)`` so that it survives dead ranks and takes in new
    ones. Needs a launch with ULFM (``hpcreduce launch --ft``); without it the wrapped call
    raises ``FaultToleranceUnavailableError`` on every rank, saying what is missing. Once it
    returned after a change of ranks, rank 0 marks the job done for ``hpcreduce launch``
    (which then reports success although mpirun exits 137 after a spawned rank died)."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> T:
        ctx = state.context
        if not ctx.ft:
            agreed_launch_settings(ft=True)  # raises on every rank, naming what this launch lacks
        if ctx.joined and not state.events:
            _join(state)
        while True:
            started = time.time()
            try:
                outcome = attempt(ctx.comm, lambda: func(state, *args, **kwargs), "elastic run", watch_work=False)
            except GrowthRequested as request:
                _grow(state, request.count, started)
                continue
            if outcome.committed:
                if state.events and ctx.rank == 0:
                    mark_done()  # Open MPI exits 137 once a spawned rank has died, even when recovered
                return outcome.result
            _recover(state, started)

    return wrapper


def _recover(state: State, started: float) -> None:
    """Shrink to the survivors, restore every rank's last commit, take rank 0's."""
    lost = []

    def restore(shrunk) -> None:
        lost.extend(state.members.shrink(shrunk))
        state.restore()
        state.sync()

    shrink_until_restored(state.context, restore, "elastic recovery")
    state._reset("failure", started, lost=lost)


def _grow(state: State, count: int, started: float) -> None:
    """Spawn ``count`` ranks running this program; send them the membership and the state."""
    ctx = state.context
    ctx.replace_comm(spawn_and_merge(ctx.comm, count, this_program()))
    joined = state.members.grow(count)
    ctx.comm.bcast(state.members.control(), root=0)
    state.sync()
    state._reset("growth", started, joined=joined)


def _join(state: State) -> None:
    """A newcomer: take the membership and rank 0's state, as the job's ranks send them."""
    started = time.time()
    state._adopt(state.context.comm.bcast(None, root=0))
    state.sync()
    state._reset("joined", started, joined=[state.members.me])

"""``run``: call a training function until it returns on every live rank.

Each call of ``func(state)`` is one ULFM attempt (``ft.rounds.attempt``): it ends with one
agreement, so a rank that returned while a peer failed goes back into the loop with the
others instead of leaving them waiting; before it, each tracked value's handler ends
agreements of its own (``State._attempt_ended``: a ``start_hybrid`` job's tables). A failed
attempt, or an ``agreed`` block that did not commit (``Interrupted``), is followed by the
recovery (``regroup.recover``); a
``ResizeRequested`` (from ``State.commit`` or the loop's ``request_resize``) by the leaves and
the growth it asks for (``resizing``). Either way the reset callbacks run and ``func(state)``
is called again. Every path ends, on every rank, with exactly one agreement: an agreement of
``agreed`` that fails meets a peer's ending its call of ``func``, never a shrink.
A stop signal (``run(on_stop=...)``) is a revoke at the next commit of the rank that received it,
then the same recovery, after which every rank saves and exits resumable (``StoppedEarly``).
Cost while nothing fails: one ``MPI_Comm_agree`` per call of ``func`` and one per ``agreed`` block.
"""
from __future__ import annotations

import functools
import sys
import time
from typing import Any, Callable, Optional, TypeVar

from mpi4py import MPI

from ..ft.rounds import attempt
from ..runtime.context import agreed_launch_settings
from ..runtime.launch import mark_done
from ..runtime.stop import STOP_SIGNALS, StoppedEarly, requests
from .agreement import Interrupted
from .regroup import join, recover
from .resizing import ResizeRequested, grow, leave
from .state import State

T = TypeVar("T")


def run(func: Optional[Callable[..., T]] = None, *,
        on_stop: Optional[Callable[[State], Optional[str]]] = None) -> Any:
    """Wrap ``func(state, *args, **kwargs)`` so that it survives dead ranks, takes in new ones
    and lets ranks leave. Needs a launch with ULFM (``hpcreduce launch --ft``); without it the
    wrapped call raises ``FaultToleranceUnavailableError`` on every rank, saying what is missing
    (unless the state's ``Policy.needs_ulfm`` is off: then ``func`` is called once). Once it
    returned after a change of ranks, rank 0 marks the job done for ``hpcreduce launch``
    (which then reports success although mpirun exits 137 after a spawned rank died).

    ``@elastic.run(on_stop=save)``: the run also takes stop signals (``HPCREDUCE_STOP_SIGNALS``,
    default SIGUSR1 and SIGTERM; ``runtime.stop``). A rank that received one revokes at its next
    commit; every rank goes back to rank 0's last commit (as after a failure), ``save(state)``
    runs on every rank (a collective save: ``save_checkpoint``, ``hpcreduce.torch.save_checkpoint``;
    it returns where it saved, or None) and every rank raises ``StoppedEarly`` (a ``SystemExit``
    with code 75 when saved). Started again, the script loads its checkpoint and goes on. The
    signals' handlers are those of before the call again once it returned or raised."""
    if func is None:
        return functools.partial(run, on_stop=on_stop)

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> T:
        if on_stop is None:
            return _run(func, state, *args, **kwargs)
        state.job.on_stop = on_stop
        requests.install(STOP_SIGNALS.value())
        try:
            return _run(func, state, *args, **kwargs)
        finally:  # the process's own handlers again (SIGTERM ends it, as before the call)
            requests.uninstall()

    return wrapper


def _run(func: Callable[..., T], state: State, *args: Any, **kwargs: Any) -> T:
    """``run``'s loop: ``func`` until it returns on every live rank."""
    ctx, policy = state.context, state.job.policy
    if not ctx.ft and not policy.needs_ulfm:
        return func(state, *args, **kwargs)
    if not ctx.ft:
        agreed_launch_settings(ft=True)  # raises on every rank, naming what this launch lacks
    if ctx.joined and not state.job.changes.events:
        join(state)

    def once() -> T:
        result = func(state, *args, **kwargs)
        state._attempt_ended(False)
        return result

    while True:
        try:
            outcome = attempt(ctx.comm, once, "elastic run", watch_work=False,
                              on_failure=lambda: state._attempt_ended(True))
        except Interrupted as failure:
            recover(state, failure.detected_at)
            _stop_if_asked(state)
            continue
        except ResizeRequested as request:
            _resize(state, request)
            continue
        if outcome.committed:
            if policy.marks_done and state.events and ctx.rank == 0:
                mark_done()  # Open MPI exits 137 once a spawned rank has died, even when recovered
            return outcome.result
        recover(state, outcome.failed_at or time.time())
        _stop_if_asked(state)


def _resize(state: State, request: ResizeRequested) -> None:
    """The leaves, then the growth, ``request`` asks for; a failure meanwhile is recovered
    (the request is then made again)."""
    if request.leaving:
        failed_at = leave(state, request)
        if failed_at is not None:
            recover(state, failed_at)
            return
    state.job.resized_before = request.at
    if request.count:
        grow(state, request.count, "growth", request.at)


def _stop_if_asked(state: State) -> None:
    """After a recovery of a run given ``on_stop``: when some rank received a stop signal (one
    small allreduce), every rank, now at rank 0's last commit, saves (``on_stop``) and raises
    ``StoppedEarly``."""
    ctx, job = state.context, state.job
    if job.on_stop is None or not ctx.comm.allreduce(requests.seen is not None, op=MPI.LOR):
        return
    saved = job.on_stop(state)
    stopped = StoppedEarly(state.commits - 1, saved, requests.seen, unit="commit")  # the State's own aside
    if ctx.rank == 0:
        print(f"hpcreduce: {stopped}", file=sys.stderr, flush=True)
        mark_done(stopped.code)
    raise stopped

"""Rounds that end in one agreement: the ULFM skeleton both topologies run.

``attempt(comm, work, what)`` runs ``work()``. A process failure in it (``ERR_PROC_FAILED``,
``ERR_REVOKED``) makes the rank revoke the communicator, so no peer stays blocked
waiting for it, and every rank then ends the attempt with one ``Agree``: the attempt
commits only when every rank finished its work and none failed. A step is committed
this way before anyone applies it, so an interrupted step is redone, never applied twice.

``shrink_until_restored(ctx, restore, what)`` is the recovery: shrink the communicator
to the survivors (``shrink_and_rebuild``: revoke, shrink, agree, repeated while ranks
keep failing; survivors keep their relative order, so PS servers stay first), then
attempt ``restore`` on them; a failure during the restore starts the round again on
what is left. Every round ends, on every rank, with exactly one agreement, so a rank
never sits in an agreement while another shrinks (Open MPI's shrink agrees internally
too, and the two must not meet). No ``Dup`` is taken here: a failure while a
communicator is being duplicated has crashed Open MPI 5.0.
Cost while nothing fails: one ``MPI_Comm_agree`` per attempt.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Generic, List, Optional, TypeVar

from mpi4py import MPI

from ..runtime.context import Context
from ..runtime.failures import agree_all, is_process_failure, revoke, shrink_agreed
from .watchdog import watchdog

T = TypeVar("T")


@dataclass
class Shrunk:
    """The survivors' communicator and who was lost, in ranks of the communicator given."""

    comm: MPI.Intracomm
    lost: List[int]
    new_rank: List[Optional[int]]
    rounds: int
    seconds: float = field(default=0.0)


@dataclass
class Outcome(Generic[T]):
    """How an attempt ended: ``committed`` on every rank alike; ``result`` of this rank's
    work (None if it failed here); ``failed_at``: when this rank saw a failure, if it did."""

    committed: bool
    result: Optional[T] = None
    failed_at: Optional[float] = None


def attempt(comm: MPI.Intracomm, work: Callable[[], T], what: str, *,
            on_failure: Callable[[], None] = lambda: None, watch_work: bool = True) -> Outcome[T]:
    """Run ``work()`` (under the watchdog unless ``watch_work`` is off: work that guards its
    own waits, such as a whole PS run), then agree with every rank whether all finished.

    On a process failure in ``work`` this rank revokes ``comm`` and calls ``on_failure``
    (to complete requests still in flight); any other error propagates.
    """
    outcome: Outcome[T] = Outcome(False)
    try:
        with watchdog.guard(what) if watch_work else nullcontext():
            outcome.result = work()
    except MPI.Exception as error:
        if not is_process_failure(error, comm):
            raise
        outcome.failed_at = time.time()
        revoke(comm)
        on_failure()
    with watchdog.guard(f"{what}: the agreement that ends it"):
        outcome.committed = agree_all(comm, outcome.failed_at is None)
    return outcome


def shrink_until_restored(ctx: Context, restore: Callable[[Shrunk], T], what: str, *,
                          before_shrink: Callable[[], None] = lambda: None) -> T:
    """Shrink ``ctx`` to the survivors and run ``restore(shrunk)`` on them, in rounds, until
    a round commits; returns its result. ``ctx``'s communicator is replaced every round."""
    while True:
        with watchdog.guard(f"{what} (revoke, shrink, agree)"):
            shrunk = shrink_and_rebuild(ctx.comm, before_shrink=before_shrink)
        ctx.replace_comm(shrunk.comm)
        outcome = attempt(ctx.comm, lambda: restore(shrunk), f"{what} (restore)")
        if outcome.committed:
            return outcome.result


def shrink_and_rebuild(comm: MPI.Intracomm, *, before_shrink: Callable[[], None] = lambda: None) -> Shrunk:
    """Revoke ``comm``, shrink it to the survivors and agree; repeat while ranks keep failing.

    ``before_shrink`` runs after the revoke (fault injection uses it to kill a rank in
    the middle of a recovery). Returns the new communicator (errors returned, not fatal).
    """
    started = time.perf_counter()
    current, rounds = shrink_agreed(comm, before_shrink)
    old_group, new_group = comm.Get_group(), current.Get_group()
    new_rank = MPI.Group.Translate_ranks(old_group, list(range(old_group.Get_size())), new_group)
    old_group.Free()
    new_group.Free()
    mapped = [None if r == MPI.UNDEFINED else r for r in new_rank]
    lost = [old for old, r in enumerate(mapped) if r is None]
    return Shrunk(current, lost, mapped, rounds, time.perf_counter() - started)

"""Recognising ULFM's reports of dead peers, and leaving no request behind after one."""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable, ContextManager, Iterable, Iterator, List, Optional, Tuple, TypeVar

from mpi4py import MPI

from ..errors import ProcessLostError
from .watchdog import abort_job, watchdog

T = TypeVar("T")
FAILURE_CLASSES = frozenset({MPI.ERR_PROC_FAILED, MPI.ERR_REVOKED,
                             getattr(MPI, "ERR_PROC_FAILED_PENDING", MPI.ERR_PROC_FAILED)})


def is_process_failure(error: BaseException, comm: Optional[MPI.Comm] = None) -> bool:
    """Whether ``error`` is ULFM's report of a dead peer or a revoked communicator.

    With ``comm``, any MPI error counts when ``comm`` is revoked or knows a failed peer:
    Open MPI 5.0 has reported a spawned peer's death as ``ERR_OTHER`` on some ranks.
    """
    if not isinstance(error, MPI.Exception):
        return False
    if error.Get_error_class() in FAILURE_CLASSES:
        return True
    if comm is None:
        return False
    try:
        if comm.Is_revoked():
            return True
        failed = comm.Get_failed()
        known = failed.Get_size()
        failed.Free()
        return known > 0
    except MPI.Exception:
        return True


def wait_all(requests: List[MPI.Request], what: Optional[str] = None) -> None:
    """Complete ``requests``, one ``MPI_Wait`` each (the first failure raised with its own error),
    under the deadline watchdog (``what``: the wait, as its error names it; None: the enclosing
    guard's name).

    Not ``MPI_Waitall``: after a process failure Open MPI 5.0.11's ``MPI_Waitall`` returns the
    requests still in flight as ``ERR_PENDING`` yet sets their handles to null; one completed
    later (with an error) then ends the whole job ("Recv error after request freed"). A
    failed ``MPI_Wait`` leaves its request, and those after it, live for ``abandon``."""
    if not requests:
        return
    with watchdog.guard(what):
        for request in requests:
            request.Wait()


def failed_ranks(comm: MPI.Comm, wait_s: float = 2.0) -> List[int]:
    """The ranks (of ``MPI_COMM_WORLD``) that ``comm`` knows failed; a rank that learned of the
    failure from a revoke waits up to ``wait_s`` for ULFM to name it (then: none known)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            failed, world = comm.Get_failed(), MPI.COMM_WORLD.Get_group()
            ranks = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), world)
            failed.Free()
            world.Free()
        except MPI.Exception:
            return []
        if ranks or time.monotonic() > deadline:
            return sorted(r for r in ranks if r != MPI.UNDEFINED)
        time.sleep(0.05)


@contextmanager
def lost_ranks_named(comm: MPI.Comm, what: str) -> Iterator[None]:
    """A process failure in the block revokes ``comm`` (every rank blocked in it returns) and
    raises ``ProcessLostError`` naming the lost ranks and ``what`` was waited for."""
    try:
        yield
    except MPI.Exception as error:
        if not is_process_failure(error, comm):
            raise
        revoke(comm)
        lost = failed_ranks(comm)
        named = f"rank {', '.join(map(str, lost))} of MPI_COMM_WORLD" if lost else "a rank (not yet named by MPI)"
        raise ProcessLostError(f"rank {MPI.COMM_WORLD.Get_rank()}: {named} died during {what} "
                               f"({error.Get_error_string()}); this job does not recover in place: "
                               f"resume it from a checkpoint") from error


def watched(comm: MPI.Comm) -> Callable[[str], ContextManager[None]]:
    """A ``guard(what)`` for waits on ``comm``'s peers: under the deadline watchdog, a process
    failure revoking ``comm`` and named (``lost_ranks_named``)."""
    @contextmanager
    def guard(what: str) -> Iterator[None]:
        with lost_ranks_named(comm, what), watchdog.guard(what):
            yield
    return guard


def revoke(comm: MPI.Comm) -> None:
    """Revoke ``comm`` (ignoring that a peer already did): every rank blocked in it, or
    about to block, returns ``ERR_REVOKED`` instead of waiting for a rank that gave up."""
    try:
        comm.Revoke()
    except MPI.Exception:
        pass


def abandon(comm: MPI.Comm, requests: Iterable[MPI.Request]) -> None:
    """After a process failure: revoke ``comm`` so every pending request completes (with an
    error), then complete them, so no receive can later write into a reused buffer.

    Open MPI returns a failed request's error from ``MPI_Wait`` without freeing it; mpi4py
    frees a request object it drops, and an error that reaches a freed request ends the
    whole job ("Recv error after request freed"). So a request still live after its wait is
    kept, with its buffer, for the life of the process, as ``release`` keeps a revoked
    communicator."""
    revoke(comm)
    for request in requests:
        try:
            request.Wait()
        except MPI.Exception:
            pass
        if request:
            _ABANDONED.append(request)


def shrink_agreed(comm: MPI.Intracomm, before_shrink: Callable[[], None] = lambda: None
                  ) -> Tuple[MPI.Intracomm, int]:
    """Revoke ``comm``, shrink it to the survivors and agree; again while ranks keep failing.
    ``before_shrink`` runs after each revoke (fault injection kills a rank there). Returns the
    survivors' communicator (errors returned, not fatal) and the rounds it took; the
    intermediate communicators are released, ``comm`` is left to its owner."""
    current, rounds = comm, 0
    while True:
        rounds += 1
        revoke(current)
        before_shrink()
        try:
            survivors = current.Shrink()
        except MPI.Exception as error:
            if not is_process_failure(error):
                raise
            continue
        survivors.Set_errhandler(MPI.ERRORS_RETURN)
        if current is not comm:
            release(current)
        current = survivors
        try:
            current.Agree(1)
            return current, rounds
        except MPI.Exception as error:
            if not is_process_failure(error):
                raise


def agree_all(comm: MPI.Intracomm, ok: bool) -> bool:
    """True only if every rank says ``ok`` and no rank has failed; the same on every survivor."""
    try:
        return bool(comm.Agree(int(ok)))
    except MPI.Exception as error:
        if not is_process_failure(error, comm):
            raise
        return False


def restored_until_agreed(comm: MPI.Intracomm, restore: Callable[[MPI.Intracomm], T]) -> T:
    """Shrink ``comm`` to the survivors (``shrink_agreed``), ``restore(survivors)`` and commit
    it with one ``Agree``; again, from the start, while a rank fails during a round. ``restore``
    must change nothing it was given: only a committed round's result is returned."""
    while True:
        comm, _ = shrink_agreed(comm)
        try:
            restored, ok = restore(comm), True
        except MPI.Exception as error:
            if not is_process_failure(error, comm):
                raise
            revoke(comm)
            restored, ok = None, False
        if agree_all(comm, ok):
            return restored


def release(comm: MPI.Comm) -> None:
    """Free ``comm``, unless it is revoked: a revoked communicator is kept for the life of the
    process. Open MPI 5.0.11 completes a receive that had already matched on a revoked
    communicator (its cancel denied) with an error when the communicator is freed, and an error
    on a request already released ends the whole job ("Recv error after request freed"). One
    that refuses Free (its peers are gone) is dropped all the same."""
    try:
        if _is_revoked(comm):
            _REVOKED.append(comm)
            return
        comm.Free()
    except MPI.Exception:
        pass


def _is_revoked(comm: MPI.Comm) -> bool:
    try:
        return bool(comm.Is_revoked())
    except NotImplementedError:  # an MPI without ULFM: nothing is ever revoked
        return False


_REVOKED: List[MPI.Comm] = []
"""The revoked communicators ``release`` kept (a few per recovery)."""

_ABANDONED: List[MPI.Request] = []
"""The requests ``abandon`` could not complete (a few per recovery)."""


@contextmanager
def fatal_failures(what: str, comm: Callable[[], MPI.Comm]) -> Iterator[None]:
    """A process failure inside the block (judged against ``comm()``, the communicator in use
    when it is raised) ends the job at once with one clear error on every rank that sees it
    (``abort_job``), instead of raw MPI errors on some ranks and a wait until the deadline on
    others. For the changes of membership no recovery can take back: Open MPI 5.0.11's
    ``MPI_Comm_spawn`` never returns on its root once a parent died during it (a revoke does not
    interrupt it), and newcomers half merged in have no state to go back to."""
    try:
        yield
    except MPI.Exception as error:
        if not is_process_failure(error, comm()):
            raise
        world = MPI.COMM_WORLD
        print(f"hpcreduce: rank {world.Get_rank()}: a rank died during {what} ({error.Get_error_string()}), which "
              "cannot be recovered from: the job ends (relaunch it to resume from a checkpoint: --checkpoint-dir "
              "with --restarts)", file=sys.stderr, flush=True)
        abort_job(4)

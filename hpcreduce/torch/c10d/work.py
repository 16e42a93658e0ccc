"""c10d's ``Work``: one queued operation of a group, its torch Future, and the queue that runs them.

``Progress`` runs a group's operations in the order they were issued: on a communication thread of
its own where the rank has a spare core (``comm_thread.has_spare_core``, the DDP wrapper's decision),
else at once on the caller's thread. Each runs under the watchdog (``HPCREDUCE_DEADLINE``). After an
operation fails, every later one of the group fails with the same error without communicating (its
peers may be gone); an MPI process failure is worded with the ranks MPI reports lost.
"""
from __future__ import annotations

import threading
from collections import deque
from datetime import timedelta
from typing import Any, Callable, Deque, Optional, Tuple

import torch.distributed as dist
from mpi4py import MPI
from torch.futures import Future

from ...ft.watchdog import watchdog
from ...runtime.failures import is_process_failure, revoke
from ..comm_thread import has_spare_core


class LostRankError(RuntimeError):
    """A rank of the group died (ULFM reported it): this and every later operation of the group fail."""


class Work(dist.Work):
    """One operation: ``wait()`` raises its error, ``get_future()`` completes with its result."""

    def __init__(self, what: str, progress: "Progress") -> None:
        super().__init__()
        self.what, self.progress = what, progress
        self.error: Optional[BaseException] = None
        # A failure reaches the future by a callback that raises: a future given ``set_exception``
        # reads as a value to c10d's C++ side (DDP's reducer crashed reading it), one whose callback
        # raised carries a C++ error that DDP's backward rethrows.
        self._ran: Future = Future()
        self.future: Future = self._ran.then(self._outcome)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if self.progress.closed:
            raise RuntimeError(f"hpcreduce: {self.what} waited on after its process group was destroyed")
        self.progress.finish(self)
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        return self.future.done()

    def is_success(self) -> bool:
        return self.future.done() and self.error is None

    def exception(self) -> Optional[BaseException]:
        return self.error

    def get_future(self) -> Future:
        return self.future

    def result(self) -> Any:
        self.wait()
        return self.future.value()

    def _outcome(self, ran: Future) -> Any:
        if self.error is not None:
            raise self.error
        return ran.value()

    def _done(self, result: Any, error: Optional[BaseException]) -> None:
        self.error = error
        self._ran.set_result(result)


Job = Tuple[Work, Callable[[], Any]]


class Progress:
    """The ordered operations of one group, run on a thread (``threaded``) or at once."""

    def __init__(self, comm: Callable[[], MPI.Comm], threaded: Optional[bool] = None) -> None:
        import torch
        self.comm = comm
        self.threaded = has_spare_core(torch.get_num_threads()) if threaded is None else threaded
        self.failed: Optional[BaseException] = None
        self.closed = False
        self._jobs: Deque[Job] = deque()
        self._changed = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    def submit(self, what: str, run: Callable[[], Any]) -> Work:
        """A ``Work`` for ``run()`` (its result is the future's value), after those already submitted."""
        work = Work(what, self)
        if not self.threaded:
            self._run((work, run))
            return work
        with self._changed:
            self._jobs.append((work, run))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="hpcreduce-c10d", daemon=True)
                self._thread.start()
            self._changed.notify_all()
        return work

    def finish(self, work: Work) -> None:
        """Block until ``work`` ran."""
        with self._changed:
            while not work.future.done():
                self._changed.wait()

    def drain(self) -> None:
        """Block until every submitted operation ran."""
        with self._changed:
            while self._jobs or self._busy_work is not None:
                self._changed.wait()

    _busy_work: Optional[Work] = None

    def _serve(self) -> None:
        while True:
            with self._changed:
                while not self._jobs:
                    self._changed.wait()
                job = self._jobs.popleft()
                self._busy_work = job[0]
            self._run(job)
            with self._changed:
                self._busy_work = None
                self._changed.notify_all()

    def _run(self, job: Job) -> None:
        work, run = job
        result, error = None, self.failed
        if error is None:
            try:
                with watchdog.guard(f"torch.distributed {work.what} (hpcreduce backend)"):
                    result = run()
            except MPI.Exception as failure:
                error = self._worded(work.what, failure)
            except BaseException as failure:  # handed to whoever waits on the Work
                error = failure
        with self._changed:
            work._done(result, error)
            self._changed.notify_all()

    def _worded(self, what: str, failure: MPI.Exception) -> BaseException:
        """A process failure as ``LostRankError`` naming the lost ranks (kept: later operations
        fail with it; the communicator is revoked so no peer waits in it); other MPI errors as they are."""
        comm = self.comm()
        if not is_process_failure(failure, comm):
            return failure
        revoke(comm)
        self.failed = LostRankError(f"hpcreduce: {what} failed: {lost_ranks(comm)} of the process group died "
                                    f"({failure.Get_error_string()}); this group can no longer communicate "
                                    "(rebuild it over the survivors, e.g. with hpcreduce.elastic)")
        return self.failed


def lost_ranks(comm: MPI.Comm) -> str:
    """``rank 2`` / ``ranks 1, 3`` (their ``MPI_COMM_WORLD`` ranks) that ``comm`` knows failed."""
    try:
        failed = comm.Get_failed()
        ranks = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), MPI.COMM_WORLD.Get_group())
        failed.Free()
    except (MPI.Exception, NotImplementedError):
        return "a rank"
    if not ranks:
        return "a rank"
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} (world)"


class PointWork(Work):
    """A send or receive: started at once (``MPI_Isend``/``MPI_Irecv``, so two ranks that send to
    each other before receiving never wait on each other), completed at ``wait``; ``finish`` runs
    after (a receive into a non-contiguous tensor copies there)."""

    def __init__(self, what: str, progress: Progress, request: MPI.Request, result: Any,
                 finish: Callable[[], None] = lambda: None) -> None:
        super().__init__(what, progress)
        self.request, self.result_value, self.finish_call = request, result, finish
        self.status = MPI.Status()

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if not self.future.done():
            error = None
            try:
                with watchdog.guard(f"torch.distributed {self.what} (hpcreduce backend)"):
                    self.request.Wait(self.status)
                self.finish_call()
            except MPI.Exception as failure:
                error = self.progress._worded(self.what, failure)
            self._done(self.result_value, error)
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        if not self.future.done() and self.request.Test():
            self.wait()
        return self.future.done()

    def _source_rank(self) -> int:
        self.wait()
        return self.status.Get_source()

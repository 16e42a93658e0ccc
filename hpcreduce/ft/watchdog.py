"""A deadline on every blocking wait: a hung peer ends the job with a clear error.

ULFM reports dead processes, not hung ones (a stopped process, a livelocked node).
Code about to block arms the watchdog with what it waits for; a background thread
checks every ``poll`` seconds and, past the deadline, prints what timed out where and
aborts the whole job (``MPI_Abort``): a hung rank could not take part in a recovery,
so ending the job is the only answer that never hangs. Arming costs two assignments.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator, Optional

from ..runtime.settings import Setting, positive_number

DEADLINE = Setting("HPCREDUCE_DEADLINE", positive_number, 120.0, "a number of seconds above 0")


class Watchdog:
    """One per process; ``guard(what)`` arms it for the duration of a ``with`` block."""

    def __init__(self, deadline_s: Optional[float] = None, poll_s: float = 0.25):
        self.deadline_s = deadline_s  # None: HPCREDUCE_DEADLINE, read when first armed
        self.poll_s = poll_s
        self._what: Optional[str] = None
        self._since = 0.0
        self._thread: Optional[threading.Thread] = None

    @contextmanager
    def guard(self, what: str, deadline_s: Optional[float] = None) -> Iterator[None]:
        """Abort the job if the block is still running after the deadline."""
        if self._thread is None:
            self._start()
        if self.deadline_s is None:
            self.deadline_s = DEADLINE.value()
        outer = (self._what, self._since, self.deadline_s)
        self._since, self._what = time.monotonic(), what
        if deadline_s is not None:
            self.deadline_s = deadline_s
        try:
            yield
        finally:
            self._what, self._since, self.deadline_s = outer

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="hpcreduce-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while True:
            time.sleep(self.poll_s)
            what, since = self._what, self._since
            if what is not None and time.monotonic() - since > self.deadline_s:
                self._expire(what, time.monotonic() - since)

    def _expire(self, what: str, waited: float) -> None:
        from mpi4py import MPI
        from ..errors import DeadlineExceededError
        from ..runtime.failures import abort_job
        world = MPI.COMM_WORLD
        error = DeadlineExceededError(
            f"rank {world.Get_rank()} of {world.Get_size()} waited {waited:.1f} s in {what} "
            f"(deadline {self.deadline_s:g} s, HPCREDUCE_DEADLINE) and MPI reported no failure: "
            f"a peer is hung; aborting the job")
        print(f"hpcreduce: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        abort_job(3)


watchdog = Watchdog()

"""A deadline on every blocking wait: a hung peer ends the job with a clear error.

ULFM reports dead processes, not hung ones (a stopped process, a livelocked node).
Code about to block arms the watchdog with what it waits for (``runtime.failures.wait_all``
does, so every request the library completes is watched); a background thread checks every
``poll`` seconds and, past the deadline, prints what timed out where and aborts the whole job
(``MPI_Abort``): a hung rank could not take part in a recovery, so ending the job is the only
answer that never hangs. Each thread arms its own wait (a communication thread beside the
main one); arming costs a dictionary entry.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Dict, NoReturn, Optional, Tuple

from .launch import mark_aborted
from .settings import Setting, positive_number

DEADLINE = Setting("HPCREDUCE_DEADLINE", positive_number, 120.0, "a number of seconds above 0")
Armed = Tuple[str, float, Optional[float]]  # what, since, its own deadline (None: the watchdog's)
UNNAMED = "a wait for messages of peers"


class Watchdog:
    """One per process; ``guard(what)`` arms it for the duration of a ``with`` block."""

    def __init__(self, deadline_s: Optional[float] = None, poll_s: float = 0.25):
        self.deadline_s = deadline_s  # None: HPCREDUCE_DEADLINE, read when first armed
        self.poll_s = poll_s
        self._armed: Dict[int, Armed] = {}  # by thread: the innermost wait it is in
        self._thread: Optional[threading.Thread] = None
        self._starting = threading.Lock()

    def guard(self, what: Optional[str], deadline_s: Optional[float] = None) -> "Guard":
        """Abort the job if the ``with`` block is still running after the deadline (``deadline_s``,
        else an enclosing guard's, else the watchdog's); ``what`` None: the enclosing guard's name
        (a wait inside a named one), else ``UNNAMED``."""
        if self._thread is None:
            self._start()
        if self.deadline_s is None:
            self.deadline_s = DEADLINE.value()
        return Guard(self._armed, what, deadline_s)

    def _start(self) -> None:
        with self._starting:
            if self._thread is None:
                thread = threading.Thread(target=self._watch, name="hpcreduce-watchdog", daemon=True)
                thread.start()
                self._thread = thread

    def _watch(self) -> None:
        while True:
            time.sleep(self.poll_s)
            now = time.monotonic()
            for what, since, own in list(self._armed.values()):
                deadline = own if own is not None else self.deadline_s
                if deadline is not None and now - since > deadline:
                    self._expire(what, now - since, deadline)

    def _expire(self, what: str, waited: float, deadline: float) -> None:
        from mpi4py import MPI
        from ..errors import DeadlineExceededError
        world = MPI.COMM_WORLD
        error = DeadlineExceededError(
            f"rank {world.Get_rank()} of {world.Get_size()} waited {waited:.1f} s in {what} "
            f"(deadline {deadline:g} s, HPCREDUCE_DEADLINE) and MPI reported no failure: "
            f"a peer is hung; aborting the job")
        print(f"hpcreduce: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        abort_job(3)


class Guard:
    """One armed wait (a plain context manager: ``wait_all`` arms one per call)."""

    __slots__ = ("armed", "what", "deadline_s", "me", "outer")

    def __init__(self, armed: Dict[int, Armed], what: Optional[str], deadline_s: Optional[float]):
        self.armed, self.what, self.deadline_s = armed, what, deadline_s
        self.me: int = 0
        self.outer: Optional[Armed] = None

    def __enter__(self) -> None:
        self.me = me = threading.get_ident()
        self.outer = outer = self.armed.get(me)
        own = self.deadline_s if self.deadline_s is not None else (outer[2] if outer is not None else None)
        what = self.what if self.what is not None else (outer[0] if outer is not None else UNNAMED)
        self.armed[me] = (what, time.monotonic(), own)

    def __exit__(self, *exc: object) -> None:
        if self.outer is None:
            self.armed.pop(self.me, None)
        else:
            self.armed[self.me] = self.outer


def abort_job(code: int) -> NoReturn:
    """``MPI_Abort`` of the whole job with ``code``, the launcher told first (``mark_aborted``):
    Open MPI 5.0.11's mpirun has stayed up after an abort in a job that had spawned ranks."""
    from mpi4py import MPI
    mark_aborted(code)
    MPI.COMM_WORLD.Abort(code)
    raise SystemExit(code)  # not reached: Abort ends the process


watchdog = Watchdog()

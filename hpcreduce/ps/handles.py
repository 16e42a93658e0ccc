"""Requests in flight: a worker's non-blocking call returns a ``Handle`` to ``wait()`` on."""
from __future__ import annotations

from typing import Any, Callable, Iterable, List, NamedTuple, Optional, Tuple, Union

import numpy as np
from mpi4py import MPI

from ..runtime.context import Traffic
from ..runtime.failures import wait_all as wait_requests
from ..errors import PSRefusedError
from .protocol import ACCEPTED, HEADER_LEN, Rep, Status, refusal


class PushResult(NamedTuple):
    """How many shard pieces a push went to, and how many of them had already applied it."""

    pieces: int
    duplicates: int


class Part:
    """One request to one server: its buffers (header, payloads, reply payloads), its sends
    and reply receives (``requests``), the reply header, the reply payload bytes it expects
    (``received``) and, with key caching, ``resend``: the request again in full."""

    __slots__ = ("rank", "requests", "buffers", "reply", "received", "resend")

    def __init__(self, rank: int, buffers: List[Union[bytes, np.ndarray]]):
        self.rank, self.buffers = rank, buffers
        self.requests: List[MPI.Request] = []
        self.reply = np.zeros(HEADER_LEN, dtype=np.int64)
        self.received = 0
        self.resend: Optional[Callable[[], Part]] = None


class Handle:
    """One worker call in flight to one or more servers; ``wait()`` returns its result.

    ``wait`` completes every part before looking at the replies, so a refused part
    never leaves a receive posted (a part whose cached id list the server did not hold
    is sent again with its ids, once); it then raises ``PSRefusedError`` naming the
    servers and their reasons, or returns ``finish()``'s result. ``guard(what)`` wraps
    the blocking wait (the fault-tolerance watchdog). An MPI error (a failed server)
    leaves the handle unfinished, to be abandoned (``Worker.abandon``).
    """

    def __init__(self, what: str, parts: List[Part], finish: Callable[[List[Part]], Any],
                 traffic: Traffic, guard: Optional[Callable[[str], Any]] = None,
                 table: int = -1):
        self.what = what
        self.table = table
        self.parts = parts
        self._finish = finish
        self._traffic = traffic
        self._guard = guard
        self._outcome: Optional[Tuple[Any, Optional[PSRefusedError]]] = None

    def wait(self) -> Any:
        if self._outcome is None:
            self._outcome = self._complete()
        result, error = self._outcome
        if error is not None:
            raise error
        return result

    @property
    def requests(self) -> List[MPI.Request]:
        return [request for part in self.parts for request in part.requests]

    @property
    def done(self) -> bool:
        return self._outcome is not None

    def _complete(self) -> Tuple[Any, Optional[PSRefusedError]]:
        parts = self.parts
        if self._guard is None:
            self._wait_parts()
        else:
            with self._guard(f"waiting for the {self.what}"):
                self._wait_parts()
        received, problems = 0, []
        for part in parts:
            status = int(part.reply[Rep.STATUS])
            if status in ACCEPTED:
                received += part.received
            else:
                problems.append(f"server rank {part.rank}: {refusal(status, int(part.reply[Rep.DETAIL]))}")
        self._traffic.add(0, received)
        if problems:
            return None, PSRefusedError(f"{self.what} refused by " + "; ".join(problems))
        return self._finish(parts), None

    def _wait_parts(self) -> None:
        """Complete every part; a part whose id list the server did not hold goes again with its ids."""
        parts, unknown = self.parts, []
        for i, part in enumerate(parts):
            wait_requests(part.requests)
            if part.resend is not None and part.reply[Rep.STATUS] == Status.KEYS_UNKNOWN:
                unknown.append(i)
        for i in unknown:
            parts[i] = parts[i].resend()
        if unknown:
            wait_requests(self.requests)


def push_result(parts: List[Part]) -> PushResult:
    """A finished push's result, from its parts' replies."""
    return PushResult(len(parts), sum(int(part.reply[Rep.STATUS] == Status.DUPLICATE) for part in parts))


def wait_all(handles: List[Optional[Handle]]) -> List[Any]:
    """Wait for every handle (None skipped), then raise the first refusal, if any."""
    results, first_error = [], None
    for handle in handles:
        try:
            results.append(None if handle is None else handle.wait())
        except PSRefusedError as error:
            results.append(None)
            first_error = first_error or error
    if first_error is not None:
        raise first_error
    return results


def issue_all(starts: Iterable[Callable[[], Handle]]) -> List[Handle]:
    """Start every request; if one cannot start (bad input), finish those already
    started so no reply is left unreceived, then raise."""
    handles: List[Handle] = []
    try:
        for begin in starts:
            handles.append(begin())
    except Exception:
        try:
            wait_all(handles)
        except PSRefusedError:
            pass  # the input error is the one to report
        raise
    return handles

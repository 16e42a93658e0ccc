"""A colocated pull or push in flight: ``wait()`` completes it and returns {table: result}.

Every message of a call is posted when the call is made (on every rank, in call order), so
``wait`` posts nothing and handles may be waited for in any order. A pull's handle holds
the rows' return ``Ialltoallv``; ``wait`` scatters the rows back to the ids asked for. A
push's handle holds one ``Ialltoallv`` of items (an id, then its gradient); ``wait`` sums each id's gradients
across senders in rank order (bit-reproducible, as a server sums its workers' pushes in
slot order) and applies them once, to the owner's shard and to the replica.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ...errors import PSInputError
from ...runtime.failures import wait_all
from ..handles import PushResult
from ..tables import ParamSpec
from .routes import Route, block_starts
from .store import ShardStore


ID_BYTES = 8  # an int64 id before each pushed gradient row
Collective = Callable[[Callable[[], Any]], Any]  # runs a step of a call, handling a process failure


class PullHandle:
    """Rows coming back for the unique ids of each table; ``wait()`` -> {name: rows aligned with ids}."""

    def __init__(self, specs: Sequence[ParamSpec], tables: Dict[int, Tuple[np.ndarray, np.ndarray]],
                 route: Route, row_bytes: np.ndarray, request: MPI.Request, received: np.ndarray,
                 collective: Collective):
        self.specs, self.tables, self.route, self.row_bytes = specs, tables, route, row_bytes
        self.collective = collective
        self.requests, self.received = [request], received
        self._result: Optional[Dict[str, np.ndarray]] = None
        self.abandoned = False

    @property
    def done(self) -> bool:
        return self._result is not None or self.abandoned

    def wait(self) -> Dict[str, np.ndarray]:
        interrupted(self)
        if self._result is None:
            self.collective(lambda: wait_all(self.requests))
            self._result = self._scatter()
        return self._result

    def _scatter(self) -> Dict[str, np.ndarray]:
        route, starts, out = self.route, block_starts(self.route.counts, self.row_bytes), {}
        for t, (unique, inverse) in self.tables.items():
            spec, width = self.specs[t], int(self.row_bytes[t])
            rows = np.empty((len(unique),) + tuple(spec.shape[1:]), spec.dtype)
            flat = rows.reshape(-1).view(np.uint8).reshape(len(unique), width)
            for dest in range(route.counts.shape[0]):
                count = int(route.counts[dest, t])
                if count:
                    start = int(starts[dest, t])
                    flat[route.items(dest, t)] = self.received[start:start + count * width].reshape(count, width)
            out[spec.name] = rows[inverse]
        return out


class PushHandle:
    """Gradients on their way to owners and replicas; ``wait()`` -> {name: ``PushResult``}:
    ``pieces``, the ranks this rank's rows of the table went to, and ``duplicates``, how many
    of the table's updates this rank's shard and replica refused as already applied (a step
    pushed again after a recovery)."""

    def __init__(self, specs: Sequence[ParamSpec], tables: Sequence[int], step: int, route: Route,
                 incoming: np.ndarray, row_bytes: np.ndarray, request: MPI.Request,
                 received: np.ndarray, stores: Sequence[ShardStore],
                 collective: Collective, commit: Callable[[], None]):
        self.specs, self.tables, self.step, self.route = specs, list(tables), step, route
        self.incoming, self.row_bytes, self.requests = incoming, row_bytes, [request]
        self.received, self.stores, self.commit = received, stores, commit
        self.collective = collective
        self._result: Optional[Dict[str, PushResult]] = None
        self.abandoned = False

    @property
    def done(self) -> bool:
        return self._result is not None or self.abandoned

    def wait(self) -> Dict[str, PushResult]:
        interrupted(self)
        if self._result is None:
            self.collective(lambda: wait_all(self.requests))
            self.commit()
            self._result = self._apply()
        return self._result

    def _apply(self) -> Dict[str, PushResult]:
        tables = len(self.specs)
        starts = block_starts(self.incoming, ID_BYTES + self.row_bytes)
        duplicates = {t: 0 for t in self.tables}
        for segment, store in enumerate(self.stores):
            for t in self.tables:
                s = segment * tables + t
                parts = [self._part(t, s, source, starts)
                         for source in range(self.incoming.shape[0]) if self.incoming[source, s]]
                if parts:
                    ids, grads = summed(parts)
                    duplicates[t] += not store.apply(t, ids, grads, self.step)
        return {self.specs[t].name: PushResult(int(np.count_nonzero(self.route.counts[:, t])), duplicates[t])
                for t in self.tables}

    def _part(self, t: int, s: int, source: int, starts: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """The ids and gradients ``source`` sent in segment ``s`` (table ``t``): items of an id's
        8 bytes followed by its gradient's."""
        spec, count, width = self.specs[t], int(self.incoming[source, s]), int(self.row_bytes[s])
        first = int(starts[source, s])
        items = self.received[first:first + count * (ID_BYTES + width)].reshape(count, ID_BYTES + width)
        ids = np.ascontiguousarray(items[:, :ID_BYTES]).view(np.int64).reshape(count)
        grads = np.ascontiguousarray(items[:, ID_BYTES:]).view(spec.dtype)
        return ids, grads.reshape((count,) + tuple(spec.shape[1:]))


def interrupted(handle) -> None:
    """``PSInputError`` for a handle whose call a process failure interrupted (its requests were
    completed with an error by ``ColocatedTables.recover``): its rows or push never arrived."""
    if handle.abandoned:
        raise PSInputError("this call was interrupted by a process failure and abandoned in recover(): "
                           "make it again")


def summed(parts: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Tuple[np.ndarray, np.ndarray]:
    """Sorted unique ids and their gradients summed over ``parts`` (each: sorted unique ids,
    gradients), added part after part from zero: the order ``updates.sum_rows`` adds in, so the
    same bits, without its unbuffered ``np.add.at`` (ids are unique within a part)."""
    if len(parts) == 1:
        return parts[0]
    ids = np.sort(np.concatenate([part_ids for part_ids, _ in parts]), kind="stable")  # merges the sorted runs
    ids = ids[np.concatenate([[True], ids[1:] != ids[:-1]])]
    total = np.zeros((len(ids),) + parts[0][1].shape[1:], parts[0][1].dtype)
    for part_ids, grads in parts:
        total[np.searchsorted(ids, part_ids)] += grads
    return ids, total

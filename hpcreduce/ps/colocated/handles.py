"""A colocated pull or push in flight: ``wait()`` completes it and returns {table: result}.

Every send of a call is posted when the call is made (on every rank, in call order); handles
may be waited for in any order (a push's ``wait`` first completes the pushes made before it,
so each receives its own messages). A pull's handle holds the rows' return ``Ialltoallv``; ``wait`` scatters the rows back to the ids asked for. A
push's handle holds the sends of its ids and gradients; ``wait`` receives every
rank's (pushes complete in the order they were made), checks them, sums each id's gradients
across senders in rank order (``updates.sum_rows``, as a server sums its workers' pushes in
slot order: the same bits) and applies them once, to the owner's shard and to the replica.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ...errors import PSInputError
from ...runtime.failures import wait_all
from ..handles import PushResult
from ..kernels import kernel
from ..optimizers import FUSED_DTYPES
from ..tables import ParamSpec
from ..updates import sum_rows
from .flat import move, natural_to_wire, offsets, regroup, word
from .routes import Route
from .store import ShardStore


ID_BYTES = 8  # an int64 id
MERGE_RUNS = kernel("rows", "merge_runs")
Collective = Callable[[Callable[[], Any]], Any]  # runs a step of a call, handling a process failure


class PullHandle:
    """Rows coming back for the unique ids of each table; ``wait()`` -> {name: rows aligned with ids}."""

    def __init__(self, specs: Sequence[ParamSpec], tables: Dict[int, Tuple[np.ndarray, np.ndarray]],
                 route: Route, row_bytes: np.ndarray, requests: List[MPI.Request], received: np.ndarray,
                 collective: Collective, wire_ids: np.ndarray, layout: object):
        self.specs, self.tables, self.route, self.row_bytes = specs, tables, route, row_bytes
        self.unit = word(row_bytes)
        self.collective = collective
        self.requests, self.received, self.wire_ids = requests, received, wire_ids
        self.layout = layout  # the layout routed on (a push may reuse the route while it holds)
        self._result: Optional[Dict[str, np.ndarray]] = None
        self.arrived = self.abandoned = False

    @property
    def done(self) -> bool:
        return self.arrived or self.abandoned

    def wait(self) -> Dict[str, np.ndarray]:
        if self._result is None:
            self._arrive()
            self._result = self._scatter()
        return self._result

    def wait_stacked(self, names: Sequence[str]) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """Every table's rows as they arrived (one rows x width array, no copy: row k is the
        k-th unique id sent, ``wire_ids[k]``) and, for tables ``names`` stacked in that order,
        each asked id's row in it; None (use ``wait``) unless ``names`` are this pull's tables and
        their rows share one width and dtype."""
        by_name = {self.specs[t].name: t for t in self.tables}
        tables = [by_name.get(name) for name in names]
        if sorted(t for t in tables if t is not None) != sorted(self.tables) or len(tables) != len(self.tables) or \
                len({(np.dtype(self.specs[t].dtype), tuple(self.specs[t].shape[1:])) for t in tables}) != 1:
            return None
        self._arrive()
        spec, route = self.specs[tables[0]], self.route
        where = np.empty(len(route.order), np.int64)  # natural item -> its wire position (its row)
        where[route.order] = np.arange(len(route.order))
        asked = [route.offsets[t] + self.tables[t][1].reshape(-1) for t in tables]
        rows = self.received.view(spec.dtype).reshape((len(route.order),) + tuple(spec.shape[1:]))
        return rows, where[np.concatenate(asked)]

    def _arrive(self) -> None:
        interrupted(self)
        if not self.arrived:
            self.collective(lambda: wait_all(self.requests))
            self.arrived = True

    def _scatter(self) -> Dict[str, np.ndarray]:
        """Every row asked for (repeats included) moved from where its unique id's row arrived,
        for all tables in one compiled pass; each table's rows are a view of the result."""
        route, tables = self.route, sorted(self.tables)
        where = np.empty(len(route.order), np.int64)  # natural item -> its row's offset in received
        where[route.order] = natural_to_wire(route.order, route.counts.sum(0), self.row_bytes)[1]
        asked = [route.offsets[t] + self.tables[t][1].reshape(-1) for t in tables]
        counts = np.array([len(a) for a in asked], np.int64)
        width = np.repeat(self.row_bytes[tables], counts)
        rows = np.empty(int(width.sum()), np.uint8)
        move(self.received, where[np.concatenate(asked)] if asked else where[:0], rows, offsets(width), width,
             self.unit)
        starts, out = offsets(counts * self.row_bytes[tables]), {}
        for t, first, count in zip(tables, starts.tolist(), counts.tolist()):
            spec = self.specs[t]
            piece = rows[first:first + count * int(self.row_bytes[t])].view(spec.dtype)
            out[spec.name] = piece.reshape(self.tables[t][1].shape + tuple(spec.shape[1:]))
        return out


class PushHandle:
    """Gradients on their way to owners and replicas; ``wait()`` -> {name: ``PushResult``}:
    ``pieces``, the ranks this rank's rows of the table went to, and ``duplicates``, how many
    of the table's updates this rank's shard and replica refused as already applied (a step
    pushed again after a recovery)."""

    def __init__(self, specs: Sequence[ParamSpec], tables: Sequence[int], step: int, route: Route,
                 row_bytes: np.ndarray, requests: List[MPI.Request], receive: Callable[[], Tuple[np.ndarray, np.ndarray]],
                 stores: Sequence[ShardStore], collective: Collective, commit: Callable[[], None],
                 settle: Callable[["PushHandle"], None]):
        self.specs, self.tables, self.step, self.route = specs, list(tables), step, route
        self.row_bytes, self.requests, self.receive = row_bytes, requests, receive
        self.unit = word(row_bytes)
        self.stores, self.commit, self.settle = stores, commit, settle
        self.collective = collective
        self.incoming = self.received = None
        self._result: Optional[Dict[str, PushResult]] = None
        self.error: Optional[PSInputError] = None
        self.abandoned = False

    @property
    def done(self) -> bool:
        return self._result is not None or self.abandoned or self.error is not None

    def wait(self) -> Dict[str, PushResult]:
        """Complete this push and those made before it, in order (``settle``); its results."""
        self.settle(self)
        interrupted(self)
        if self.error is not None:
            raise self.error
        return self._result

    def complete(self) -> None:
        """Receive every rank's items for this push, check, commit and apply them (called in the
        order the pushes were made, so each receives its own messages)."""
        try:
            self.incoming, self.received = self.collective(self.receive)
        except PSInputError as error:
            self.error = error
            raise
        self.collective(lambda: wait_all(self.requests))
        self.commit()
        self._result = self._apply()

    def _apply(self) -> Dict[str, PushResult]:
        """Regroup the ids and gradients by segment (whole blocks, senders in rank order), sum
        each table's gradients as a server sums its workers' (``updates.sum_rows``: the same
        bits) and apply them once to the shard, and to the replica."""
        tables, incoming = len(self.specs), self.incoming
        ids = regroup(self.received[0], incoming * ID_BYTES).view(np.int64)
        grads = regroup(self.received[1], incoming * self.row_bytes)
        first_id, first_grad = offsets(incoming.sum(0)), offsets((incoming * self.row_bytes).sum(0))
        duplicates = {t: 0 for t in self.tables}
        for s, summed_ids, summed_grads, came in self._summed(ids, grads, first_id, first_grad):
            t = s % tables
            items = ids[first_id[s]:first_id[s] + int(incoming[:, s].sum())]
            duplicates[t] += not self.stores[s // tables].apply(t, summed_ids, summed_grads, self.step,
                                                                None if came is None else (items, came))
        return {self.specs[t].name: PushResult(int(np.count_nonzero(self.route.counts[:, t])), duplicates[t])
                for t in self.tables}

    def _summed(self, ids: np.ndarray, grads: np.ndarray, first_id: np.ndarray, first_grad: np.ndarray
                ) -> Iterator[Tuple[int, np.ndarray, np.ndarray, Optional[np.ndarray]]]:
        """(segment, its ids summed, their gradients, where each first came among the segment's
        items or None) for every segment that received items: every segment in one compiled
        merge of the senders' sorted runs when the tables share one float dtype, else
        ``updates.sum_rows`` segment by segment (the same sums)."""
        tables, incoming = len(self.specs), self.incoming
        dtypes = {np.dtype(spec.dtype) for spec in self.specs}
        shapes = [tuple(self.specs[s % tables].shape[1:]) for s in range(incoming.shape[1])]
        if len(dtypes) == 1 and dtypes <= set(FUSED_DTYPES):
            dtype = dtypes.pop()
            flat = grads.view(dtype)
            out_ids, out_grads, came = np.empty_like(ids), np.empty_like(flat), np.empty_like(ids)
            sums = np.zeros(incoming.shape[1], np.int64)
            widths = self.row_bytes // dtype.itemsize
            MERGE_RUNS(ids, flat, np.ascontiguousarray(incoming), first_id, first_grad // dtype.itemsize, widths,
                       out_ids, out_grads, sums, came)
            for s in np.flatnonzero(sums).tolist():
                n, at, row = int(sums[s]), int(first_id[s]), int(first_grad[s]) // dtype.itemsize
                yield s, out_ids[at:at + n], out_grads[row:row + n * int(widths[s])].reshape((n,) + shapes[s]), \
                    came[at:at + n]
            return
        for s in range(incoming.shape[1]):
            count = int(incoming[:, s].sum())
            if not count:
                continue
            first = int(first_grad[s])
            rows = grads[first:first + count * int(self.row_bytes[s])].view(self.specs[s % tables].dtype)
            rows = rows.reshape((count,) + shapes[s])
            bounds = np.cumsum(incoming[:, s])[:-1]
            parts = [(i, g) for i, g in zip(np.split(ids[first_id[s]:first_id[s] + count], bounds),
                                            np.split(rows, bounds)) if len(i)]
            yield (s, *sum_rows(parts), None)


def interrupted(handle) -> None:
    """``PSInputError`` for a handle whose call a process failure interrupted (its requests were
    completed with an error by ``ColocatedTables.recover``): its rows or push never arrived."""
    if handle.abandoned:
        raise PSInputError("this call was interrupted by a process failure and abandoned in recover(): "
                           "make it again")

"""The worker's side of the parameter server, with ps-lite's KVWorker surface.

    worker.pull(table) / push(table, grad)                 dense tables, whole tensors
    worker.pull_rows(table, ids) / push_rows(table, ids, grads)   sparse tables, some rows
    worker.clock()                                         at the end of every step
    worker.*_async(...) -> Handle; handle.wait()           non-blocking forms
    worker.release()                                       done: the servers may stop
    worker.reopen()                                        (rare) a new session after release

A call is checked here first (table, shape, dtype, writable output, ids; a worker
already released) and raises ``PSInputError`` before anything is sent, so a bad call
leaves the worker and the servers as they were. It then goes to the shards holding
the table's pieces or rows (``Layout.placement``), all at once; the reply receives are
posted first, straight into the result (dense pulls land in the output array, no copy). Each request carries the
worker's clock, which is a push's step: the pair (slot, step) lets a server refuse a
duplicate, so push at most once per table per step.
Cost per call: one 64 B header to each shard involved, the payload, and a 64 B reply.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..errors import PSInputError
from ..runtime.context import Traffic
from ..runtime.failures import abandon
from . import protocol
from .handles import Handle, Part, PushResult, push_result
from .layout import Layout
from .protocol import TAG_PAYLOAD, TAG_REPLY, TAG_REQUEST, Op
from .tables import ParamSpec, row_width


class Worker:
    """One worker rank's client of the servers of ``layout``.

    ``slot`` is the worker's stable name in every request (``Layout``);
    ``index`` its position among the live workers (its share of a batch).
    ``guard(what)`` wraps every blocking wait (the fault-tolerance watchdog).
    """

    def __init__(self, comm: MPI.Intracomm, layout: Layout, traffic: Optional[Traffic] = None, *,
                 guard: Callable[[str], Any] = lambda what: nullcontext(), clock: int = 0):
        self.comm, self.layout = comm, layout
        self.slot = layout.slot_of(comm.Get_rank())
        self.index = layout.worker_index(comm.Get_rank())
        if self.slot < 0:
            raise PSInputError(f"rank {comm.Get_rank()} is a server in this layout, not a worker")
        self.traffic = traffic if traffic is not None else Traffic()
        self.guard = guard
        self.clock_value = clock
        self._unanswered: List[Tuple[MPI.Request, np.ndarray]] = []
        self._open: List[Handle] = []
        self.released = False

    # -- dense tables ------------------------------------------------------------------
    def pull_async(self, table: str, out: Optional[np.ndarray] = None) -> Handle:
        """Start reading dense ``table`` whole, into ``out`` if given."""
        t, spec = self._table(table, sparse=False)
        if out is None:
            out = np.empty(spec.shape, dtype=spec.dtype)
        else:
            _check_array(f"pull of {table!r}: out", out, spec.shape, spec.dtype, output=True)
        flat = out.reshape(-1)
        parts = []
        for piece in self.layout.placement.pieces[t]:
            rank = self.layout.shard_ranks[piece.shard]
            header = self._header(Op.PULL, t, piece.size, spec)
            parts.append(self._request(rank, header, [], [flat[piece.start:piece.stop]]))
        return self._handle(f"pull of table {table!r}", parts, lambda _: out, t)

    def pull(self, table: str, out: Optional[np.ndarray] = None) -> np.ndarray:
        return self.pull_async(table, out).wait()

    def push_async(self, table: str, grad: np.ndarray) -> Handle:
        """Start sending dense ``table``'s gradient (whole tensor) for this step."""
        t, spec = self._table(table, sparse=False)
        _check_array(f"push to {table!r}: gradient", grad, spec.shape, spec.dtype)
        flat = np.ascontiguousarray(grad).reshape(-1)
        parts = []
        for piece in self.layout.placement.pieces[t]:
            rank = self.layout.shard_ranks[piece.shard]
            header = self._header(Op.PUSH, t, piece.size, spec)
            parts.append(self._request(rank, header, [flat[piece.start:piece.stop]], []))
        return self._handle(f"push to table {table!r} at step {self.clock_value}", parts, push_result, t)

    def push(self, table: str, grad: np.ndarray) -> PushResult:
        return self.push_async(table, grad).wait()

    # -- sparse tables -----------------------------------------------------------------
    def pull_rows_async(self, table: str, ids) -> Handle:
        """Start reading rows ``ids`` of sparse ``table``; the result is aligned with ids."""
        t, spec = self._table(table, sparse=True)
        ids = checked_ids(f"pull_rows of {table!r}", ids, spec.shape[0])
        out = np.empty((len(ids),) + tuple(spec.shape[1:]), dtype=spec.dtype)
        groups = self._by_shard(t, ids)
        parts = []
        for rank, where in groups:
            header = self._header(Op.PULL_ROWS, t, len(where), spec)
            # one shard holding every row: its reply lands in ``out`` directly
            rows = out if len(groups) == 1 else np.empty((len(where),) + out.shape[1:], dtype=spec.dtype)
            parts.append(self._request(rank, header, [ids[where]], [rows]))

        def scatter(done: List[Part]) -> np.ndarray:
            if len(done) > 1:
                for part, (_, where) in zip(done, groups):
                    out[where] = part.buffers[-1]
            return out
        return self._handle(f"pull_rows of table {table!r}", parts, scatter, t)

    def pull_rows(self, table: str, ids) -> np.ndarray:
        return self.pull_rows_async(table, ids).wait()

    def push_rows_async(self, table: str, ids, grads: np.ndarray) -> Handle:
        """Start sending the gradients of rows ``ids`` (unique) of sparse ``table``."""
        t, spec = self._table(table, sparse=True)
        ids = checked_ids(f"push_rows to {table!r}", ids, spec.shape[0])
        _check_array(f"push_rows to {table!r}: gradients", grads,
                     (len(ids),) + tuple(spec.shape[1:]), spec.dtype)
        order = np.argsort(ids, kind="stable")
        ids, grads = ids[order], np.ascontiguousarray(grads[order])
        if np.any(ids[1:] == ids[:-1]):
            raise PSInputError(f"push_rows to {table!r}: ids must be unique "
                               f"(sum the gradients of repeated rows)")
        parts = []
        for rank, where in self._by_shard(t, ids):
            header = self._header(Op.PUSH_ROWS, t, len(where), spec)
            parts.append(self._request(rank, header, [ids[where], grads[where]], []))
        return self._handle(f"push_rows to table {table!r} at step {self.clock_value}", parts,
                            push_result, t)

    def push_rows(self, table: str, ids, grads: np.ndarray) -> PushResult:
        return self.push_rows_async(table, ids, grads).wait()

    # -- clock and end -----------------------------------------------------------------
    def clock(self) -> int:
        """End this step: tell every server this worker's clock moved on; return it."""
        self._check_not_released("clock()")
        self.clock_value += 1
        self._tell_servers(Op.CLOCK)
        return self.clock_value

    def release(self) -> None:
        """Tell every server this worker is done (it stops counting in consistency);
        a server's ``serve()`` returns once every worker has released it. The worker
        takes no call after it (``PSInputError``)."""
        self._check_not_released("release()")
        self.released = True
        self._tell_servers(Op.RELEASE)
        with self.guard(f"worker slot {self.slot} releasing the servers"):
            MPI.Request.Waitall([request for request, _ in self._unanswered])
        self._unanswered.clear()

    def reopen(self) -> None:
        """Take calls again after ``release()``, for servers that ``serve()`` another
        session (the benchmarks do); without it a released worker refuses every call."""
        self.released = False

    def abandon(self) -> None:
        """After a process failure: revoke the communicator and complete every request
        still in flight (with an error), so no late receive lands in a reused buffer."""
        requests = [request for handle in self._open if not handle.done for request in handle.requests]
        abandon(self.comm, requests + [request for request, _ in self._unanswered])
        self._open.clear()
        self._unanswered.clear()

    # -- internals ---------------------------------------------------------------------
    def _check_not_released(self, call: str) -> None:
        if self.released:
            raise PSInputError(f"{call} on worker slot {self.slot} (rank {self.comm.Get_rank()}) after its "
                               f"release(): a released worker sends nothing more")

    def _table(self, name: str, *, sparse: bool) -> Tuple[int, ParamSpec]:
        """The id and spec of table ``name`` (every call starts here, so it also refuses a
        released worker)."""
        self._check_not_released(f"{'pull_rows/push_rows' if sparse else 'pull/push'} of {name!r}")
        t = self.layout.table_ids.get(name) if isinstance(name, str) else None
        if t is None:
            known = ", ".join(repr(s.name) for s in self.layout.specs)
            raise PSInputError(f"unknown table {name!r}; the tables are {known}")
        spec = self.layout.specs[t]
        if spec.sparse != sparse:
            use = "pull_rows/push_rows" if spec.sparse else "pull/push"
            raise PSInputError(f"table {name!r} is {'sparse' if spec.sparse else 'dense'}: use {use}")
        return t, spec

    def _handle(self, what: str, parts: List[Part], finish, table: int) -> Handle:
        handle = Handle(what, parts, finish, self.traffic, self.guard, table)
        self._open = [h for h in self._open if not h.done]
        self._open.append(handle)
        return handle

    def _header(self, op: Op, table: int, count: int, spec: ParamSpec) -> np.ndarray:
        width = row_width(spec) if spec.sparse else 1
        return protocol.request(op, table, self.slot, self.clock_value, count,
                                protocol.dtype_code(spec.dtype), width)

    def _request(self, rank: int, header: np.ndarray, payloads: List[np.ndarray],
                 into: List[np.ndarray]) -> Part:
        """Post the reply receives from ``rank`` (header, then ``into``), then send it the
        request: a receive that cannot be posted leaves nothing sent."""
        self._retire_unanswered()
        part = Part(rank, [], [header, *payloads, *into])
        part.requests.append(self.comm.Irecv(part.reply, rank, TAG_REPLY))
        for buffer in into:
            part.requests.append(self.comm.Irecv(buffer, rank, TAG_REPLY))
            part.received += buffer.nbytes
        part.requests.append(self.comm.Isend(header, rank, TAG_REQUEST))
        for payload in payloads:
            part.requests.append(self.comm.Isend(payload, rank, TAG_PAYLOAD))
        self.traffic.add(sum(p.nbytes for p in payloads), 0)
        return part

    def _by_shard(self, table: int, ids: np.ndarray) -> List[Tuple[int, np.ndarray]]:
        """(server rank, positions in ids) for each shard owning some of ``ids``."""
        if not len(ids):
            return []
        owners = self.layout.placement.row_owners(table, ids)
        order = np.argsort(owners, kind="stable")
        keys, starts = np.unique(owners[order], return_index=True)
        groups = np.split(order, starts[1:])
        return [(self.layout.shard_ranks[int(k)], g) for k, g in zip(keys, groups)]

    def _tell_servers(self, op: Op) -> None:
        self._retire_unanswered()
        for rank in self.layout.shard_ranks.values():
            header = protocol.request(op, 0, self.slot, self.clock_value)
            self._unanswered.append((self.comm.Isend(header, rank, TAG_REQUEST), header))

    def _retire_unanswered(self) -> None:
        if self._unanswered:
            done = set(MPI.Request.Testsome([request for request, _ in self._unanswered]) or ())
            self._unanswered = [entry for i, entry in enumerate(self._unanswered) if i not in done]


def _check_array(what: str, array, shape, dtype, *, output: bool = False) -> None:
    """``array`` is a numpy array of ``shape`` and ``dtype``; an ``output`` one is also
    C-contiguous and writable (replies are received into it)."""
    if not isinstance(array, np.ndarray):
        raise PSInputError(f"{what} must be a numpy array, got {type(array).__name__}")
    if tuple(array.shape) != tuple(shape):
        raise PSInputError(f"{what} has shape {tuple(array.shape)}, the table needs {tuple(shape)}")
    if array.dtype != np.dtype(dtype):
        raise PSInputError(f"{what} has dtype {array.dtype}, the table needs {np.dtype(dtype)}")
    if output and not array.flags.c_contiguous:
        raise PSInputError(f"{what} must be C-contiguous")
    if output and not array.flags.writeable:
        raise PSInputError(f"{what} is read-only; the pulled values are written into it")


def checked_ids(what: str, ids, rows: int) -> np.ndarray:
    """``ids`` as int64, if they are a 1-D integer array of row ids in [0, rows); an id out
    of range is reported as given (checked before the conversion, which would wrap it)."""
    try:
        array = np.asarray(ids)
    except (ValueError, TypeError, OverflowError) as err:
        raise PSInputError(f"{what}: ids must be a one-dimensional integer array ({err})") from None
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise PSInputError(f"{what}: ids must be a one-dimensional integer array, "
                           f"got dtype {array.dtype} and shape {array.shape}")
    bad = array[array >= rows] if array.dtype.kind == "u" else array[(array < 0) | (array >= rows)]
    if bad.size:
        raise PSInputError(f"{what}: row id {int(bad[0])} out of range [0, {rows})")
    return array.astype(np.int64, copy=False)

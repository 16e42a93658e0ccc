"""The worker's side of the parameter server, with ps-lite's KVWorker surface.

    worker.pull(table) / push(table, grad)                 dense tables, whole tensors
    worker.pull_rows(table, ids) / push_rows(table, ids, grads)   sparse tables, some rows
    worker.pull_rows_many_async({table: ids}) / push_rows_many_async({table: (ids, grads)})
                                                           several tables, one request per server
    worker.clock() at the end of every step; worker.*_async(...) -> Handle; handle.wait()
    worker.release(): done, the servers may stop; worker.reopen(): (rare) a new session after release

A call is checked here first (table, shape, dtype, writable output, ids; a worker already
released) and raises ``PSInputError`` before anything is sent, so a bad call leaves the worker
and the servers as they were (a device (cupy) array is copied to the host first). It then goes
to the shards holding the table's pieces or rows (``Layout.placement``), all at once; each reply
lands in the result (a dense pull in the output array, no copy). A request carries the worker's
clock, a push's step: (slot, step) lets a server refuse a duplicate, so push at most once per
table per step. Cost per call: one 72 B header to each shard involved, the payload, a 72 B reply.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

import numpy as np
from mpi4py import MPI

from ..arrays import is_device_array, to_host
from ..errors import PSInputError
from ..runtime.context import Traffic
from ..runtime.failures import abandon, wait_all
from . import multi_table, protocol
from .handles import Handle, Part, PushResult, push_result
from .client_checks import check_array, checked_ids, sorted_push_rows, table_rows
from .layout import Layout
from .key_cache import SentKeys
from .protocol import TAG_PAYLOAD, TAG_REPLY, TAG_REQUEST, Op
from .wire_cast import WireTable, by_shard, on_wire, wire_table


class Worker:
    """One worker rank's client of the servers of ``layout``.

    ``slot`` is the worker's stable name in every request (``Layout``); ``index`` its position among
    the live workers (its share of a batch). ``guard(what)`` wraps every blocking wait (the watchdog;
    None: none); ``clock``: the step it starts at; ``wire_dtype`` float16: values travel as float16
    (the servers keep and update their own dtype), None: as stored.
    """

    def __init__(self, comm: MPI.Intracomm, layout: Layout, traffic: Optional[Traffic] = None, *,
                 guard: Optional[Callable[[str], Any]] = None, clock: int = 0,
                 wire_dtype: Optional[np.dtype] = None):
        self.comm, self.layout = comm, layout
        self.slot = layout.slot_of(comm.Get_rank())
        self.index = layout.worker_index(comm.Get_rank())
        if self.slot < 0:
            raise PSInputError(f"rank {comm.Get_rank()} is a server in this layout, not a worker")
        self.traffic = traffic if traffic is not None else Traffic()
        self.guard = guard
        self.clock_value = clock
        self.sent_keys = SentKeys()
        self._tables: Dict[str, WireTable]  # by name, worked out on first use (by the wire_dtype setter)
        self.wire_dtype = wire_dtype
        self._unanswered: List[Tuple[MPI.Request, object]] = []  # sends no reply answers, with their buffers
        self._ended: Set[int] = set()  # server ranks where this step already ended (PUSH_PULL_END)
        self._open: List[Handle] = []
        self.released = False

    @property
    def wire_dtype(self) -> Optional[np.dtype]:
        return self._wire_dtype

    @wire_dtype.setter
    def wire_dtype(self, wanted: Optional[np.dtype]) -> None:
        """The dtype values travel in from the next call on (the tables are worked out again)."""
        self._wire_dtype, self._tables = wanted, {}

    # -- dense tables ------------------------------------------------------------------
    def pull_async(self, table: str, out: Optional[np.ndarray] = None) -> Handle:
        """Start reading dense ``table`` whole, into ``out`` if given."""
        return self._dense(Op.PULL, self._table(table, sparse=False), None, out, f"pull of table {table!r}")

    def pull(self, table: str, out: Optional[np.ndarray] = None) -> np.ndarray:
        return self.pull_async(table, out).wait()

    def push_async(self, table: str, grad: np.ndarray) -> Handle:
        """Start sending dense ``table``'s gradient (whole tensor) for this step."""
        wt = self._table(table, sparse=False)
        flat = self._dense_gradient(table, wt, grad)
        parts = [self._request(rank, self._header(Op.PUSH, wt, stop - start), [flat[start:stop]], [])
                 for rank, start, stop in wt.pieces]
        return self._handle(f"push to table {table!r} at step {self.clock_value}", parts, push_result, wt.table)

    def push(self, table: str, grad: np.ndarray) -> PushResult:
        return self.push_async(table, grad).wait()

    def push_pull_async(self, table: str, grad: np.ndarray, out: Optional[np.ndarray] = None, *,
                        ends_step: bool = False) -> Handle:
        """Start ps-lite's fused push-pull of dense ``table``: this step's gradient goes out
        and the values come back in the same round trip, read at the next clock (BSP: once
        this step is applied; SSP/ASP: as a pull at clock + 1 may be), into ``out`` if given.
        Send the step's other pushes to those servers first, and call ``clock()`` before
        waiting (under BSP the reply needs every worker's clock). ``ends_step``: nothing
        more of this step goes to the table's servers; the step ends there with it, and
        ``clock()`` does not message them. Not with replication (--ft)."""
        wt = self._table(table, sparse=False)
        flat = self._dense_gradient(table, wt, grad)
        return self._push_pull(wt, flat, out, {rank for rank, _, _ in wt.pieces} if ends_step else set())

    def push_pull(self, table: str, grad: np.ndarray, out: Optional[np.ndarray] = None, *,
                  ends_step: bool = False) -> np.ndarray:
        """``push_pull_async(...).wait()`` (BSP with more than one worker: use the async form,
        ``clock()``, then wait)."""
        return self.push_pull_async(table, grad, out, ends_step=ends_step).wait()

    def push_pull_step_async(self, grads: Dict[str, np.ndarray],
                             outs: Optional[Dict[str, np.ndarray]] = None) -> List[Handle]:
        """A step's fused push-pulls of dense tables (``grads``: table -> gradient, ``outs``:
        table -> output array), every one checked before any is sent; the last request to
        each server ends the step there (``ends_step``). Then ``clock()`` and wait."""
        outs = outs or {}
        checked = []
        for name, grad in grads.items():
            wt = self._table(name, sparse=False)
            out = outs.get(name)
            if out is not None:
                check_array(f"push_pull of {name!r}: out", out, wt.spec.shape, wt.dtype, output=True)
            checked.append((wt, self._dense_gradient(name, wt, grad), out))
        last: Dict[int, int] = {}
        for wt, _, _ in checked:
            last.update((rank, wt.table) for rank, _, _ in wt.pieces)
        return [self._push_pull(wt, flat, out, {rank for rank, final in last.items() if final == wt.table})
                for wt, flat, out in checked]

    # -- sparse tables -----------------------------------------------------------------
    def pull_rows_async(self, table: str, ids) -> Handle:
        """Start reading rows ``ids`` of sparse ``table``; the result is aligned with ids."""
        wt = self._table(table, sparse=True)
        spec = wt.spec
        ids = checked_ids(f"pull_rows of {table!r}", ids, table_rows(spec))
        out = np.empty((len(ids),) + tuple(spec.shape[1:]), dtype=wt.dtype)
        groups = by_shard(self.layout, wt.table, ids)
        direct = len(groups) == 1 and wt.wire == wt.dtype
        parts = []
        for rank, where in groups:
            # one shard holding every row: its reply lands in ``out`` directly
            rows = out if direct else np.empty((len(where),) + out.shape[1:], dtype=wt.wire)
            parts.append(self._rows_request(Op.PULL_ROWS, wt, rank, ids.copy() if direct else ids[where], [], [rows]))

        def scatter(done: List[Part]) -> np.ndarray:
            if not direct:
                for part, (_, where) in zip(done, groups):
                    multi_table.put_rows(out, where, part.buffers[-1])
            return out
        return self._handle(f"pull_rows of table {table!r}", parts, scatter, wt.table)

    def pull_rows(self, table: str, ids) -> np.ndarray:
        return self.pull_rows_async(table, ids).wait()

    def push_rows_async(self, table: str, ids, grads: np.ndarray) -> Handle:
        """Start sending the gradients of rows ``ids`` (unique) of sparse ``table``."""
        wt = self._table(table, sparse=True)
        ids, grads = self._sorted_rows(table, wt, ids, grads)
        groups = by_shard(self.layout, wt.table, ids)
        whole = len(groups) == 1  # one server takes every row: the worker's sorted copies go as they are
        parts = [self._rows_request(Op.PUSH_ROWS, wt, rank, ids if whole else ids[where],
                                    [grads if whole else grads[where]], []) for rank, where in groups]
        return self._handle(f"push_rows to table {table!r} at step {self.clock_value}", parts,
                            push_result, wt.table)

    def push_rows(self, table: str, ids, grads: np.ndarray) -> PushResult:
        return self.push_rows_async(table, ids, grads).wait()

    def pull_rows_many_async(self, ids_by_table: Mapping[str, np.ndarray]) -> Handle:
        """Start reading the rows of several sparse tables at once (``ids_by_table``: table ->
        ids), one request per server for all of them; ``wait()`` returns table -> rows
        aligned with its ids. Every table is checked before anything is sent."""
        names, wts = self._sparse_tables(ids_by_table, "pull_rows")
        ids = [checked_ids(f"pull_rows of {name!r}", ids_by_table[name], table_rows(wt.spec))
               for name, wt in zip(names, wts)]
        outs = [np.empty((len(i),) + tuple(wt.spec.shape[1:]), dtype=wt.dtype) for i, wt in zip(ids, wts)]
        plan, tables, widths, wires, codes = self._plan(wts, ids)
        parts = []
        for rank, entries in plan.items():
            header = self._many_header(Op.PULL_ROWS_MANY, entries)
            payloads = [multi_table.directory(entries, tables, widths, codes), multi_table.concatenated(entries, ids)]
            reply = np.empty(multi_table.reply_bytes(entries, widths, wires), np.uint8)
            parts.append(self._request(rank, header, payloads, [reply]))

        def scatter(done: List[Part]) -> Dict[str, np.ndarray]:
            for part, entries in zip(done, plan.values()):
                multi_table.scatter_rows(part.buffers[-1], entries, outs, wires)
            return dict(zip(names, outs))
        return self._handle(f"pull_rows of tables {', '.join(map(repr, names))}", parts, scatter, -1)

    def push_rows_many_async(self, rows_by_table: Mapping[str, Tuple[np.ndarray, np.ndarray]]) -> Handle:
        """Start sending the row gradients of several sparse tables at once (``rows_by_table``:
        table -> (unique ids, gradients)), one request per server for all of them; ``wait()``
        returns table -> ``PushResult``. Every table is checked before anything is sent."""
        names, wts = self._sparse_tables(rows_by_table, "push_rows")
        ids, grads = map(list, zip(*(self._sorted_rows(name, wt, *rows_by_table[name])
                                     for name, wt in zip(names, wts)))) if names else ([], [])
        plan, tables, widths, _, codes = self._plan(wts, ids)
        parts = []
        for rank, entries in plan.items():
            header = self._many_header(Op.PUSH_ROWS_MANY, entries)
            payloads = [multi_table.directory(entries, tables, widths, codes), multi_table.concatenated(entries, ids),
                        multi_table.concatenated(entries, grads, raw=True)]
            parts.append(self._request(rank, header, payloads, []))
        plans = list(plan.values())
        return self._handle(f"push_rows to tables {', '.join(map(repr, names))} at step {self.clock_value}", parts,
                            lambda done: multi_table.push_results(done, plans, names), -1)

    # -- clock and end -----------------------------------------------------------------
    def clock(self, stats: Optional[np.ndarray] = None, staleness: int = 0) -> int:
        """End this step: tell every server this worker's clock moved on (with its share's
        ``stats`` and read ``staleness``, ``protocol.clock_request``, also the first server after
        a push-pull: it writes ps mode's live lines); return it."""
        self._check_not_released("clock()")
        self.clock_value += 1
        first, ranks = min(self.layout.shard_ranks.values()), set(self.layout.shard_ranks.values())
        self._tell_servers(protocol.clock_request(self.slot, self.clock_value, stats, staleness), self._ended)
        if stats is not None and first in self._ended:  # its clock moved with the push-pull: the share alone
            share = protocol.clock_request(self.slot, self.clock_value, stats, staleness, share_only=True)
            self._tell_servers(share, ranks - {first})
        self._ended = set()
        return self.clock_value

    def release(self) -> None:
        """Tell every server this worker is done (it stops counting in consistency);
        a server's ``serve()`` returns once every worker has released it. The worker
        takes no call after it (``PSInputError``)."""
        self._check_not_released("release()")
        self.released = True
        self._tell_servers(protocol.request(Op.RELEASE, 0, self.slot, self.clock_value))
        with self.guard(f"worker slot {self.slot} releasing the servers") if self.guard else nullcontext():
            wait_all([request for request, _ in self._unanswered])
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

    def _table(self, name: str, *, sparse: bool) -> WireTable:
        """Table ``name`` as this worker sends it (every call starts here, so it also refuses a
        released worker)."""
        if self.released:
            self._check_not_released(f"{'pull_rows/push_rows' if sparse else 'pull/push'} of {name!r}")
        wt = self._tables.get(name) if isinstance(name, str) else None
        if wt is None:
            t = self.layout.table_ids.get(name) if isinstance(name, str) else None
            if t is None:
                known = ", ".join(repr(s.name) for s in self.layout.specs)
                raise PSInputError(f"unknown table {name!r}; the tables are {known}")
            wt = self._tables[name] = wire_table(self.layout, t, self.wire_dtype)
        spec = wt.spec
        if spec.sparse != sparse:
            use = "pull_rows/push_rows" if spec.sparse else "pull/push"
            raise PSInputError(f"table {name!r} is {'sparse' if spec.sparse else 'dense'}: use {use}")
        return wt

    def _sorted_rows(self, table: str, wt: WireTable, ids, grads) -> Tuple[np.ndarray, np.ndarray]:
        """A push's ids and gradients checked and sorted by id, the gradients in the wire dtype."""
        ids, grads = sorted_push_rows(table, wt.spec, ids, grads)
        return ids, on_wire(f"push_rows to {table!r}: gradients", grads, wt.wire)

    def _sparse_tables(self, by_table: Mapping[str, object], call: str) -> Tuple[List[str], List[WireTable]]:
        """The names and tables of a multi-table call's sparse tables (checked)."""
        if not isinstance(by_table, Mapping):
            raise PSInputError(f"{call}_many takes a mapping of table name -> rows, not {type(by_table).__name__}")
        return list(by_table), [self._table(name, sparse=True) for name in by_table]

    def _many_header(self, op: int, entries: List[multi_table.Entry]) -> bytes:
        return protocol.request(op, -1, self.slot, self.clock_value, sum(len(e.where) for e in entries), 0, len(entries))

    def _plan(self, wts: List[WireTable], ids: List[np.ndarray]):
        """Each table's rows grouped per server; per table its id, row width, wire dtype and its code."""
        plan = multi_table.by_server([by_shard(self.layout, wt.table, i) for wt, i in zip(wts, ids)])
        return (plan, [wt.table for wt in wts], [wt.width for wt in wts], [wt.wire for wt in wts],
                [wt.code for wt in wts])

    def _handle(self, what: str, parts: List[Part], finish, table: int) -> Handle:
        handle = Handle(what, parts, finish, self.traffic, self.guard, table)
        self._open = [h for h in self._open if not h.done]  # a finished one holds its buffers: not kept
        self._open.append(handle)
        return handle

    def _header(self, op: int, wt: WireTable, count: int, keys: int = 0, cached: bool = False,
                clock: Optional[int] = None) -> bytes:
        """A request header for ``count`` elements or rows of ``wt``, at ``clock`` (None: this worker's)."""
        return protocol.request(op, wt.table, self.slot, self.clock_value if clock is None else clock, count,
                                wt.code, wt.width, keys, cached)

    def _push_pull(self, wt: WireTable, flat: np.ndarray, out: Optional[np.ndarray], ending: Set[int]) -> Handle:
        """A checked push-pull of table ``wt``, ending the step on the server ranks ``ending``."""
        handle = self._dense(Op.PUSH_PULL, wt, flat, out, f"push_pull of table {wt.spec.name!r} at step "
                                                          f"{self.clock_value}", ending)
        self._ended |= ending
        return handle

    def _dense(self, op: int, wt: WireTable, grad: Optional[np.ndarray], out: Optional[np.ndarray],
               what: str, ending: Set[int] = frozenset()) -> Handle:
        """A PULL or PUSH_PULL of every piece of dense table ``wt``, replies into ``out``
        (a PUSH_PULL to a rank in ``ending``: PUSH_PULL_END)."""
        if out is None:
            out = np.empty(wt.spec.shape, dtype=wt.dtype)
        else:
            check_array(f"{what}: out", out, wt.spec.shape, wt.dtype, output=True)
        flat = out.reshape(-1)
        narrow = wt.wire != wt.dtype
        parts = []
        for rank, start, stop in wt.pieces:
            header = self._header(Op.PUSH_PULL_END if rank in ending else op, wt, stop - start)
            into = np.empty(stop - start, wt.wire) if narrow else flat[start:stop]
            parts.append(self._request(rank, header, [] if grad is None else [grad[start:stop]], [into]))

        def widen(done: List[Part]) -> np.ndarray:
            if narrow:
                for part, (_, start, stop) in zip(done, wt.pieces):
                    flat[start:stop] = part.buffers[-1]
            return out
        return self._handle(what, parts, widen, wt.table)

    def _dense_gradient(self, table: str, wt: WireTable, grad) -> np.ndarray:
        """A dense gradient checked, on the host, flat, in the wire dtype."""
        grad = to_host(grad) if is_device_array(grad) else grad  # a GPU's gradient goes through the host
        check_array(f"push to {table!r}: gradient", grad, wt.spec.shape, wt.dtype)
        return on_wire(f"push to {table!r}: gradient", np.ascontiguousarray(grad).reshape(-1), wt.wire)

    def _rows_request(self, op: int, wt: WireTable, rank: int, ids: np.ndarray,
                      payloads: List[np.ndarray], into: List[np.ndarray]) -> Part:
        """A sparse request for ``ids`` (the worker's own copy); when the server already holds
        this id list (key caching), only its number travels, and if the server turns out not
        to know it (``KEYS_UNKNOWN``) the handle sends the request again with the ids."""
        number, cached = self.sent_keys.number(rank, wt.table, ids)
        clock = self.clock_value
        header = self._header(op, wt, len(ids), number, cached)
        if not cached:
            return self._request(rank, header, [ids, *payloads], into)
        part = self._request(rank, header, payloads, into)

        def resend() -> Part:  # the same request at the same clock, with its ids and a new list number
            self.sent_keys.forget(rank, wt.table)
            number, _ = self.sent_keys.number(rank, wt.table, ids)
            full = self._header(op, wt, len(ids), number, clock=clock)
            return self._request(rank, full, [ids, *payloads], into)
        part.resend = resend
        return part

    def _request(self, rank: int, header: bytes, payloads: List[np.ndarray],
                 into: List[np.ndarray]) -> Part:
        """Send ``rank`` the request (header, then payloads), then post the reply receives
        (header, then ``into``): the server starts on the request while they are posted, and
        its replies, which leave in request order, match the receives in the order they were
        posted. A receive that cannot be posted (a broken communicator) leaves the sends to
        ``abandon``."""
        if self._unanswered:
            self._retire_unanswered()
        comm = self.comm
        sent = comm.Isend(header, rank, TAG_REQUEST)
        part = Part(rank, [header, *payloads, *into])
        requests = part.requests
        requests.append(sent)
        for payload in payloads:
            requests.append(comm.Isend(payload, rank, TAG_PAYLOAD))
        try:
            requests.append(comm.Irecv(part.reply, rank, TAG_REPLY))
            for buffer in into:
                requests.append(comm.Irecv(buffer, rank, TAG_REPLY))
        except MPI.Exception:
            self._unanswered += [(request, part.buffers) for request in requests]
            raise
        part.received = sum(buffer.nbytes for buffer in into)
        if payloads:
            self.traffic.add(sum(p.nbytes for p in payloads), 0)
        return part

    def _tell_servers(self, header: bytes, skip: Set[int] = frozenset()) -> None:
        self._retire_unanswered()
        for rank in self.layout.shard_ranks.values():
            if rank not in skip:
                self._unanswered.append((self.comm.Isend(header, rank, TAG_REQUEST), header))

    def _retire_unanswered(self) -> None:
        """Drop the sends that went (one ``MPI_Test`` each, as the server's ``_retire_sends``)."""
        self._unanswered = [entry for entry in self._unanswered if not entry[0].Test()]


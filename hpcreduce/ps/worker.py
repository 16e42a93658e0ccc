"""The worker's side of the parameter server, with ps-lite's KVWorker surface.

    worker.pull(table) / push(table, grad)                 dense tables, whole tensors
    worker.pull_rows(table, ids) / push_rows(table, ids, grads)   sparse tables, some rows
    worker.pull_rows_many_async({table: ids}) / push_rows_many_async({table: (ids, grads)})
                                                           several tables, one request per server
    worker.clock() at the end of every step; worker.*_async(...) -> Handle; handle.wait()
    worker.release(): done, the servers may stop; worker.reopen(): (rare) a new session after release

A call is checked here first (table, shape, dtype, writable output, ids; a worker
already released) and raises ``PSInputError`` before anything is sent, so a bad call
leaves the worker and the servers as they were (a pushed device (cupy) array is first
copied to the host: only host memory reaches MPI). It then goes to the shards holding
the table's pieces or rows (``Layout.placement``), all at once; the reply receives are
posted first, straight into the result (dense pulls land in the output array, no copy). Each request carries the
worker's clock, which is a push's step: the pair (slot, step) lets a server refuse a
duplicate, so push at most once per table per step.
Cost per call: one 72 B header to each shard involved, the payload, and a 72 B reply.
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
from .protocol import TAG_PAYLOAD, TAG_REPLY, TAG_REQUEST, Op, Req
from .tables import ParamSpec, row_width
from .wire_cast import by_shard, on_wire, wire_of

class Worker:
    """One worker rank's client of the servers of ``layout``.

    ``slot`` is the worker's stable name in every request (``Layout``);
    ``index`` its position among the live workers (its share of a batch).
    ``guard(what)`` wraps every blocking wait (the fault-tolerance watchdog); ``clock``: the
    step it starts at; ``wire_dtype`` float16: pushed and pulled values travel as float16
    (the servers keep and update their own dtype), None: as stored.
    """

    def __init__(self, comm: MPI.Intracomm, layout: Layout, traffic: Optional[Traffic] = None, *,
                 guard: Callable[[str], Any] = lambda what: nullcontext(), clock: int = 0,
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
        self.wire_dtype = wire_dtype  # float16: values travel as float16 (None: as stored)
        self._unanswered: List[Tuple[MPI.Request, np.ndarray]] = []
        self._ended: Set[int] = set()  # server ranks where this step already ended (PUSH_PULL_END)
        self._open: List[Handle] = []
        self.released = False

    # -- dense tables ------------------------------------------------------------------
    def pull_async(self, table: str, out: Optional[np.ndarray] = None) -> Handle:
        """Start reading dense ``table`` whole, into ``out`` if given."""
        t, spec = self._table(table, sparse=False)
        return self._dense(Op.PULL, t, spec, None, out, f"pull of table {table!r}")

    def pull(self, table: str, out: Optional[np.ndarray] = None) -> np.ndarray:
        return self.pull_async(table, out).wait()

    def push_async(self, table: str, grad: np.ndarray) -> Handle:
        """Start sending dense ``table``'s gradient (whole tensor) for this step."""
        t, spec = self._table(table, sparse=False)
        flat = self._dense_gradient(table, spec, grad)
        parts = []
        for piece in self.layout.placement.pieces[t]:
            rank = self.layout.shard_ranks[piece.shard]
            header = self._header(Op.PUSH, t, piece.size, spec)
            parts.append(self._request(rank, header, [flat[piece.start:piece.stop]], []))
        return self._handle(f"push to table {table!r} at step {self.clock_value}", parts, push_result, t)

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
        t, spec = self._table(table, sparse=False)
        flat = self._dense_gradient(table, spec, grad)
        ranks = {self.layout.shard_ranks[piece.shard] for piece in self.layout.placement.pieces[t]}
        return self._push_pull(t, spec, flat, out, ranks if ends_step else set())

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
            t, spec = self._table(name, sparse=False)
            out = outs.get(name)
            if out is not None:
                check_array(f"push_pull of {name!r}: out", out, spec.shape, spec.dtype, output=True)
            checked.append((t, spec, self._dense_gradient(name, spec, grad), out))
        last: Dict[int, int] = {}
        for t, _, _, _ in checked:
            last.update((self.layout.shard_ranks[piece.shard], t) for piece in self.layout.placement.pieces[t])
        return [self._push_pull(t, spec, flat, out, {rank for rank, final in last.items() if final == t})
                for t, spec, flat, out in checked]

    # -- sparse tables -----------------------------------------------------------------
    def pull_rows_async(self, table: str, ids) -> Handle:
        """Start reading rows ``ids`` of sparse ``table``; the result is aligned with ids."""
        t, spec = self._table(table, sparse=True)
        ids = checked_ids(f"pull_rows of {table!r}", ids, table_rows(spec))
        out = np.empty((len(ids),) + tuple(spec.shape[1:]), dtype=spec.dtype)
        groups = by_shard(self.layout, t, ids)
        wire = wire_of(spec, self.wire_dtype)
        direct = len(groups) == 1 and wire == out.dtype
        parts = []
        for rank, where in groups:
            # one shard holding every row: its reply lands in ``out`` directly
            rows = out if direct else np.empty((len(where),) + out.shape[1:], dtype=wire)
            parts.append(self._rows_request(Op.PULL_ROWS, t, spec, rank, ids.copy() if direct else ids[where], [],
                                            [rows]))

        def scatter(done: List[Part]) -> np.ndarray:
            if not direct:
                for part, (_, where) in zip(done, groups):
                    multi_table.put_rows(out, where, part.buffers[-1])
            return out
        return self._handle(f"pull_rows of table {table!r}", parts, scatter, t)

    def pull_rows(self, table: str, ids) -> np.ndarray:
        return self.pull_rows_async(table, ids).wait()

    def push_rows_async(self, table: str, ids, grads: np.ndarray) -> Handle:
        """Start sending the gradients of rows ``ids`` (unique) of sparse ``table``."""
        t, spec = self._table(table, sparse=True)
        ids, grads = self._sorted_rows(table, spec, ids, grads)
        groups = by_shard(self.layout, t, ids)
        whole = len(groups) == 1  # one server takes every row: the worker's sorted copies go as they are
        parts = [self._rows_request(Op.PUSH_ROWS, t, spec, rank, ids if whole else ids[where],
                                    [grads if whole else grads[where]], []) for rank, where in groups]
        return self._handle(f"push_rows to table {table!r} at step {self.clock_value}", parts,
                            push_result, t)

    def push_rows(self, table: str, ids, grads: np.ndarray) -> PushResult:
        return self.push_rows_async(table, ids, grads).wait()

    def pull_rows_many_async(self, ids_by_table: Mapping[str, np.ndarray]) -> Handle:
        """Start reading the rows of several sparse tables at once (``ids_by_table``: table ->
        ids), one request per server for all of them; ``wait()`` returns table -> rows
        aligned with its ids. Every table is checked before anything is sent."""
        names, tables, specs = self._sparse_tables(ids_by_table, "pull_rows")
        ids = [checked_ids(f"pull_rows of {name!r}", ids_by_table[name], table_rows(spec))
               for name, spec in zip(names, specs)]
        outs = [np.empty((len(i),) + tuple(spec.shape[1:]), dtype=spec.dtype) for i, spec in zip(ids, specs)]
        plan, widths, wires, codes = self._plan(tables, specs, ids)
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
        names, tables, specs = self._sparse_tables(rows_by_table, "push_rows")
        ids, grads = map(list, zip(*(self._sorted_rows(name, spec, *rows_by_table[name])
                                     for name, spec in zip(names, specs)))) if names else ([], [])
        plan, widths, _, codes = self._plan(tables, specs, ids)
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
        with self.guard(f"worker slot {self.slot} releasing the servers"):
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

    def _sorted_rows(self, table: str, spec: ParamSpec, ids, grads) -> Tuple[np.ndarray, np.ndarray]:
        """A push's ids and gradients checked and sorted by id, the gradients in the wire dtype."""
        ids, grads = sorted_push_rows(table, spec, ids, grads)
        return ids, self._cast(f"push_rows to {table!r}: gradients", grads, spec)

    def _sparse_tables(self, by_table: Mapping[str, object], call: str) -> Tuple[List[str], List[int],
                                                                                  List[ParamSpec]]:
        """The names, ids and specs of a multi-table call's sparse tables (checked)."""
        if not isinstance(by_table, Mapping):
            raise PSInputError(f"{call}_many takes a mapping of table name -> rows, not {type(by_table).__name__}")
        checked = [self._table(name, sparse=True) for name in by_table]
        return list(by_table), [t for t, _ in checked], [spec for _, spec in checked]

    def _many_header(self, op: Op, entries: List[multi_table.Entry]) -> np.ndarray:
        return protocol.request(op, -1, self.slot, self.clock_value, sum(len(e.where) for e in entries), 0, len(entries))

    def _plan(self, tables: List[int], specs: List[ParamSpec], ids: List[np.ndarray]):
        """Each table's rows grouped per server; per table its row width, wire dtype and its code."""
        wires = [wire_of(spec, self.wire_dtype) for spec in specs]
        plan = multi_table.by_server([by_shard(self.layout, t, i) for t, i in zip(tables, ids)])
        return (plan, [row_width(spec) for spec in specs], wires, [protocol.dtype_code(w) for w in wires])

    def _handle(self, what: str, parts: List[Part], finish, table: int) -> Handle:
        handle = Handle(what, parts, finish, self.traffic, self.guard, table)
        self._open = [h for h in self._open if not h.done]
        self._open.append(handle)
        return handle

    def _header(self, op: Op, table: int, count: int, spec: ParamSpec, keys: int = 0,
                cached: bool = False) -> np.ndarray:
        width = row_width(spec) if spec.sparse else 1
        return protocol.request(op, table, self.slot, self.clock_value, count,
                                protocol.dtype_code(wire_of(spec, self.wire_dtype)), width, keys, cached)

    def _cast(self, what: str, values: np.ndarray, spec: ParamSpec) -> np.ndarray:
        return on_wire(what, values, spec, self.wire_dtype)

    def _push_pull(self, t: int, spec: ParamSpec, flat: np.ndarray, out: Optional[np.ndarray],
                   ending: Set[int]) -> Handle:
        """A checked push-pull of table ``t``, ending the step on the server ranks ``ending``."""
        handle = self._dense(Op.PUSH_PULL, t, spec, flat, out, f"push_pull of table {spec.name!r} at step "
                                                               f"{self.clock_value}", ending)
        self._ended |= ending
        return handle

    def _dense(self, op: Op, t: int, spec: ParamSpec, grad: Optional[np.ndarray], out: Optional[np.ndarray],
               what: str, ending: Set[int] = frozenset()) -> Handle:
        """A PULL or PUSH_PULL of every piece of dense table ``t``, replies into ``out``
        (a PUSH_PULL to a rank in ``ending``: PUSH_PULL_END)."""
        if out is None:
            out = np.empty(spec.shape, dtype=spec.dtype)
        else:
            check_array(f"{what}: out", out, spec.shape, spec.dtype, output=True)
        flat = out.reshape(-1)
        wire = wire_of(spec, self.wire_dtype)
        pieces = self.layout.placement.pieces[t]
        parts = []
        for piece in pieces:
            rank = self.layout.shard_ranks[piece.shard]
            header = self._header(Op.PUSH_PULL_END if rank in ending else op, t, piece.size, spec)
            into = flat[piece.start:piece.stop] if wire == out.dtype else np.empty(piece.size, wire)
            sent = [] if grad is None else [grad[piece.start:piece.stop]]
            parts.append(self._request(rank, header, sent, [into]))

        def widen(done: List[Part]) -> np.ndarray:
            if wire != out.dtype:
                for part, piece in zip(done, pieces):
                    flat[piece.start:piece.stop] = part.buffers[-1]
            return out
        return self._handle(what, parts, widen, t)

    def _dense_gradient(self, table: str, spec: ParamSpec, grad) -> np.ndarray:
        """A dense gradient checked, on the host, flat, in the wire dtype."""
        grad = to_host(grad) if is_device_array(grad) else grad  # a GPU's gradient goes through the host
        check_array(f"push to {table!r}: gradient", grad, spec.shape, spec.dtype)
        return self._cast(f"push to {table!r}: gradient", np.ascontiguousarray(grad).reshape(-1), spec)

    def _rows_request(self, op: Op, table: int, spec: ParamSpec, rank: int, ids: np.ndarray,
                      payloads: List[np.ndarray], into: List[np.ndarray]) -> Part:
        """A sparse request for ``ids`` (the worker's own copy); when the server already holds
        this id list (key caching), only its number travels, and if the server turns out not
        to know it (``KEYS_UNKNOWN``) the handle sends the request again with the ids."""
        number, cached = self.sent_keys.number(rank, table, ids)
        header = self._header(op, table, len(ids), spec, number, cached)
        if not cached:
            return self._request(rank, header, [ids, *payloads], into)
        part = self._request(rank, header, payloads, into)

        def resend() -> Part:
            self.sent_keys.forget(rank, table)
            full = header.copy()
            full[Req.KEYS], _ = self.sent_keys.number(rank, table, ids)
            full[Req.PAYLOADS] += 1
            return self._request(rank, full, [ids, *payloads], into)
        part.resend = resend
        return part

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

    def _tell_servers(self, header: np.ndarray, skip: Set[int] = frozenset()) -> None:
        self._retire_unanswered()
        for rank in self.layout.shard_ranks.values():
            if rank not in skip:
                self._unanswered.append((self.comm.Isend(header, rank, TAG_REQUEST), header))

    def _retire_unanswered(self) -> None:
        """Drop the sends that went (one ``MPI_Test`` each, as the server's ``_retire_sends``)."""
        self._unanswered = [entry for entry in self._unanswered if not entry[0].Test()]


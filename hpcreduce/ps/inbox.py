"""A server receives one request: its header, its payloads, and why it refuses it, if it does.

Every payload the header announces is received, into a buffer of the expected size
when it fits and into a scratch buffer otherwise, so a bad request never leaves
bytes behind that would be mistaken for the next request's. Refusals that do not
depend on the server's state (op, table, kind, dtype, sizes, ids, NaN/Inf) are found
here; the server refuses the request when its turn comes.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, FrozenSet, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..arrays.finite import all_finite
from .key_cache import KnownKeys
from .layout import Layout
from .tables import first_bad_id, row_width
from .protocol import (ALL_OPS, DENSE_PUSHES, DTYPES, wire_dtype, HEADER_LEN, MANY, PAYLOADS_IN, PUSHES,
                       SPARSE_OPS, TAG_FORWARD, TAG_FORWARD_PAYLOAD, TAG_PAYLOAD, TAG_REQUEST, WORKER_OPS, Op, Req,
                       Status)
from .shard_state import ShardState

Refusal = Tuple[Status, int]
"""Why a server refuses a request: its status, and the offending value (an id, a size) or 0."""
TABLE_OPS = SPARSE_OPS | DENSE_PUSHES | {Op.PULL}
TakeBuffer = Callable[[int], np.ndarray]


class Request:
    """One received request: its header (and the header's fields as ints), payloads and
    ``refusal`` (None: none so far). ``ids``: its sparse ids, once checked;
    ``borrowed``: the server's spare buffer its dense gradient was received into; ``pushed``: a push's
    status once the server took it (its reply may wait); ``wire``: the dtype code values
    travel in (replies of PULL and PUSH_PULL are narrowed to it). ``tables``: a MANY op's
    per-table requests (PULL_ROWS/PUSH_ROWS, checked), in directory order; ``duplicates``:
    how many of a PUSH_ROWS_MANY's tables had taken this push already. A plain class with
    slots: a server makes one per request."""

    __slots__ = ("source", "slot", "header", "payloads", "refusal", "ids", "borrowed", "nbytes", "pushed",
                 "tables", "duplicates", "fields", "op", "table", "clock", "count", "wire")

    def __init__(self, source: int, slot: int, header: np.ndarray, payloads: Optional[List[np.ndarray]] = None):
        self.source, self.slot, self.header = source, slot, header
        self.payloads = [] if payloads is None else payloads
        self.refusal: Optional[Refusal] = None
        self.ids: Optional[np.ndarray] = None
        self.borrowed: Optional[np.ndarray] = None
        self.nbytes = 0
        self.pushed: Optional[Status] = None
        self.tables: List[Request] = []
        self.duplicates = 0
        fields = self.fields = header.tolist()
        self.op, self.table, self.clock = fields[Req.OP], fields[Req.TABLE], fields[Req.CLOCK]
        self.count, self.wire = fields[Req.COUNT], fields[Req.DTYPE]


def receive(comm: MPI.Intracomm, source: int, layout: Layout, state: ShardState,
            take_buffer: TakeBuffer, *, forwarded: bool = False, header: Optional[np.ndarray] = None,
            keys: Optional[KnownKeys] = None) -> Request:
    """Receive the request ``source`` sent (its header is waiting, or already received
    into ``header``) and check it.

    ``take_buffer(table)`` lends a buffer for a dense gradient of that table's piece.
    ``forwarded``: a push a primary server forwarded to this backup (``TAG_FORWARD``), on
    behalf of the worker slot its header names. ``keys``: the id lists this server holds
    (key caching); a request naming one gets it as its first payload, and its header is
    rewritten to the full form (what a backup is forwarded).
    """
    header_tag, payload_tag = (TAG_FORWARD, TAG_FORWARD_PAYLOAD) if forwarded else (TAG_REQUEST, TAG_PAYLOAD)
    if header is None:
        header = np.zeros(HEADER_LEN, dtype=np.int64)
        comm.Recv(header, source, header_tag)
    slot = int(header[Req.SLOT]) if forwarded else layout.slot_of(source)
    request = Request(source, slot, header)
    request.refusal = header_refusal(request, layout, state, ALL_OPS if forwarded else WORKER_OPS)
    if not request.fields[Req.PAYLOADS] and request.op not in SPARSE_OPS:
        return request  # nothing follows and nothing more to check (a PULL, a CLOCK)
    status = MPI.Status()
    skipped = _cached_ids(request)
    for index in range(max(0, request.fields[Req.PAYLOADS])):
        comm.Probe(source, payload_tag, status)
        nbytes = status.Get_count(MPI.BYTE)
        buffer = None if request.refusal else _expected_buffer(request, index + skipped, nbytes, layout, state,
                                                               take_buffer)
        if buffer is None:
            buffer = np.empty(nbytes, dtype=np.uint8)
            request.refusal = request.refusal or (Status.BAD_SIZE, nbytes)
        comm.Recv(buffer, source, payload_tag)
        request.payloads.append(buffer)
        request.nbytes += nbytes
    if request.op in MANY:
        request.refusal = request.refusal or split_tables(request, layout, state)
        return request
    if request.refusal is None and skipped:
        request.refusal = _recalled(request, keys)
    if request.refusal is None and request.op in PUSHES and request.payloads[-1].dtype != \
            layout.specs[request.table].dtype:
        _widened(request, layout, take_buffer)
    if request.refusal is None:
        request.refusal = content_refusal(request, layout, state)
        if request.refusal is None and keys is not None and request.op in SPARSE_OPS and request.fields[Req.KEYS] > 0:
            keys.remember(request.slot, request.table, request.fields[Req.KEYS], request.payloads[0])
    return request


def _cached_ids(request: Request) -> int:
    """1 when the request names a cached id list instead of sending the ids, else 0."""
    fields = request.fields
    return int(request.op in SPARSE_OPS and fields[Req.KEYS] > 0
               and fields[Req.PAYLOADS] == PAYLOADS_IN[request.op] - 1)


def _recalled(request: Request, keys: Optional[KnownKeys]) -> Optional[Refusal]:
    """Put the cached id list in front of the payloads and rewrite the header to the full
    form; KEYS_UNKNOWN when this server does not hold that list."""
    fields = request.fields
    ids = None if keys is None else keys.recall(request.slot, request.table, fields[Req.KEYS])
    if ids is None:
        return Status.KEYS_UNKNOWN, fields[Req.KEYS]
    if len(ids) != request.count:
        return Status.BAD_SIZE, request.count
    request.payloads.insert(0, ids)
    request.header = request.header.copy()
    request.header[Req.PAYLOADS] += 1
    request.fields = request.header.tolist()
    return None


def header_refusal(request: Request, layout: Layout, state: ShardState,
                   allowed=WORKER_OPS) -> Optional[Refusal]:
    """What is wrong with the header alone, if anything (``allowed``: the ops accepted)."""
    fields = request.fields
    op = request.op
    if op not in allowed:
        return Status.UNKNOWN_OP, op
    if not 0 <= request.slot < state.slot_count or fields[Req.SLOT] != request.slot:
        return Status.WRONG_SLOT, fields[Req.SLOT]
    if fields[Req.PAYLOADS] != PAYLOADS_IN[op] - _cached_ids(request):
        return Status.BAD_SIZE, fields[Req.PAYLOADS]
    if op not in TABLE_OPS:
        return None
    table = request.table
    if not 0 <= table < len(layout.specs):
        return Status.UNKNOWN_TABLE, table
    spec = layout.specs[table]
    if (op in SPARSE_OPS) != spec.sparse:
        return Status.WRONG_KIND, table
    if table not in state.tables:
        return Status.NOT_OWNER, table
    code = fields[Req.DTYPE]
    if code not in accepted_codes(spec.dtype):
        return Status.BAD_DTYPE, code
    count = request.count
    if spec.sparse:
        if count < 0 or fields[Req.WIDTH] != row_width(spec):
            return Status.BAD_SIZE, fields[Req.WIDTH]
    elif count != state.tables[table].values.size:
        return Status.BAD_SIZE, count
    return None


@lru_cache(maxsize=None)
def accepted_codes(stored: str) -> FrozenSet[int]:
    """The wire dtype codes a table stored as ``stored`` takes: its own, or a narrower float."""
    return frozenset(code for code, dtype in enumerate(DTYPES)
                     if dtype in (np.dtype(stored), wire_dtype(stored, dtype)))


def _expected_buffer(request: Request, index: int, nbytes: int, layout: Layout, state: ShardState,
                     take_buffer: TakeBuffer) -> Optional[np.ndarray]:
    """A buffer for payload ``index`` when its size is the one the header implies."""
    count = request.count
    if request.op in MANY:  # the directory, the ids, the values (as bytes, checked per table later)
        expected = (request.fields[Req.WIDTH] * DIRECTORY_WIDTH * 8, count * 8, nbytes)[index]
        return np.empty(nbytes // 8 if index < 2 else nbytes, np.int64 if index < 2 else np.uint8) \
            if nbytes == expected and request.fields[Req.WIDTH] >= 0 else None
    spec = layout.specs[request.table]
    wire = DTYPES[request.fields[Req.DTYPE]]
    if request.op in DENSE_PUSHES:
        if nbytes != count * wire.itemsize:
            return None
        if wire != spec.dtype:
            return np.empty(count, dtype=wire)
        request.borrowed = take_buffer(request.table)
        return request.borrowed
    if index == 0:
        return np.empty(count, dtype=np.int64) if nbytes == count * 8 else None
    row_shape = state.tables[request.table].values.shape[1:]
    if nbytes != count * row_width(spec) * wire.itemsize:
        return None
    return np.empty((count,) + row_shape, dtype=wire)


DIRECTORY_WIDTH = 4  # a MANY op's directory row: table, ids, row width, dtype code
ONE_TABLE = {Op.PULL_ROWS_MANY: Op.PULL_ROWS, Op.PUSH_ROWS_MANY: Op.PUSH_ROWS}


def split_tables(request: Request, layout: Layout, state: ShardState) -> Optional[Refusal]:
    """A MANY op's tables as the one-table requests they stand for (``request.tables``),
    each checked as such; the first refusal refuses the whole request."""
    directory = request.payloads[0].reshape(-1, DIRECTORY_WIDTH)
    ids, values = request.payloads[1], request.payloads[2] if len(request.payloads) > 2 else None
    if len(set(directory[:, 0].tolist())) != len(directory):
        return Status.BAD_IDS, 0  # a table named twice
    if directory[:, 1].min(initial=0) < 0 or int(directory[:, 1].sum()) != request.count:
        return Status.BAD_SIZE, request.count
    start = offset = 0
    op = ONE_TABLE[request.op]
    for table, count, width, code in directory.tolist():
        header = np.array([op, table, request.slot, request.clock, count, code, width, PAYLOADS_IN[op], 0], np.int64)
        one = Request(request.source, request.slot, header, [ids[start:start + count]])
        start += count
        one.refusal = header_refusal(one, layout, state, ALL_OPS)
        if one.refusal is not None:
            return one.refusal
        if values is not None:
            wire = DTYPES[code]
            stop = offset + count * width * wire.itemsize
            if stop > values.nbytes:
                return Status.BAD_SIZE, values.nbytes
            row_shape = state.tables[table].values.shape[1:]
            one.payloads.append(values[offset:stop].view(wire).reshape((count,) + row_shape))
            offset = stop
            if wire != layout.specs[table].dtype:
                _widened(one, layout, lambda table: None)
        one.refusal = content_refusal(one, layout, state)
        if one.refusal is not None:
            return one.refusal
        request.tables.append(one)
    if values is not None and offset != values.nbytes:
        return Status.BAD_SIZE, values.nbytes
    return None


def table_gradients(request: Request) -> List[Tuple[int, Tuple[np.ndarray, np.ndarray]]]:
    """A PUSH_ROWS_MANY's (table, (rows, gradients)) per table, for ``ShardEngine.accept_many``."""
    return [(one.table, (one.ids, one.payloads[1])) for one in request.tables]


def _widened(request: Request, layout: Layout, take_buffer: TakeBuffer) -> None:
    """A push whose gradient travelled narrower than its table (``--wire-dtype``): the
    gradient in the table's dtype, and the header saying so (what a backup is forwarded)."""
    stored = np.dtype(layout.specs[request.table].dtype)
    narrow = request.payloads[-1]
    if request.op in DENSE_PUSHES:
        request.borrowed = take_buffer(request.table)
        np.copyto(request.borrowed, narrow)
        request.payloads[-1] = request.borrowed
    else:
        request.payloads[-1] = narrow.astype(stored)
    request.header = request.header.copy()
    request.header[Req.DTYPE] = DTYPES.index(stored)
    request.fields = request.header.tolist()


def content_refusal(request: Request, layout: Layout, state: ShardState) -> Optional[Refusal]:
    """Ids out of range or not owned here, push ids not sorted-unique, NaN/Inf gradients.
    Sets ``request.ids``: the rows' ids (checked: the row store takes ids)."""
    op = request.op
    if op in SPARSE_OPS:
        ids = request.payloads[0]
        spec = layout.specs[request.table]
        rows = spec.shape[0] if spec.dynamic is None else None  # a dynamic table takes any id
        bad = first_bad_id(ids, rows, increasing=op == Op.PUSH_ROWS)
        if bad >= 0:
            return Status.BAD_IDS, int(ids[bad])
        request.ids = ids
        foreign = _foreign_id(layout, request.table, state.shard, ids) if spec.dynamic is not None \
            else state.tables[request.table].foreign(ids)
        if foreign is not None:
            return Status.NOT_OWNER, foreign
    if op in PUSHES and not all_finite(request.payloads[-1]):
        return Status.NONFINITE, 0
    return None


def _foreign_id(layout: Layout, table: int, shard: int, ids: np.ndarray) -> Optional[int]:
    """The first of ``ids`` that placement gives another shard than ``shard`` (None: none)."""
    if not len(ids):
        return None
    foreign = layout.placement.row_owners(table, ids) != shard  # one shard: no hashing
    return int(ids[np.argmax(foreign)]) if foreign.any() else None

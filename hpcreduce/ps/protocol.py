"""The wire protocol between PS workers and servers: ops, fixed int64 headers, tags.

Every message is a raw buffer (numpy arrays; headers are packed int64 bytes); nothing is
pickled. A request is one header of ``HEADER_LEN`` int64 on ``TAG_REQUEST`` followed by ``payloads`` buffers on
``TAG_PAYLOAD`` (same source, so MPI's non-overtaking rule keeps them in order).
A sparse request may name an id list the server already holds instead of sending the ids
(key caching, ``key_cache.py``: the header's ``KEYS`` field, one payload fewer).
A reply is one header on ``TAG_REPLY`` followed, for the two pull ops and the two
push-pull ops, by exactly one payload buffer on ``TAG_REPLY`` (empty when the request
was refused). A server answers
each worker's requests in the order they were sent, so a worker posts its reply
receives when it sends and they match in order.

    op          request payloads          reply payload     acknowledged
    PULL        -                         piece values      yes (the values)
    PUSH        gradient of the piece     -                 yes
    PULL_ROWS   ids (int64)               rows              yes (the rows)
    PUSH_ROWS   ids (int64), row grads    -                 yes
    PUSH_PULL   gradient of the piece     piece values      yes (the values after the push)
    PUSH_PULL_END  as PUSH_PULL, and the worker's clock moves on here (no CLOCK follows)
    PULL_ROWS_MANY  directory, ids (int64)           rows of every table   yes (the rows, as bytes)
    PUSH_ROWS_MANY  directory, ids, row grads (bytes)   -                  yes
    CLOCK       -                         -                 no
    RELEASE     -                         -                 no (the worker is done)

With fault tolerance (``--ft``, K >= 2) a server forwards every push it accepts to its
backup (the next shard key) on ``TAG_FORWARD`` (the worker's header, then its payloads on
``TAG_FORWARD_PAYLOAD``), plus ``APPLY`` (BSP: the steps it applied) and ``DONE`` (it
forwards no more); the backup answers each forwarded push with one header on
``TAG_FORWARD_ACK``, and only then does the primary acknowledge the worker.

The two ``*_MANY`` ops carry the rows of several sparse tables in one request per
server (``multi_table.py``): the header's ``WIDTH`` is the number of tables, ``COUNT`` the
ids of all of them, ``TABLE`` -1; the directory is one int64 row (table, ids, width, dtype
code) per table, the ids and values are the tables' concatenated in directory order. Each
table's rows are checked and applied as that table's own PULL_ROWS/PUSH_ROWS would be
(the exactly-once rule per table); a refusal of one table refuses the whole request.
A PUSH_ROWS_MANY reply's ``COUNT`` is the number of tables that were duplicates.

``PUSH_PULL`` (ps-lite's ZPushPull) is a dense push of step t and the pull of the
piece for step t+1 in one round trip: the reply (the push's status, then the values)
leaves when a read at clock t+1 may be answered (BSP: once step t is applied).
``PUSH_PULL_END`` is the worker's last request of step t to that server: after its push
the worker's clock there is t+1, and ``clock()`` sends that server no ``CLOCK``. Not on
a replicating server (refused ``UNSUPPORTED``: push, then pull; an END still ends the step).
"""
from __future__ import annotations

import struct
from enum import IntEnum
from typing import Dict, Optional, Sequence

import numpy as np

from ..arrays.dtypes import FLOATS

HEADER_LEN = 9
TAG_REQUEST = 7301
TAG_PAYLOAD = 7302
TAG_REPLY = 7303
TAG_FORWARD = 7304
TAG_FORWARD_PAYLOAD = 7305
TAG_FORWARD_ACK = 7306

DTYPES = tuple(np.dtype(name) for name in FLOATS)  # a header's DTYPE field is the index


class Op:
    """Request op codes (plain ints: a server compares them on every request)."""

    PULL = 1
    PUSH = 2
    PULL_ROWS = 3
    PUSH_ROWS = 4
    CLOCK = 5
    RELEASE = 6
    APPLY = 7      # primary -> backup only: BSP steps below CLOCK applied, COUNT = steps completed
    DONE = 8       # primary -> backup only: nothing more will be forwarded
    PUSH_PULL = 9  # a dense push of step CLOCK, answered with the piece's values read at CLOCK + 1
    PUSH_PULL_END = 10  # a PUSH_PULL after which the worker's clock is CLOCK + 1 (its step's last request)
    PULL_ROWS_MANY = 11  # the rows of several sparse tables (a directory, then their ids)
    PUSH_ROWS_MANY = 12  # the row gradients of several sparse tables


PAYLOADS_IN = {Op.PULL: 0, Op.PUSH: 1, Op.PULL_ROWS: 1, Op.PUSH_ROWS: 2, Op.CLOCK: 0, Op.RELEASE: 0,
               Op.APPLY: 0, Op.DONE: 0, Op.PUSH_PULL: 1, Op.PUSH_PULL_END: 1,
               Op.PULL_ROWS_MANY: 2, Op.PUSH_ROWS_MANY: 3}
ALL_OPS = frozenset(PAYLOADS_IN)
FUSED = frozenset({Op.PUSH_PULL, Op.PUSH_PULL_END})
MANY = frozenset({Op.PULL_ROWS_MANY, Op.PUSH_ROWS_MANY})
WORKER_OPS = frozenset({Op.PULL, Op.PUSH, Op.PULL_ROWS, Op.PUSH_ROWS, Op.CLOCK, Op.RELEASE}) | FUSED | MANY
REPLIED = frozenset({Op.PULL, Op.PUSH, Op.PULL_ROWS, Op.PUSH_ROWS}) | FUSED | MANY
PULLS = frozenset({Op.PULL, Op.PULL_ROWS, Op.PULL_ROWS_MANY})
PUSHES = frozenset({Op.PUSH, Op.PUSH_ROWS, Op.PUSH_ROWS_MANY}) | FUSED
DENSE_PUSHES = frozenset({Op.PUSH}) | FUSED
VALUES_BACK = PULLS | FUSED  # ops whose reply carries one payload
SPARSE_OPS = frozenset({Op.PULL_ROWS, Op.PUSH_ROWS})


class Req:
    """Fields of a request header (indices into it)."""

    OP = 0
    TABLE = 1
    SLOT = 2       # the worker's slot: a stable id (0..W-1 at start; newcomers get new ones)
    CLOCK = 3      # the worker's clock: steps it has finished; a push's step
    COUNT = 4      # elements (PULL, PUSH) or row ids (PULL_ROWS, PUSH_ROWS)
    DTYPE = 5      # index into DTYPES: the values' dtype on the wire (the table's, or float16:
    #                a push's gradient is widened on arrival, a pull's reply narrowed)
    WIDTH = 6      # elements per row (sparse ops), tables in the directory (MANY ops), 1 otherwise
    PAYLOADS = 7   # payload messages that follow, so a server can always drain them
    KEYS = 8       # sparse ops: the id list's number (key caching, ``key_cache``); 0: none.
    #                With one payload fewer than PAYLOADS_IN, the ids are not sent: the
    #                server uses the list it received with this number


# a CLOCK's COUNT, DTYPE and WIDTH: the finished step's [loss sum, correct, count] of the worker's
# share, as float64 bits, and its KEYS the read staleness the worker saw in it (the servers keep
# them: the step's records are the global batch's and survive a lost worker)
CLOCK_STATS, CLOCK_STALENESS = slice(Req.COUNT, Req.WIDTH + 1), Req.KEYS


class Rep:
    """Fields of a reply header (indices into it)."""

    OP = 0
    TABLE = 1
    SHARD = 2      # the answering shard's key
    STATUS = 3     # a Status
    VERSION = 4    # updates the table's piece had received when answered
    COUNT = 5      # elements in the reply payload (PUSH_ROWS_MANY: tables that were duplicates)
    DETAIL = 6     # the offending value of a refusal (an id, a size), else 0
    SLOWEST = 7    # the slowest live worker's clock when answered
    SPARE = 8      # 0


class Status(IntEnum):
    OK = 0
    DUPLICATE = 1      # a push already applied: acknowledged, not applied again
    UNKNOWN_OP = 2
    UNKNOWN_TABLE = 3
    WRONG_KIND = 4
    BAD_DTYPE = 5
    BAD_SIZE = 6
    BAD_IDS = 7
    NOT_OWNER = 8
    NONFINITE = 9
    LATE = 10
    WRONG_SLOT = 11
    KEYS_UNKNOWN = 12  # a cached id list this server does not hold: the worker sends the ids again
    UNSUPPORTED = 13   # PUSH_PULL on a replicating server (--ft): nothing applied


ACCEPTED = frozenset({Status.OK, Status.DUPLICATE})  # statuses of a request taken (not refused)
REASONS: Dict[Status, str] = {
    Status.UNKNOWN_OP: "unknown op code",
    Status.UNKNOWN_TABLE: "no table with this id",
    Status.WRONG_KIND: "dense op on a sparse table or sparse op on a dense table",
    Status.BAD_DTYPE: "dtype differs from the table's",
    Status.BAD_SIZE: "element count or payload size differs from the table's piece",
    Status.BAD_IDS: "row id out of range, or push ids not unique and sorted",
    Status.NOT_OWNER: "row id belongs to another shard (stale placement)",
    Status.NONFINITE: "gradient contains NaN or Inf; refused, parameters unchanged",
    Status.LATE: "BSP push for a step that was already applied",
    Status.WRONG_SLOT: "worker slot does not match the sending rank",
    Status.KEYS_UNKNOWN: "id list number not known here (send the ids)",
    Status.UNSUPPORTED: "push_pull is not served with replication (--ft): push, then pull",
}


def dtype_code(dtype) -> int:
    """Index of ``dtype`` in DTYPES, or -1."""
    try:
        return DTYPES.index(np.dtype(dtype))
    except (TypeError, ValueError):
        return -1


def wire_dtype(stored, wanted=None) -> np.dtype:
    """The dtype values stored as ``stored`` travel in: ``wanted`` (float16) when it is a
    narrower float than ``stored``, else ``stored``."""
    stored = np.dtype(stored)
    if wanted is None or stored.kind != "f" or np.dtype(wanted).itemsize >= stored.itemsize:
        return stored
    return np.dtype(wanted)


HEADER = struct.Struct(f"={HEADER_LEN}q")  # a header as bytes: HEADER_LEN native int64


def request(op: int, table: int, slot: int, clock: int, count: int = 0,
            dtype: int = 0, width: int = 1, keys: int = 0, cached: bool = False) -> bytes:
    """A request header (the payload count follows from the op; ``cached``: the ids of list
    number ``keys`` are not sent), as bytes: a worker makes one per request, and only sends it."""
    return HEADER.pack(op, table, slot, clock, count, dtype, width, PAYLOADS_IN[op] - cached, keys)


def clock_request(slot: int, clock: int, stats: Optional[np.ndarray], staleness: int,
                  share_only: bool = False) -> bytes:
    """A CLOCK header, carrying ``stats`` and ``staleness`` when given (``CLOCK_STATS``);
    ``share_only``: the clock already moved there (a push-pull ended the step): TABLE 1, and
    CLOCK the step's (it moves no clock)."""
    if stats is None:
        return request(Op.CLOCK, int(share_only), slot, clock - share_only)
    count, dtype, width = np.asarray(stats, dtype=np.float64).view(np.int64).tolist()  # the CLOCK_STATS fields
    return request(Op.CLOCK, int(share_only), slot, clock - share_only, count, dtype, width, keys=staleness)


def reply(fields: Sequence[int], shard: int, status: int, version: int = 0, count: int = 0,
          detail: int = 0, slowest: int = 0) -> bytes:
    """The reply header to the request whose header's ``fields`` (as ints) are given, as the
    bytes of HEADER_LEN int64 (packed, not a numpy array: a server makes one per request)."""
    return HEADER.pack(fields[Req.OP], fields[Req.TABLE], shard, int(status), int(version), count, detail,
                       slowest, 0)


def refusal(status: int, detail: int) -> Optional[str]:
    """Words for a refused reply's status (None when accepted)."""
    if status in ACCEPTED:
        return None
    try:
        reason = REASONS[Status(status)]
    except (ValueError, KeyError):
        reason = f"status {status}"
    return f"{reason} (detail: {detail})" if detail else reason

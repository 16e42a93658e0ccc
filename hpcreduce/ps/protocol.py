"""The wire protocol between PS workers and servers: ops, fixed int64 headers, tags.

Every message is a numpy buffer; nothing is pickled. A request is one header of
``HEADER_LEN`` int64 on ``TAG_REQUEST`` followed by ``payloads`` buffers on
``TAG_PAYLOAD`` (same source, so MPI's non-overtaking rule keeps them in order).
A reply is one header on ``TAG_REPLY`` followed, for the two pull ops, by exactly one
payload buffer on ``TAG_REPLY`` (empty when the request was refused). A server answers
each worker's requests in the order they were sent, so a worker posts its reply
receives when it sends and they match in order.

    op          request payloads          reply payload     acknowledged
    PULL        -                         piece values      yes (the values)
    PUSH        gradient of the piece     -                 yes
    PULL_ROWS   ids (int64)               rows              yes (the rows)
    PUSH_ROWS   ids (int64), row grads    -                 yes
    CLOCK       -                         -                 no
    RELEASE     -                         -                 no (the worker is done)

With fault tolerance (``--ft``, K >= 2) a server forwards every push it accepts to its
backup (the next shard key) on ``TAG_FORWARD`` (the worker's header, then its payloads on
``TAG_FORWARD_PAYLOAD``), plus ``APPLY`` (BSP: the steps it applied) and ``DONE`` (it
forwards no more); the backup answers each forwarded push with one header on
``TAG_FORWARD_ACK``, and only then does the primary acknowledge the worker.
"""
from __future__ import annotations

from enum import IntEnum
from typing import Dict, Optional

import numpy as np

HEADER_LEN = 8
TAG_REQUEST = 7301
TAG_PAYLOAD = 7302
TAG_REPLY = 7303
TAG_FORWARD = 7304
TAG_FORWARD_PAYLOAD = 7305
TAG_FORWARD_ACK = 7306

DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


class Op(IntEnum):
    PULL = 1
    PUSH = 2
    PULL_ROWS = 3
    PUSH_ROWS = 4
    CLOCK = 5
    RELEASE = 6
    APPLY = 7      # primary -> backup only: BSP steps below CLOCK applied, COUNT = steps completed
    DONE = 8       # primary -> backup only: nothing more will be forwarded


PAYLOADS_IN = {Op.PULL: 0, Op.PUSH: 1, Op.PULL_ROWS: 1, Op.PUSH_ROWS: 2, Op.CLOCK: 0, Op.RELEASE: 0,
               Op.APPLY: 0, Op.DONE: 0}
WORKER_OPS = (Op.PULL, Op.PUSH, Op.PULL_ROWS, Op.PUSH_ROWS, Op.CLOCK, Op.RELEASE)
REPLIED = (Op.PULL, Op.PUSH, Op.PULL_ROWS, Op.PUSH_ROWS)
PULLS = (Op.PULL, Op.PULL_ROWS)
PUSHES = (Op.PUSH, Op.PUSH_ROWS)
SPARSE_OPS = (Op.PULL_ROWS, Op.PUSH_ROWS)


class Req(IntEnum):
    """Fields of a request header."""

    OP = 0
    TABLE = 1
    SLOT = 2       # the worker's slot: a stable id (0..W-1 at start; newcomers get new ones)
    CLOCK = 3      # the worker's clock: steps it has finished; a push's step
    COUNT = 4      # elements (PULL, PUSH) or row ids (PULL_ROWS, PUSH_ROWS)
    DTYPE = 5      # index into DTYPES
    WIDTH = 6      # elements per row (sparse ops), 1 otherwise
    PAYLOADS = 7   # payload messages that follow, so a server can always drain them


class Rep(IntEnum):
    """Fields of a reply header."""

    OP = 0
    TABLE = 1
    SHARD = 2      # the answering shard's key
    STATUS = 3     # a Status
    VERSION = 4    # updates the table's piece had received when answered
    COUNT = 5      # elements in the reply payload
    DETAIL = 6     # the offending value of a refusal (an id, a size), else 0
    SLOWEST = 7    # the slowest live worker's clock when answered


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
}


def dtype_code(dtype) -> int:
    """Index of ``dtype`` in DTYPES, or -1."""
    try:
        return DTYPES.index(np.dtype(dtype))
    except (TypeError, ValueError):
        return -1


def request(op: Op, table: int, slot: int, clock: int, count: int = 0,
            dtype: int = 0, width: int = 1) -> np.ndarray:
    """A request header (the payload count follows from the op)."""
    return np.array([op, table, slot, clock, count, dtype, width, PAYLOADS_IN[op]], dtype=np.int64)


def reply(header: np.ndarray, shard: int, status: Status, *, version: int = 0, count: int = 0,
          detail: int = 0, slowest: int = 0) -> np.ndarray:
    """The reply header to request ``header``."""
    return np.array([header[Req.OP], header[Req.TABLE], shard, status, version, count, detail,
                     slowest], dtype=np.int64)


def refusal(status: int, detail: int) -> Optional[str]:
    """Words for a refused reply's status (None when accepted)."""
    if status in (Status.OK, Status.DUPLICATE):
        return None
    try:
        reason = REASONS[Status(status)]
    except (ValueError, KeyError):
        reason = f"status {status}"
    return f"{reason} (detail: {detail})" if detail else reason

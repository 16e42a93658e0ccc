"""Sandblaster's wire protocol: roles, message kinds, vector names, vector-op codes, tags.

Every message is a numpy buffer; nothing is pickled. Three conversations:

    coordinator -> server   header [OPS, n], then float64 (n, 6) op rows on TAG_PAYLOAD;
                            reply float64 (n,) on TAG_REPLY (a dot's partial, else 0)
                            [RECORD, n], then float64 (n,) the committed state (``record``);
                            reply [ACK]
    worker -> server        [FETCH, pass, 0, slice]: reply the current point of that slice
                            (float64); [PUSH, pass, u, slice], then int64 unit ids (u) and the
                            float64 gradient slice on TAG_PAYLOAD; reply [ACK, applied or not]
    worker <-> coordinator  float64 [kind, pass, unit, pushed, loss, correct, count, 0] on
                            TAG_WORK; reply int64 [keep, action, pass, unit, push_first, iteration]
    server -> server        SYNC: each slice's accumulator, primary to replica, on TAG_SYNC

An op row is [code, a, b, c, alpha, beta] on named vectors (``VectorNames``); a server
applies a message's rows in order. Cost: a batch of n ops is 48n + 16 bytes out and 8n back
per server; a fetch or push moves the slice (8 bytes an element) once per server; a SYNC
moves each slice once more, from its primary to its replica (once per pass, with ``--ft``).
"""
from __future__ import annotations

from enum import IntEnum
from typing import Tuple

import numpy as np

TAG_REQUEST = 7401
TAG_PAYLOAD = 7402
TAG_REPLY = 7403
TAG_WORK = 7404
TAG_ANSWER = 7405
TAG_SYNC = 7406
HEADER_LEN = 4
WORK_LEN = 8
ANSWER_LEN = 6
ROW = 6


class Kind(IntEnum):
    OPS = 1      # coordinator: a batch of vector ops
    FETCH = 2    # worker: the current point's slice
    PUSH = 3     # worker: accumulated gradient of some units
    ACK = 4      # server -> worker: push handled
    STOP = 5     # coordinator: the run is over
    RECORD = 6   # coordinator: its committed state, kept by every server


class Code(IntEnum):
    """Vector ops (a, b, c vector ids; alpha, beta scalars); the result is 0 unless said."""

    DOT = 1      # result a . b
    AXPY = 2     # b += alpha a
    SCALE = 3    # a *= alpha
    LINCOMB = 4  # b = alpha a + beta c  (b may be a or c)
    BEGIN = 5    # pass alpha of iteration beta at point a: acc = 0, forget the units applied
    SYNC = 6     # every slice's acc from its primary to its replica (servers exchange)


class Work(IntEnum):
    """Fields of a worker's message to the coordinator."""

    KIND = 0     # ASK or DONE
    PASS = 1
    UNIT = 2     # the unit computed (DONE)
    PUSHED = 3   # 1: every unit it was told to keep is now on the servers
    LOSS = 4
    CORRECT = 5
    COUNT = 6


ASK, DONE = 0, 1


class Action(IntEnum):
    UNIT = 0     # compute ``unit`` of ``pass``
    FLUSH = 1    # push what you hold and ask again
    STOP = 2     # the run is over


def header(kind: Kind, *values: int) -> np.ndarray:
    out = np.zeros(HEADER_LEN, np.int64)
    out[0] = kind
    out[1:1 + len(values)] = values
    return out


def answer(keep: bool, action: Action, pass_id: int = -1, unit: int = -1, push_first: bool = False,
           iteration: int = 0) -> np.ndarray:
    return np.array([keep, action, pass_id, unit, push_first, iteration], np.int64)


class VectorNames:
    """Ids of the named vectors a server holds for L-BFGS memory ``history``: x[0], x[1],
    g[0], g[1] (double buffered: committed point c, trial 1-c), d, q, acc, and ``history`` + 1
    slots of (s_i, y_i) pairs (one spare, written before the pair is known to be kept)."""

    X, G, D, Q, ACC = (0, 1), (2, 3), 4, 5, 6

    def __init__(self, history: int):
        self.slots = history + 1
        self.count = 7 + 2 * self.slots

    def s(self, i: int) -> int:
        return 7 + i

    def y(self, i: int) -> int:
        return 7 + self.slots + i


def slice_bounds(length: int, servers: int, server: int) -> Tuple[int, int]:
    """[lo, hi) of server ``server``'s equal cut of a vector of ``length`` elements."""
    base, extra = divmod(length, servers)
    lo = server * base + min(server, extra)
    return lo, lo + base + (server < extra)

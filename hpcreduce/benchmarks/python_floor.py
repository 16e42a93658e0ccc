"""The least one request and its reply cost in Python over mpi4py: the floor under ``bench ps``'s latency row.

A worker sends a request header (``HEADER_LEN`` int64, as the PS sends) and waits for the reply
header and the payload. The server posts a receive for any worker's header and polls it with
``Test``, as the PS server's wait does. It then reads the header's fields, builds the reply header
and sends both. Nothing else happens: no checks, queues, consistency or statistics.

A PS request's time above this loop's is the protocol's own Python; this loop's time above raw
point-to-point is Python's and mpi4py's share, which no server written in Python avoids.
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
from mpi4py import MPI

from ..ps.protocol import HEADER_LEN

TAG_REQUEST, TAG_REPLY = 7402, 7403


def ask(comm: MPI.Intracomm, pairs: Dict[int, Tuple[int, int]], reps: int) -> None:
    """``reps`` requests to each server rank of ``pairs`` (rank -> (bytes up, bytes down)), each answered
    with a header and ``bytes down`` of payload."""
    header = np.zeros(HEADER_LEN, np.int64)
    replies = {rank: (np.zeros(HEADER_LEN, np.int64), np.empty(down, np.uint8)) for rank, (_, down) in pairs.items()}
    for rep in range(reps):
        header[3] = rep  # the request's clock field
        requests = []
        for rank, (reply, body) in replies.items():
            requests += [comm.Irecv(reply, rank, TAG_REPLY), comm.Irecv(body, rank, TAG_REPLY),
                         comm.Isend(header, rank, TAG_REQUEST)]
        MPI.Request.Waitall(requests)


def answer(comm: MPI.Intracomm, requests: int, down: int) -> None:
    """Answer ``requests`` requests from any rank, each with a reply header and ``down`` bytes."""
    body, status = np.ones(down, np.uint8), MPI.Status()
    for _ in range(requests):
        header = np.zeros(HEADER_LEN, np.int64)
        pending = comm.Irecv(header, MPI.ANY_SOURCE, TAG_REQUEST)
        while not pending.Test(status):
            pass
        fields, source = header.tolist(), status.Get_source()
        reply = np.array([fields[0], fields[1], 0, 0, 0, down, 0, 0, 0], np.int64)
        MPI.Request.Waitall([comm.Isend(reply, source, TAG_REPLY), comm.Isend(body, source, TAG_REPLY)])

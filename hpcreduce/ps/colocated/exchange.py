"""A colocated call's first message to every rank: its count header and its items, posted together.

``post`` sends every rank its header row (this rank's problem, the call's signature, the step,
the bytes of each part of its items, their counts per segment) and its blocks of the parts (ids;
a push's gradients), all posted at once; ``receive`` takes every rank's header, then its parts
(their sizes are in the header). The
caller checks the headers (``checks.refuse``) before anything is applied: one round where a
header exchange followed by the items took two. Point-to-point on the library's duplicate
communicator; under ULFM a dead peer makes the receive raise, as a collective would.
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np
from mpi4py import MPI

from ...runtime.failures import wait_all
from .flat import offsets

HEAD = 5  # header fields before the counts: problem, call signature, step, then the bytes of each part
PARTS = 2  # a call's items come in at most two parts (ids; a push's gradients)
HEAD_TAG, ITEMS_TAG = 0x4C01, 0x4C02


def post(comm: MPI.Intracomm, headers: np.ndarray, parts: List[np.ndarray]) -> List[MPI.Request]:
    """Send rank r ``headers[r]`` (int64; field 3 + i: the bytes of its block of part i) and its
    block of each part (uint8, blocks in rank order; an empty block is not sent); the requests."""
    requests = []
    starts = [offsets(headers[:, 3 + i]) for i in range(len(parts))]
    for r in range(comm.Get_size()):
        requests.append(comm.Isend([headers[r], MPI.INT64_T], r, HEAD_TAG))
        for i, part in enumerate(parts):
            if headers[r, 3 + i]:
                requests.append(comm.Isend([part[starts[i][r]:starts[i][r] + headers[r, 3 + i]], MPI.BYTE], r,
                                           ITEMS_TAG + i))
    return requests


def receive(comm: MPI.Intracomm, fields: int) -> Tuple[np.ndarray, List[np.ndarray]]:
    """Every rank's header row for this one (``fields`` int64 each) and each part of its items,
    concatenated in rank order."""
    size = comm.Get_size()
    headers = np.empty((size, fields), np.int64)
    wait_all([comm.Irecv([headers[r], MPI.INT64_T], r, HEAD_TAG) for r in range(size)])
    parts, requests = [], []
    for i in range(PARTS):
        block = headers[:, 3 + i]
        starts = offsets(block)
        parts.append(np.empty(int(block.sum()), np.uint8))
        requests += [comm.Irecv([parts[i][starts[r]:starts[r] + block[r]], MPI.BYTE], r, ITEMS_TAG + i)
                     for r in range(size) if block[r]]
    wait_all(requests)
    return headers, parts

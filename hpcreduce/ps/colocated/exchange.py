"""A colocated call's first message to every rank: its count header and its items, posted together.

``post`` sends every rank its header row (this rank's problem, the call's signature, the step,
the items' bytes, their counts per segment) and its block of items as two messages posted at
once; ``receive`` takes every rank's header, then its items (their size is in the header). The
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

HEAD = 4  # header fields before the counts: problem, call signature, step, item bytes
HEAD_TAG, ITEMS_TAG = 0x4C01, 0x4C02


def post(comm: MPI.Intracomm, headers: np.ndarray, items: np.ndarray) -> List[MPI.Request]:
    """Send rank r ``headers[r]`` (int64; field 3: the bytes of its block) and its block of
    ``items`` (uint8, blocks in rank order); the send requests."""
    block = headers[:, 3]
    starts = offsets(block)
    requests = []
    for r in range(comm.Get_size()):
        requests.append(comm.Isend([headers[r], MPI.INT64_T], r, HEAD_TAG))
        requests.append(comm.Isend([items[starts[r]:starts[r] + block[r]], MPI.BYTE], r, ITEMS_TAG))
    return requests


def receive(comm: MPI.Intracomm, fields: int) -> Tuple[np.ndarray, np.ndarray]:
    """Every rank's header row for this one (``fields`` int64 each) and its items, concatenated
    in rank order."""
    size = comm.Get_size()
    headers = np.empty((size, fields), np.int64)
    wait_all([comm.Irecv([headers[r], MPI.INT64_T], r, HEAD_TAG) for r in range(size)])
    block = headers[:, 3]
    starts = offsets(block)
    received = np.empty(int(block.sum()), np.uint8)
    wait_all([comm.Irecv([received[starts[r]:starts[r] + block[r]], MPI.BYTE], r, ITEMS_TAG)
              for r in range(size)])
    return headers, received

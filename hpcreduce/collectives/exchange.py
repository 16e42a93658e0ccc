"""The shared-memory exchange: every rank's header row (and a small payload) to every rank
of one node, with no message.

Each rank writes its row (HEADER_WORDS int64: a sequence number, then up to 15 values) and
its payload into its own part of an MPI-3 shared window (fenced with ``MPI_Win_sync`` where
the processor may reorder stores, see STORES_IN_ORDER), then stores the call's sequence
number in the row's first word (one aligned 8-byte store); every rank waits until each row
carries that number (keeping MPI's progress engine turning meanwhile, see SPINS), then reads
them all. The window holds two sets of rows and payloads, used by the sequence number's
parity: a rank that has read every row of exchange k may already write its row of k + 1,
since the set of k + 1 was last read in exchange k - 1, which every rank has finished.
Cost: per rank, its payload written once and the N headers read; the only wait is for the
slowest rank to arrive (no message, no barrier). It is made only where every rank shares one
node and fault tolerance is off: a rank that dies while the others wait on its row would never
be reported (ULFM's failure detection sees messages, not memory).
"""
from __future__ import annotations

import os
import platform
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

HEADER_WORDS = 16
"""A row: the sequence number and up to 15 int64 values (a check's key and fields)."""
ROW_BYTES = HEADER_WORDS * 8

PAYLOAD_BYTES = 256 * 1024
READ_BYTES = 1 << 20
"""A rank's payload area holds PAYLOAD_BYTES, or READ_BYTES / N where that is less: the one-shot
allreduce's largest message, so that no rank reads more than 1 MiB of its peers' inputs."""

SPINS = 64
"""Looks at a peer's row between two turns of MPI's progress engine (a late peer may be waiting
for one of this rank's messages, which over tcp moves only while this rank calls MPI). Like
MPI's own waits, a rank yields its core (``sched_yield``) at those turns only where its node
has more ranks than cores to run them (``node_cores``): otherwise a yield can hand the core to another thread for a whole
time slice (measured: one-shot at 64 KiB took 96-131 us instead of 17-28 us in most runs)."""

FEW = 8
"""Up to this many ranks, rows are waited for and compared one by one (a few Python calls);
above it, all at once by numpy (one call, whatever the number)."""

STORES_IN_ORDER = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
"""x86 makes a core's stores visible in program order and keeps loads in order (TSO), so the
row needs no memory barrier before its sequence number there; elsewhere (Arm, POWER) each
exchange fences with ``MPI_Win_sync``."""


class SharedExchange:
    """The rows and payloads of the ranks of ``node`` (collective to make and to ``free``)."""

    def __init__(self, node: MPI.Intracomm) -> None:
        self.rank, self.size = node.Get_rank(), node.Get_size()
        self.capacity = min(PAYLOAD_BYTES, READ_BYTES // self.size // 8 * 8)
        part = ROW_BYTES + self.capacity
        total = 2 * self.size * part
        self.window = MPI.Win.Allocate_shared(total if self.rank == 0 else 0, 8, comm=node)
        self.window.Lock_all(MPI.MODE_NOCHECK)
        self.node = node
        self.oversubscribed = self.size > len(node_cores(node))
        memory, _ = self.window.Shared_query(0)
        self.bytes = memoryview(memory).cast("B")[:total]
        self.words = self.bytes.cast("q")
        self.parts = np.frombuffer(self.bytes, np.uint8).reshape(2, self.size, part)
        if self.rank == 0:
            self.parts[...] = 0
        self.window.Sync()
        node.Barrier()
        self.window.Sync()
        starts = [[(p * self.size + r) * part for r in range(self.size)] for p in (0, 1)]
        self.flag_words = [[start // 8 for start in row] for row in starts]
        self.peer_flags = [[w for r, w in enumerate(words) if r != self.rank] for words in self.flag_words]
        self.row_spans = [[(start + 8, start + ROW_BYTES) for start in row] for row in starts]
        self.peer_rows = [[span for r, span in enumerate(spans) if r != self.rank] for spans in self.row_spans]
        headers = [self.parts[p, :, :ROW_BYTES].view(np.int64) for p in (0, 1)]
        self.flags = [rows[:, 0] for rows in headers]
        self.bodies = [rows[:, 1:] for rows in headers]
        self.sequence = 0
        self._views: Dict[Tuple[np.dtype, int], List[np.ndarray]] = {}

    def publish(self, row: bytes, payload: Optional[np.ndarray] = None,
                areas: Optional[List[np.ndarray]] = None) -> int:
        """Publish ``row`` (``header_row(...).tobytes()``) and ``payload`` (copied into
        ``areas[parity]``: this rank's ``payloads(...)`` of the parity), wait until every rank
        has published, and return the exchange's parity: the rows are then ``rows(parity)``
        (``same`` compares them) and the payloads ``payloads(...)[parity]``, valid until this
        rank's next ``publish``."""
        sequence = self.sequence = self.sequence + 1
        parity = sequence & 1
        if payload is not None:
            areas[parity][...] = payload
        start, end = self.row_spans[parity][self.rank]
        self.bytes[start:end] = row
        if not STORES_IN_ORDER:
            self.window.Sync()
        words = self.words
        words[self.flag_words[parity][self.rank]] = sequence
        if self.size > FEW:
            flags, spins = self.flags[parity], 0
            while not (flags == sequence).all():
                spins += 1
                if spins % SPINS == 0:
                    self._idle()
        for flag in self.peer_flags[parity]:
            spins = 0
            while words[flag] != sequence:
                spins += 1
                if spins % SPINS == 0:
                    self._idle()
        if not STORES_IN_ORDER:
            self.window.Sync()
        return parity

    def _idle(self) -> None:
        """Every SPINS looks at a late peer's row: turn MPI's progress engine (``MPI_Iprobe``
        does) and, on an oversubscribed node, yield the core."""
        self.node.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        if self.oversubscribed:
            os.sched_yield()

    def same(self, parity: int, row: bytes) -> bool:
        """Whether every rank published ``row`` in the exchange of ``parity``."""
        if self.size > FEW:
            return bool((self.bodies[parity] == np.frombuffer(row, np.int64)).all())
        memory = self.bytes
        for start, end in self.peer_rows[parity]:
            if memory[start:end] != row:
                return False
        return True

    def rows(self, parity: int) -> np.ndarray:
        """Every rank's row of the exchange of ``parity`` (HEADER_WORDS - 1 int64 each), by rank."""
        return self.bodies[parity]

    def payloads(self, dtype: np.dtype, count: int) -> List[np.ndarray]:
        """Per parity, the payload areas as an (N, ``count``) array of ``dtype``: row r is rank
        r's (views made once)."""
        views = self._views.get((dtype, count))
        if views is None:
            nbytes = count * dtype.itemsize
            if nbytes > self.capacity:
                raise ValueError(f"a payload of {nbytes} bytes exceeds the exchange's {self.capacity}")
            views = self._views[(dtype, count)] = [
                self.parts[p, :, ROW_BYTES:ROW_BYTES + nbytes].view(dtype) for p in (0, 1)]
        return views

    def free(self) -> None:
        self._views.clear()
        self.bodies = self.flags = self.parts = self.words = self.bytes = self.node = None
        self.window.Unlock_all()
        self.window.Free()


def node_cores(node: MPI.Intracomm) -> set:
    """The cores the ranks of ``node`` may run on: the union of their affinities (collective),
    so ranks bound one to a core count as many cores, and a job confined to fewer cores than
    its ranks (``--oversubscribe``, a Slurm cgroup) as oversubscribed."""
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return set().union(*node.allgather(mine))


def header_row(values: Sequence[int]) -> bytes:
    """The row a rank publishes for ``values``: their count, then the values, zero-padded."""
    if len(values) > HEADER_WORDS - 2:
        raise ValueError(f"a header holds at most {HEADER_WORDS - 2} values, got {len(values)}")
    row = np.zeros(HEADER_WORDS - 1, np.int64)
    row[0], row[1:1 + len(values)] = len(values), values
    return row.tobytes()

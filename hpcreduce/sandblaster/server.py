"""A Sandblaster parameter-server rank: named vectors on its slices, vector ops, pushes, records.

A server holds, for each slice it keeps (``placement``: the ones it serves, and with fault
tolerance the one it backs up), slice [lo, hi) of every named vector (``VectorNames``), and
answers, in arrival order, the coordinator's op batches and records and the workers'
fetches and pushes until the coordinator says STOP. Op batches apply to every slice it
keeps; a dot's result counts only the slices it serves. Pushes of a pass are deduplicated
by unit id: a push holding a unit already applied in that pass is acknowledged and
discarded (``duplicates``). ``SYNC`` sends each served slice's accumulator to its replica.
Cost: per op O(hi - lo) flops a slice kept; per fetch or push the slice's 8 bytes an
element; per SYNC each served slice once more, to its replica.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Set

import numpy as np
from mpi4py import MPI

from ..runtime.context import Traffic
from ..runtime.idle import receive, wait_each
from .placement import NONE, Placement
from .protocol import ROW, TAG_PAYLOAD, TAG_REPLY, TAG_REQUEST, TAG_SYNC, Code, Kind, VectorNames, header


class SliceVectors:
    """The named vectors of one slice and the ops on them."""

    def __init__(self, names: VectorNames, initial: np.ndarray):
        self.names = names
        self.vectors = np.zeros((names.count, len(initial)))
        self.vectors[names.X[0]] = initial
        self.pass_id, self.point = -1, names.X[0]
        self.applied: Set[int] = set()
        self.duplicates = 0

    def apply(self, row: np.ndarray) -> float:
        """Apply one op row [code, a, b, c, alpha, beta]; its result (a dot's, else 0)."""
        code, a, b, c, alpha, beta = row
        a, b, c = int(a), int(b), int(c)
        v = self.vectors
        if code == Code.DOT:
            return float(v[a] @ v[b])
        if code == Code.AXPY:
            v[b] += alpha * v[a]
        elif code == Code.SCALE:
            v[a] *= alpha
        elif code == Code.LINCOMB:
            v[b] = alpha * v[a] + beta * v[c]
        elif code == Code.BEGIN:
            v[self.names.ACC] = 0.0
            self.pass_id, self.point = int(alpha), a
            self.applied = set()
        else:
            raise ValueError(f"sandblaster server: unknown op code {code}")
        return 0.0

    def push(self, pass_id: int, units: np.ndarray, gradient: np.ndarray) -> bool:
        """Add a push to the pass accumulator unless it is stale or repeats a unit."""
        if pass_id != self.pass_id or self.applied.intersection(units.tolist()):
            self.duplicates += 1
            return False
        self.applied.update(units.tolist())
        self.vectors[self.names.ACC] += gradient
        return True


class ServerState:
    """What one server rank keeps across recoveries: its slices' vectors and the coordinator's records."""

    def __init__(self, slices: Dict[int, SliceVectors]):
        self.slices = slices
        self.records: List[np.ndarray] = []
        self.pending: List[MPI.Request] = []

    @property
    def duplicates(self) -> int:
        return sum(vectors.duplicates for vectors in self.slices.values())

    def apply(self, comm: MPI.Intracomm, placement: Placement, rows: np.ndarray, traffic: Traffic,
              on_begin: Callable[[int], None]) -> np.ndarray:
        """Apply op rows in order to every slice kept; each row's result summed over the slices served."""
        me, results = comm.Get_rank(), np.zeros(len(rows))
        for i, row in enumerate(rows):
            if row[0] == Code.SYNC:
                self._sync(comm, placement, traffic)
                continue
            if row[0] == Code.BEGIN:
                on_begin(int(row[5]))
            for s, vectors in self.slices.items():
                result = vectors.apply(row)
                if placement.primary[s] == me:
                    results[i] += result
        return results

    def _sync(self, comm: MPI.Intracomm, placement: Placement, traffic: Traffic) -> None:
        """Each served slice's accumulator to its replica; the backed-up slices' from their primaries."""
        me = comm.Get_rank()
        for s in sorted(self.slices):
            acc = self.slices[s].vectors[self.slices[s].names.ACC]
            if placement.primary[s] == me and placement.replica[s] != NONE:
                self.pending.append(comm.Isend(acc, dest=placement.replica[s], tag=TAG_SYNC))
                traffic.add(acc.nbytes, 0)
            elif placement.replica[s] == me:
                self.pending.append(comm.Irecv(acc, source=placement.primary[s], tag=TAG_SYNC))
                traffic.add(0, acc.nbytes)
        wait_each(self.pending)
        self.pending = []


def serve(comm: MPI.Intracomm, state: ServerState, placement: Placement, traffic: Traffic,
          on_begin: Callable[[int], None] = lambda iteration: None) -> None:
    """Answer requests on ``comm`` until the coordinator sends STOP (payload bytes into ``traffic``);
    ``on_begin(iteration)`` at each pass's BEGIN."""
    head = np.zeros(4, np.int64)
    status = MPI.Status()
    while True:
        receive(comm, head, MPI.ANY_SOURCE, TAG_REQUEST, status)
        source, kind = status.Get_source(), int(head[0])
        if kind == Kind.STOP:
            return
        if kind == Kind.OPS:
            rows = np.empty((int(head[1]), ROW))
            receive(comm, rows, source, TAG_PAYLOAD)
            results = state.apply(comm, placement, rows, traffic, on_begin)
            comm.Send(results, dest=source, tag=TAG_REPLY)
            traffic.add(results.nbytes, rows.nbytes)
        elif kind == Kind.RECORD:
            record = np.empty(int(head[1]))
            receive(comm, record, source, TAG_PAYLOAD)
            state.records.append(record)
            comm.Send(header(Kind.ACK), dest=source, tag=TAG_REPLY)
            traffic.add(0, record.nbytes)
        elif kind == Kind.FETCH:
            vectors = state.slices[int(head[3])]
            comm.Send(vectors.vectors[vectors.point], dest=source, tag=TAG_REPLY)
            traffic.add(vectors.vectors.shape[1] * 8, 0)
        elif kind == Kind.PUSH:
            vectors = state.slices[int(head[3])]
            units, gradient = np.empty(int(head[2]), np.int64), np.empty(vectors.vectors.shape[1])
            receive(comm, units, source, TAG_PAYLOAD)
            receive(comm, gradient, source, TAG_PAYLOAD)
            traffic.add(0, units.nbytes + gradient.nbytes)
            applied = vectors.push(int(head[1]), units, gradient)
            comm.Send(header(Kind.ACK, int(applied)), dest=source, tag=TAG_REPLY)
        else:
            raise ValueError(f"sandblaster server: unknown request kind {kind} from rank {source}")

"""A Sandblaster parameter-server shard: named vectors on one slice, vector ops, pushes.

The server holds slice [lo, hi) of every named vector (``VectorNames``) and answers, in
arrival order, the coordinator's op batches and the workers' fetches and pushes until
the coordinator says STOP. Pushes of a pass are deduplicated by unit id: a push holding
a unit already applied in that pass is acknowledged and discarded (``duplicates``).
Cost: per op O(hi - lo) flops; per fetch or push the slice's 8 bytes an element.
"""
from __future__ import annotations

from typing import Set

import numpy as np
from mpi4py import MPI

from ..runtime.context import Traffic
from .protocol import ROW, TAG_PAYLOAD, TAG_REPLY, TAG_REQUEST, Code, Kind, VectorNames, header


class SliceVectors:
    """The named vectors of one slice and the ops on them."""

    def __init__(self, names: VectorNames, initial: np.ndarray):
        self.names = names
        self.vectors = np.zeros((names.count, len(initial)))
        self.vectors[names.X[0]] = initial
        self.pass_id, self.point = -1, names.X[0]
        self.applied: Set[int] = set()
        self.duplicates = 0

    def apply(self, rows: np.ndarray) -> np.ndarray:
        """Apply op rows [code, a, b, c, alpha, beta] in order; each row's result (dots)."""
        results = np.zeros(len(rows))
        v = self.vectors
        for i, (code, a, b, c, alpha, beta) in enumerate(rows):
            a, b, c = int(a), int(b), int(c)
            if code == Code.DOT:
                results[i] = float(v[a] @ v[b])
            elif code == Code.AXPY:
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
        return results

    def push(self, pass_id: int, units: np.ndarray, gradient: np.ndarray) -> bool:
        """Add a push to the pass accumulator unless it is stale or repeats a unit."""
        if pass_id != self.pass_id or self.applied.intersection(units.tolist()):
            self.duplicates += 1
            return False
        self.applied.update(units.tolist())
        self.vectors[self.names.ACC] += gradient
        return True


def serve(comm: MPI.Intracomm, vectors: SliceVectors, traffic: Traffic) -> None:
    """Answer requests on ``comm`` until the coordinator sends STOP (payload bytes into ``traffic``)."""
    head = np.zeros(4, np.int64)
    status = MPI.Status()
    width = vectors.vectors.shape[1]
    gradient = np.zeros(width)
    while True:
        comm.Recv(head, source=MPI.ANY_SOURCE, tag=TAG_REQUEST, status=status)
        source, kind = status.Get_source(), int(head[0])
        if kind == Kind.STOP:
            return
        if kind == Kind.OPS:
            rows = np.empty((int(head[1]), ROW))
            comm.Recv(rows, source=source, tag=TAG_PAYLOAD)
            results = vectors.apply(rows)
            comm.Send(results, dest=source, tag=TAG_REPLY)
            traffic.add(results.nbytes, rows.nbytes)
        elif kind == Kind.FETCH:
            comm.Send(vectors.vectors[vectors.point], dest=source, tag=TAG_REPLY)
            traffic.add(gradient.nbytes, 0)
        elif kind == Kind.PUSH:
            units = np.empty(int(head[2]), np.int64)
            comm.Recv(units, source=source, tag=TAG_PAYLOAD)
            comm.Recv(gradient, source=source, tag=TAG_PAYLOAD)
            traffic.add(0, units.nbytes + gradient.nbytes)
            applied = vectors.push(int(head[1]), units, gradient)
            comm.Send(header(Kind.ACK, int(applied)), dest=source, tag=TAG_REPLY)
        else:
            raise ValueError(f"sandblaster server: unknown request kind {kind} from rank {source}")

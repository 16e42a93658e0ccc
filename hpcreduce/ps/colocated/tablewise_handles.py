"""Table-wise tables' placement and call handles (``tablewise``).

``owners``: each table's home rank; ``PoolHandle``: pooled rows (or rows read) on their way
back; ``PooledPush``: pooled gradients on their way to the owners, applied when waited (with
every push before it).
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ...errors import PSInputError
from ...runtime.failures import wait_all
from ..tables import ParamSpec


def owners(specs: Sequence[ParamSpec], ranks: int) -> np.ndarray:
    """The rank holding each table: largest first (then by position), each to the rank with
    the fewest bytes so far (the lowest on a tie)."""
    size = [int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize for spec in specs]
    load, out = [0] * ranks, np.zeros(len(specs), np.int64)
    for t in sorted(range(len(specs)), key=lambda t: (-size[t], t)):
        out[t] = min(range(ranks), key=lambda r: (load[r], r))
        load[out[t]] += size[t]
    return out


class PoolHandle:
    """Pooled rows on their way back; ``wait()`` -> per table, (its bags, dim) rows."""

    def __init__(self, request: MPI.Request, received: np.ndarray, pieces: List[Tuple[int, int, int]],
                 specs: Sequence[ParamSpec], collective: Callable):
        self.request, self.received, self.pieces, self.specs = request, received, pieces, specs
        self.collective = collective
        self._result: Optional[List[np.ndarray]] = None
        self.abandoned = False

    @property
    def done(self) -> bool:
        return self._result is not None or self.abandoned

    def wait(self) -> List[np.ndarray]:
        interrupted(self)
        if self._result is None:
            self.collective(lambda: wait_all([self.request]))
            out: List[Optional[np.ndarray]] = [None] * len(self.specs)
            for t, start, size in self.pieces:
                spec = self.specs[t]
                out[t] = self.received[start:start + size].view(spec.dtype).reshape((-1,) + tuple(spec.shape[1:]))
            self._result = out
        return self._result


class RowsHandle:
    """Rows read from their owners; ``wait()`` -> {table: rows aligned with the ids asked for}."""

    def __init__(self, arriving: PoolHandle, asked: dict, specs: Sequence[ParamSpec]):
        self.arriving, self.asked, self.specs = arriving, asked, specs

    def wait(self) -> dict:
        rows = self.arriving.wait()
        return {self.specs[t].name: rows[t][inverse] for t, (_, inverse) in self.asked.items()}


class PooledPush:
    """Pooled gradients on their way to the tables' owners; ``wait()`` applies them (with every
    push made before it, in order: ``settle(push)``, the tables')."""

    def __init__(self, settle: Callable[["PooledPush"], None], requests: List[MPI.Request], scale: float,
                 what: Tuple):
        self.settle, self.requests, self.scale, self.what = settle, requests, scale, what
        self.done = self.abandoned = False

    def wait(self) -> None:
        interrupted(self)
        self.settle(self)
        interrupted(self)


def interrupted(handle) -> None:
    """``PSInputError`` for a call a process failure interrupted (``recover`` abandoned it)."""
    if handle.abandoned:
        raise PSInputError("this call was interrupted by a process failure and abandoned in recover(): "
                           "make the step's calls again")


def row_bytes(spec: ParamSpec) -> int:
    return int(np.prod(spec.shape[1:], dtype=np.int64)) * np.dtype(spec.dtype).itemsize

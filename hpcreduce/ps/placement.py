"""Where every parameter lives: one pure function shared by servers and workers.

Dense tables are laid end to end (in ``param_specs`` order) and the byte range is cut
into ``len(shards)`` equal parts; a table at least ``SPLIT_BYTES`` large is cut at
the part boundaries (rounded to whole elements), so one big tensor spreads over several
shards, while a smaller one goes whole to the part holding its middle byte, so small
tensors are packed together. Sparse rows go to shards by rendezvous hashing of
(table, row id, shard key): every shard scores every row and the highest score owns it.

Shards are named by *keys*, stable integers (the server index at start), not by rank,
so the placement can be recomputed for another set of shards (``place(specs,
surviving_keys)``, the fault-tolerance layer's rebalance): dense ranges are re-cut
over the survivors, and a sparse row moves only if its owner left (rendezvous hashing).
Cost: O(tables + shards) to place; O(rows x shards) hash evaluations to find owners
(compiled: ``kernels.route``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from ..arrays.hashing import GOLDEN, mix64
from .kernels import kernel
from .tables import ParamSpec, numel

SPLIT_BYTES = 64 * 1024
OWNERS = kernel("route", "owners")


@dataclass(frozen=True, order=True)
class Piece:
    """Elements ``[start, stop)`` of dense table ``table`` (flattened), held by shard ``shard``."""

    table: int
    shard: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


class Placement:
    """The pieces of every dense table and the owners of sparse rows, over ``shards``."""

    def __init__(self, specs: Sequence[ParamSpec], shards: Sequence[int]):
        if not shards:
            raise ValueError("a placement needs at least one shard")
        if len(set(shards)) != len(shards):
            raise ValueError(f"shard keys must be distinct, got {list(shards)}")
        self.specs: Tuple[ParamSpec, ...] = tuple(specs)
        self.shards: Tuple[int, ...] = tuple(int(k) for k in shards)
        self.pieces: Dict[int, Tuple[Piece, ...]] = _cut_dense(self.specs, self.shards)
        with np.errstate(over="ignore"):
            self._salts = {t: mix64(np.array(self.shards, dtype=np.uint64) * GOLDEN + np.uint64(t + 1))
                           for t, spec in enumerate(self.specs) if spec.sparse}

    def pieces_on(self, shard: int) -> List[Piece]:
        """The dense pieces shard ``shard`` holds, in table order."""
        return [p for pieces in self.pieces.values() for p in pieces if p.shard == shard]

    def row_owners(self, table: int, ids: np.ndarray) -> np.ndarray:
        """The shard key owning each row id of sparse table ``table`` (ids in range)."""
        keys = np.array(self.shards, dtype=np.int64)
        if len(keys) == 1:
            return np.full(len(ids), keys[0], dtype=np.int64)
        return keys[self.owner_index(table, ids)]

    def owner_index(self, table: int, ids: np.ndarray) -> np.ndarray:
        """The position in ``shards`` of the shard owning each row id (one compiled pass:
        each shard's score, the highest wins, the first on a tie)."""
        if len(self.shards) == 1:
            return np.zeros(len(ids), dtype=np.int64)
        return OWNERS(np.ascontiguousarray(ids, dtype=np.int64), self._salts[table])

    def rows_on(self, table: int, shard: int) -> np.ndarray:
        """The sorted row ids of sparse table ``table`` that shard ``shard`` owns."""
        ids = np.arange(self.specs[table].shape[0], dtype=np.int64)
        return ids[self.row_owners(table, ids) == shard]


def _cut_dense(specs: Sequence[ParamSpec], shards: Sequence[int]) -> Dict[int, Tuple[Piece, ...]]:
    dense = [(t, spec) for t, spec in enumerate(specs) if not spec.sparse]
    sizes = [numel(spec) * np.dtype(spec.dtype).itemsize for _, spec in dense]
    total = sum(sizes)
    parts = len(shards)
    bounds = [k * total // parts for k in range(parts + 1)]
    pieces: Dict[int, Tuple[Piece, ...]] = {}
    offset = 0
    for (table, spec), nbytes in zip(dense, sizes):
        n = numel(spec)
        if nbytes >= SPLIT_BYTES:
            itemsize = np.dtype(spec.dtype).itemsize
            edges = [min(n, max(0, -(-(b - offset) // itemsize))) for b in bounds]
            found = [Piece(table, shards[k], edges[k], edges[k + 1])
                     for k in range(parts) if edges[k + 1] > edges[k]]
        elif n:
            middle = offset + nbytes // 2
            part = min(parts - 1, max(k for k in range(parts) if bounds[k] <= middle))
            found = [Piece(table, shards[part], 0, n)]
        else:
            found = []
        pieces[table] = tuple(found)
        offset += nbytes
    return pieces


def place(specs: Sequence[ParamSpec], shards: Sequence[int]) -> Placement:
    """The placement of ``specs`` over the shards named ``shards`` (see module docstring)."""
    return Placement(specs, shards)

"""Everything one server shard knows, in one picklable object.

``ShardState`` holds the shard's tables (values and optimizer state), the workers'
clocks, the per-worker push bookkeeping that makes pushes exactly-once (the last
step each worker pushed to each table, applied/duplicate/refused counters), the BSP
gradients waiting for their step to complete, and the measured staleness. Nothing
else on the server is state: the fault-tolerance layer replicates a shard by
shipping ``snapshot()`` (or the updates applied to it) to the next server and
resumes a dead shard from that copy.
"""
from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from ..train.optimizers import Optimizer
from .layout import Layout

RowGrads = Tuple[np.ndarray, np.ndarray]
Pending = Dict[int, Dict[int, List[Tuple[int, Union[np.ndarray, RowGrads]]]]]


@dataclass
class TableShard:
    """One table's share on one shard.

    Dense: ``values`` is the flat piece ``[start, start + values.size)`` of the table.
    Sparse: ``values[i]`` is row ``ids[i]`` (``ids`` sorted: the rows this shard owns),
    and ``position[id]`` is that i, or -1 for a row owned elsewhere (4 bytes per row of
    the table, for lookups in one gather).
    ``version`` counts the updates applied here; ``read_version[w]`` is the version
    worker slot w last read, so an update's lag is ``version - read_version[w]``.
    """

    table: int
    sparse: bool
    values: np.ndarray
    slots: Dict[str, np.ndarray]
    workers: int
    start: int = 0
    ids: Optional[np.ndarray] = None
    position: Optional[np.ndarray] = None
    version: int = 0
    last_push: np.ndarray = field(default=None)
    read_version: np.ndarray = field(default=None)

    def __post_init__(self):
        if self.last_push is None:
            self.last_push = np.full(self.workers, -1, dtype=np.int64)
        if self.read_version is None:
            self.read_version = np.zeros(self.workers, dtype=np.int64)


@dataclass
class ShardState:
    """A server shard's whole state (see the module docstring)."""

    shard: int
    workers: int
    tables: Dict[int, TableShard]
    clocks: np.ndarray
    applied: np.ndarray
    duplicates: np.ndarray
    refused: np.ndarray
    refusals: Counter = field(default_factory=Counter)
    read_staleness: Counter = field(default_factory=Counter)
    update_lag: Counter = field(default_factory=Counter)
    pending: Pending = field(default_factory=dict)
    applied_steps: int = 0
    traffic: Dict[int, List[int]] = field(default_factory=dict)

    @classmethod
    def create(cls, layout: Layout, shard: int, initial: Mapping[str, np.ndarray],
               optimizers: Mapping[int, Optimizer]) -> "ShardState":
        """Shard ``shard``'s part of the ``initial`` values, with zeroed optimizer state."""
        workers = layout.slot_count
        tables: Dict[int, TableShard] = {}
        for piece in layout.placement.pieces_on(shard):
            spec = layout.specs[piece.table]
            flat = np.asarray(initial[spec.name], dtype=spec.dtype).reshape(-1)
            values = flat[piece.start:piece.stop].copy()
            tables[piece.table] = TableShard(piece.table, False, values,
                                             optimizers[piece.table].init_state(values), workers,
                                             start=piece.start)
        for table, spec in enumerate(layout.specs):
            if spec.sparse:
                ids = layout.placement.rows_on(table, shard)
                values = np.asarray(initial[spec.name], dtype=spec.dtype)[ids].copy()
                position = np.full(spec.shape[0], -1, dtype=np.int32 if len(ids) < 2**31 else np.int64)
                position[ids] = np.arange(len(ids))
                tables[table] = TableShard(table, True, values, optimizers[table].init_state(values),
                                           workers, ids=ids, position=position)

        def zeros() -> np.ndarray:
            return np.zeros(workers, dtype=np.int64)
        return cls(shard, workers, tables, zeros(), zeros(), zeros(), zeros())

    def grow(self, slots: int) -> None:
        """Make room for worker slots up to ``slots`` (workers that joined), counters at zero."""
        extra = slots - self.workers
        if extra <= 0:
            return
        for name in ("clocks", "applied", "duplicates", "refused"):
            setattr(self, name, np.concatenate([getattr(self, name), np.zeros(extra, np.int64)]))
        for table in self.tables.values():
            table.last_push = np.concatenate([table.last_push, np.full(extra, -1, np.int64)])
            table.read_version = np.concatenate([table.read_version, np.zeros(extra, np.int64)])
            table.workers = slots
        self.workers = slots

    def count_traffic(self, step: int, sent: int, received: int) -> None:
        """Payload bytes moved for a request of ``step`` (the worker's clock)."""
        cell = self.traffic.setdefault(int(step), [0, 0])
        cell[0] += sent
        cell[1] += received

    def snapshot(self) -> "ShardState":
        """A deep copy: what a replica holds."""
        return copy.deepcopy(self)

    def summary(self) -> Dict[str, object]:
        """Counters and histograms as plain numbers (mergeable across shards)."""
        return {
            "applied": self.applied.tolist(),
            "duplicates": self.duplicates.tolist(),
            "refused": self.refused.tolist(),
            "refusals": dict(self.refusals),
            "read_staleness": dict(self.read_staleness),
            "update_lag": dict(self.update_lag),
            "traffic": {step: list(cell) for step, cell in self.traffic.items()},
        }

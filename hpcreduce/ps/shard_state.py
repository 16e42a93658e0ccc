"""Everything one server shard knows, in one picklable object, and the row-store interface.

``ShardState`` holds the shard's tables (values and optimizer state), the workers'
clocks and what each one's CLOCK carried of its step (``shares``), the per-slot push
bookkeeping that makes pushes exactly-once (the last step each worker slot pushed to
each table, applied/duplicate/refused counters), the BSP
gradients waiting for their step to complete, and the measured staleness. Nothing
else on the server is state: replication ships it (or the updates applied to it) to
the next server, and recovery resumes a dead shard from that copy.
Per-slot arrays have ``slot_count`` entries: one per worker slot ever handed out.

A sparse table's share is a *row store*, one interface for fixed and dynamic tables, by id:

    store = make_row_store(table, spec, optimizer, slot_count, ids=owned, values=initial)
    store.rows(ids)                                   -> the rows' values (a copy)
    store.foreign(ids)                                -> the first id it holds no row for, or None
    store.apply(ids, grads, optimizer, step, events)  one optimizer update of rows ``ids`` (unique)

A fixed table's store (``TableShard``) holds the rows of the ids it owns and finds them by
id (``tables.RowIndex``); a dynamic table's (``dynamic_rows.DynamicTable``) holds rows that
come with their ids and go past a budget; an id without a row reads as its initial value
and ``apply`` admits or drops it (``events`` counts seen/admitted/evicted/dropped). Both keep
``values``/``ids``/``optimizer_state`` (the live rows: what checkpoints and exports write; a
store pickles with its rows), ``version``, the per-slot ``last_push``/``read_version`` of the
exactly-once rule, and ``dynamic`` (which kind). Servers, backups, recovery and trainer ranks
holding colocated shards all use this surface; updates go through ``updates.update_rows``
(one compiled optimizer pass).
"""
from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .dynamic_rows import ROW_EVENTS, DynamicTable
from .init import PartInit, owned_rows, whole_tables
from .layout import Layout
from .optimizers import Optimizer
from .tables import ParamSpec, RowIndex
from .updates import gather_rows, update_rows

RowGrads = Tuple[np.ndarray, np.ndarray]
Pending = Dict[int, Dict[int, List[Tuple[int, Union[np.ndarray, RowGrads]]]]]
COUNTERS = ("applied", "duplicates", "refused")


@dataclass
class TableShard:
    """One table's share on one shard.

    Dense: ``values`` is the flat piece ``[start, start + values.size)`` of the table.
    Sparse (a fixed table's row store, ``row_store``): ``values[i]`` is row ``ids[i]``
    (``ids`` sorted: the rows this shard owns), and ``position`` finds them by id
    (``tables.RowIndex``); ``rows``/``foreign``/``apply`` take ids.
    ``optimizer_state`` holds the optimizer's arrays, shaped like ``values``. (A dynamic
    table's share is a ``dynamic_rows.DynamicTable``, with the same attributes.)
    ``version`` counts the updates applied here; ``read_version[s]`` is the version
    worker slot s last read, so an update's lag is ``version - read_version[s]``.
    """

    table: int
    sparse: bool
    values: np.ndarray
    optimizer_state: Dict[str, np.ndarray]
    slot_count: int
    start: int = 0
    ids: Optional[np.ndarray] = None
    position: Optional[RowIndex] = None
    version: int = 0
    last_push: np.ndarray = field(default=None)
    read_version: np.ndarray = field(default=None)

    def __post_init__(self):
        if self.last_push is None:
            self.last_push = np.full(self.slot_count, -1, dtype=np.int64)
        if self.read_version is None:
            self.read_version = np.zeros(self.slot_count, dtype=np.int64)

    dynamic = False  # a dynamic table's share is a DynamicTable

    # -- the row store (``row_store``; a sparse table's): by id ---------------------------
    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The values of rows ``ids`` (all held here; a copy, gathered by a compiled loop)."""
        return gather_rows(self.values, self.position[ids])

    def foreign(self, ids: np.ndarray) -> Optional[int]:
        """The first of ``ids`` (in range) this shard holds no row for, or None."""
        local = self.position[ids]
        return int(ids[np.argmax(local < 0)]) if local.size and local.min() < 0 else None

    def apply(self, ids: np.ndarray, grads: np.ndarray, optimizer: Optimizer, step: int, events: Counter) -> None:
        """One optimizer update of rows ``ids`` (unique, held here) from ``grads``."""
        update_rows(self, self.position[ids], grads, optimizer, step)

    def own_rows(self, ids: np.ndarray, rows: int) -> None:
        """Make ``ids`` (sorted) the rows of this sparse shard of a ``rows``-row table."""
        self.ids = ids
        self.position = RowIndex(ids, rows)


def make_row_store(table: int, spec: ParamSpec, optimizer: Optimizer, slot_count: int, *,
                   ids: Optional[np.ndarray] = None, values: Optional[np.ndarray] = None
                   ) -> Union[TableShard, DynamicTable]:
    """The row store of sparse table number ``table`` on one shard: a dynamic table's (empty),
    or a fixed table's rows ``ids`` (sorted, owned) with their initial ``values``."""
    if spec.dynamic is not None:
        return DynamicTable(table, spec, optimizer, slot_count)
    store = TableShard(table, True, values, optimizer.init_state(values), slot_count)
    store.own_rows(ids, spec.shape[0])
    return store


@dataclass
class ShardState:
    """A server shard's whole state (see the module docstring)."""

    shard: int
    slot_count: int
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
    row_events: Counter = field(default_factory=Counter)
    shares: Dict[int, Dict[int, Tuple[float, ...]]] = field(default_factory=dict)  # step -> slot -> share

    @classmethod
    def empty(cls, shard: int, tables: Dict[int, TableShard], slot_count: int,
              applied_steps: int = 0) -> "ShardState":
        """A state around ``tables`` with zeroed clocks, counters and histograms."""
        def zeros() -> np.ndarray:
            return np.zeros(slot_count, dtype=np.int64)
        return cls(shard, slot_count, tables, zeros(), zeros(), zeros(), zeros(), applied_steps=applied_steps)

    @classmethod
    def create(cls, layout: Layout, shard: int, initial: Union[PartInit, Mapping[str, np.ndarray]],
               optimizers: Mapping[int, Optimizer]) -> "ShardState":
        """Shard ``shard``'s part of the initial values, with zeroed optimizer state.
        ``initial``: a ``PartInit`` (only this shard's elements are ever made) or whole tables by name."""
        return cls.create_many(layout, [shard], initial, optimizers)[0]

    @classmethod
    def create_many(cls, layout: Layout, shards: Sequence[int], initial: Union[PartInit, Mapping[str, np.ndarray]],
                    optimizers: Mapping[int, Optimizer]) -> List["ShardState"]:
        """``create`` for each of ``shards`` (a server's own shard and its replica), the
        sparse rows' owners hashed once for all of them."""
        if not isinstance(initial, PartInit):
            initial = whole_tables(layout.specs, initial)
        slot_count = layout.slot_count
        tables: Dict[int, Dict[int, TableShard]] = {shard: {} for shard in shards}
        for shard in shards:
            for piece in layout.placement.pieces_on(shard):
                values = initial.dense(piece.table, piece.start, piece.stop)
                tables[shard][piece.table] = TableShard(piece.table, False, values,
                                                        optimizers[piece.table].init_state(values), slot_count,
                                                        start=piece.start)
        for table, spec in enumerate(layout.specs):
            if spec.dynamic is not None:
                for shard in shards:
                    tables[shard][table] = make_row_store(table, spec, optimizers[table], slot_count)
            elif spec.sparse:
                for shard, ids in owned_rows(layout.placement, table, shards).items():
                    tables[shard][table] = make_row_store(table, spec, optimizers[table], slot_count, ids=ids,
                                                          values=initial.rows(table, ids))
        return [cls.empty(shard, tables[shard], slot_count) for shard in shards]

    def grow(self, slot_count: int) -> None:
        """Make room for worker slots up to ``slot_count`` (workers that joined), counters at zero."""
        extra = slot_count - self.slot_count
        if extra <= 0:
            return
        for name in ("clocks", *COUNTERS):
            setattr(self, name, np.concatenate([getattr(self, name), np.zeros(extra, np.int64)]))
        for table in self.tables.values():
            table.last_push = np.concatenate([table.last_push, np.full(extra, -1, np.int64)])
            table.read_version = np.concatenate([table.read_version, np.zeros(extra, np.int64)])
            table.slot_count = slot_count
        self.slot_count = slot_count

    def count_traffic(self, step: int, sent: int, received: int) -> None:
        """Payload bytes moved for a request of ``step`` (the worker's clock)."""
        cell = self.traffic.setdefault(int(step), [0, 0])
        cell[0] += sent
        cell[1] += received

    def __setstate__(self, state: Dict[str, object]) -> None:
        self.__dict__.update({"shares": {}, **state})  # a checkpoint written before ``shares``

    def record_share(self, step: int, slot: int, stats: np.ndarray, staleness: int) -> None:
        """Worker ``slot``'s [loss sum, correct, count, read staleness] of step ``step`` (its CLOCK's)."""
        self.shares.setdefault(int(step), {})[int(slot)] = (*map(float, stats[:3]), float(staleness))

    def drop_shares(self, first: int) -> None:
        """Forget the shares of steps from ``first`` on (a BSP restart computes them again)."""
        self.shares = {step: slots for step, slots in self.shares.items() if step < first}

    def merge_counters(self, others: "List[ShardState]") -> None:
        """Add the push counters, histograms and traffic of ``others`` into this state's."""
        for other in others:
            for name in COUNTERS:
                mine, theirs = getattr(self, name), getattr(other, name)
                mine[:len(theirs)] += theirs
            for name in ("refusals", "read_staleness", "update_lag", "row_events"):
                getattr(self, name).update(getattr(other, name))
            for step, cell in other.traffic.items():
                self.count_traffic(step, *cell)
            for step, slots in other.shares.items():
                self.shares[step] = {**slots, **self.shares.get(step, {})}

    def snapshot(self) -> "ShardState":
        """A deep copy: what a replica holds."""
        return copy.deepcopy(self)

    def summary(self) -> Dict[str, object]:
        """Counters and histograms as plain numbers (mergeable across shards)."""
        return {
            **{name: getattr(self, name).tolist() for name in COUNTERS},
            "refusals": dict(self.refusals),
            "read_staleness": dict(self.read_staleness),
            "update_lag": dict(self.update_lag),
            **({"dynamic_rows": self.dynamic_rows()} if any(t.dynamic for t in self.tables.values()) else {}),
        }

    def dynamic_rows(self) -> Dict[str, int]:
        """This shard's dynamic tables: rows held, bytes held, and the rows' events so far
        (ids seen without a row, rows admitted and evicted, gradient rows dropped)."""
        held = [t for t in self.tables.values() if t.dynamic]
        return {"rows": sum(t.count for t in held), "bytes": sum(t.nbytes for t in held),
                **{name: int(self.row_events[name]) for name in ROW_EVENTS}}

"""Shard state in table coordinates: cut by one placement, reassembled by another.

A *fragment* is part of one table held by a shard, with everything the update rule
needs about it: values and optimizer state, and the exactly-once bookkeeping (the
table piece's update count and, per worker slot, the last step pushed and the version
last read). Dense fragments are element ranges ``[start, start + size)`` of the
flattened table; sparse ones are rows named by their ids. ``cut`` splits a shard's
state along another placement; ``assemble`` builds a shard's tables from the fragments
that cover it. Rebalancing after a failure (``rebalance``) and restoring shard
checkpoints both move fragments, so the state survives any change of the set of shards.
Merging: values concatenate; the bookkeeping takes the largest value (at the quiescent
point recovery merges at, every live worker has pushed each table up to the same step
on every piece, and a dead worker never pushes again). Counters are not in fragments:
they stay with the server that counted them (``ShardState.merge_counters``), so their
sums over servers stay exact. Cost: one copy of the bytes that change owner.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .dynamic_rows import DynamicTable
from .optimizers import Optimizer
from .placement import Placement
from .shard_state import ShardState, TableShard
from .tables import ParamSpec


@dataclass
class Fragment:
    """Part of table ``table``: elements from ``start`` (dense) or rows ``ids`` (sparse)."""

    table: int
    values: np.ndarray
    optimizer_state: Dict[str, np.ndarray]
    version: int
    last_push: np.ndarray
    read_version: np.ndarray
    start: int = 0
    ids: Optional[np.ndarray] = None
    heat: Optional[Tuple[np.ndarray, np.ndarray]] = None  # a dynamic table's rows: (last used, uses)
    sketch: Optional[np.ndarray] = None  # a dynamic table's admission sketch (the whole source table's)

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + sum(array.nbytes for array in self.optimizer_state.values())


def cut(state: ShardState, placement: Placement, *, rows_stay: bool = False) -> Dict[int, List[Fragment]]:
    """``state``'s tables split along ``placement``: the fragments each shard key gets.

    ``rows_stay``: no shard key was added since ``state`` was placed, so if its own key is
    still placed its sparse rows stay with it (rendezvous hashing) and need no hashing.
    """
    out: Dict[int, List[Fragment]] = {}
    for table_id, table in state.tables.items():
        if table.sparse:
            if rows_stay and state.shard in placement.shards:
                out.setdefault(state.shard, []).append(_fragment(table, slice(None), ids=table.ids))
                continue
            owners = placement.row_owners(table_id, table.ids)
            for key in np.unique(owners):
                mask = owners == key
                out.setdefault(int(key), []).append(_fragment(table, mask, ids=table.ids[mask]))
            continue
        low, high = table.start, table.start + table.values.size
        for piece in placement.pieces[table_id]:
            begin, end = max(low, piece.start), min(high, piece.stop)
            if begin < end:
                out.setdefault(piece.shard, []).append(
                    _fragment(table, slice(begin - low, end - low), start=begin))
    return out


def _fragment(table: TableShard, where, *, start: int = 0, ids: Optional[np.ndarray] = None) -> Fragment:
    """A view of (or, for a mask, a copy of) part of ``table``; ``assemble`` copies what it keeps."""
    dynamic = {"heat": table.heat(where), "sketch": table.sketch} if table.dynamic else {}
    return Fragment(table.table, table.values[where],
                    {name: array[where] for name, array in table.optimizer_state.items()},
                    table.version, table.last_push, table.read_version, start, ids, **dynamic)


def assemble(key: int, specs: Sequence[ParamSpec], placement: Placement, fragments: Iterable[Fragment],
             optimizers: Mapping[int, Optimizer], slot_count: int) -> Dict[int, TableShard]:
    """Shard ``key``'s tables under ``placement``, from fragments that cover them exactly."""
    by_table: Dict[int, List[Fragment]] = {}
    for fragment in fragments:
        by_table.setdefault(fragment.table, []).append(fragment)
    tables: Dict[int, TableShard] = {}
    for piece in placement.pieces_on(key):
        parts = sorted(by_table.get(piece.table, []), key=lambda f: f.start)
        edges = [piece.start] + [f.start + f.values.size for f in parts]
        if [f.start for f in parts] != edges[:-1] or edges[-1] != piece.stop:
            raise RuntimeError(f"shard {key}: the fragments of table {specs[piece.table].name!r} do not "
                               f"cover [{piece.start}, {piece.stop}) exactly")
        tables[piece.table] = _merged(piece.table, parts, slot_count, optimizers, start=piece.start)
    for table_id, spec in enumerate(specs):
        if spec.dynamic is not None:
            tables[table_id] = _merged_dynamic(table_id, spec, by_table.get(table_id, []), slot_count,
                                               optimizers[table_id])
        elif spec.sparse:
            parts = by_table.get(table_id, [])
            if not parts:
                empty = np.empty((0,) + tuple(spec.shape[1:]), dtype=spec.dtype)
                parts = [Fragment(table_id, empty, optimizers[table_id].init_state(empty), 0,
                                  np.full(slot_count, -1, np.int64), np.zeros(slot_count, np.int64),
                                  ids=np.empty(0, np.int64))]
            tables[table_id] = _merged(table_id, parts, slot_count, optimizers, rows=spec.shape[0])
    return tables


def _merged(table_id: int, parts: List[Fragment], slot_count: int, optimizers: Mapping[int, Optimizer], *,
            start: int = 0, rows: Optional[int] = None) -> TableShard:
    order = None
    ids = None
    if rows is not None:
        ids = np.concatenate([f.ids for f in parts])
        order = np.argsort(ids, kind="stable")
        ids = ids[order]

    def joined(arrays: List[np.ndarray]) -> np.ndarray:
        whole = np.concatenate(arrays) if len(arrays) > 1 else arrays[0].copy()
        return whole[order] if order is not None else whole

    values = joined([f.values for f in parts])
    names = optimizers[table_id].state_names
    table = TableShard(table_id, rows is not None, values,
                       {n: joined([f.optimizer_state[n] for f in parts]) for n in names},
                       slot_count, start=start, version=max(f.version for f in parts),
                       last_push=_widest(parts, "last_push", slot_count, -1),
                       read_version=_widest(parts, "read_version", slot_count, 0))
    if rows is not None:
        table.own_rows(ids, rows)
    return table


def _merged_dynamic(table_id: int, spec: ParamSpec, parts: List[Fragment], slot_count: int,
                    optimizer: Optimizer) -> DynamicTable:
    """A dynamic table holding the rows of ``parts`` (any order: rows are found by id), their
    use counts, and the sources' admission sketches merged (the larger count of each cell)."""
    table = DynamicTable(table_id, spec, optimizer, slot_count)
    for fragment in parts:
        table.take(fragment.ids, fragment.values, fragment.optimizer_state, *(fragment.heat or ()))
    sketches = list({id(f.sketch): f.sketch for f in parts if f.sketch is not None}.values())
    if sketches and table.sketch is not None:
        table.sketch = np.maximum.reduce(sketches) if len(sketches) > 1 else sketches[0].copy()
    if parts:
        table.version = max(f.version for f in parts)
        table.last_push = _widest(parts, "last_push", slot_count, -1)
        table.read_version = _widest(parts, "read_version", slot_count, 0)
    return table


def _widest(parts: List[Fragment], name: str, slot_count: int, fill: int) -> np.ndarray:
    """Per slot, the largest value among the fragments (padded to ``slot_count``)."""
    merged = np.full(slot_count, fill, dtype=np.int64)
    for fragment in parts:
        values = getattr(fragment, name)
        np.maximum(merged[:len(values)], values[:slot_count], out=merged[:len(values)])
    return merged

"""The row store under the colocated layout: the one module that knows today's row classes.

``ShardStore`` is one shard key's rows of every table, each table a row store
(``shard_state.make_row_store``: fixed or dynamic, by id), behind an interface that takes ids:
``rows(t, ids)``, ``apply(t, ids, grads, step)``, ``export(t)`` / ``take(t, ...)`` (rows
moved after a failure, replicas, checkpoints). It also keeps the last step applied to each
table, so a step is applied at most once (exactly-once pushes). When the row store's
interface changes, only this module does.

With ``lazy=seed`` (the default initial values), a fixed table's rows are made on first touch:
its store is a dynamic row store that admits every id at once, with no budget, whose initial
rows are the default ones (``tables.initial_rows``: N(0, ``INIT_SCALE``**2) from (seed, table,
id, column), the very values ``default_init`` gives). A row is drawn on its first read (kept
on the owner) or push (on owner and replica: a replica may lack rows only read, which it draws
the same when it needs them). Making 26 tables of 1M rows then costs nothing at start (eager:
about 5 CPU s per 100M elements), and replicas, moves and checkpoints carry touched rows only.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..init import PartInit, owned_rows
from ..optimizers import Optimizer
from ..placement import Placement
from ..shard_state import make_row_store
from ..tables import Dynamic, ParamSpec
from ..updates import gather_rows, update_rows

Exported = Tuple[np.ndarray, np.ndarray, Dict[str, np.ndarray]]
HEAT = ("last_used", "uses")  # a dynamic row's use counters, carried beside its optimizer state
INIT_SCALE = 0.01  # lazy fixed tables' rows start N(0, INIT_SCALE**2), as dynamic tables' (Dynamic.init_scale)


def stored_spec(spec: ParamSpec, lazy: Optional[int]) -> ParamSpec:
    """The spec a table's row store is made from: a fixed table under ``lazy`` becomes a dynamic
    one admitting every id on its first push, unbounded, starting from the default rows."""
    if lazy is None or spec.dynamic is not None:
        return spec
    return replace(spec, dynamic=Dynamic(init_scale=INIT_SCALE, seed=lazy))


class ShardStore:
    """Shard key ``key``'s rows of every table of ``placement``, updated by ``optimizers``."""

    def __init__(self, key: int, specs: Sequence[ParamSpec], optimizers: Mapping[int, Optimizer],
                 tables: Dict[int, object], lazy: Optional[int]):
        self.key, self.specs, self.optimizers, self.tables = key, tuple(specs), dict(optimizers), tables
        self.lazy = lazy
        self.last_step = {t: -1 for t in tables}
        self.events: Counter = Counter()
        self._read: Dict[int, Tuple[np.ndarray, np.ndarray, object]] = {}  # t -> the last rows read: ids, slots, index

    @classmethod
    def create(cls, placement: Placement, key: int, init: Optional[PartInit],
               optimizers: Mapping[int, Optimizer], lazy: Optional[int]) -> "ShardStore":
        """Shard ``key``'s initial rows: ``init``'s values (or, ``lazy``, the default ones on
        first touch), zeroed optimizer state."""
        tables: Dict[int, object] = {}
        for t, spec in enumerate(placement.specs):
            spec = stored_spec(spec, lazy)
            ids = owned_rows(placement, t, [key])[key] if spec.dynamic is None else None
            tables[t] = make_row_store(t, spec, optimizers[t], 1, ids=ids,
                                       values=None if ids is None else init.rows(t, ids))
        return cls(key, placement.specs, optimizers, tables, lazy)

    @classmethod
    def empty(cls, key: int, specs: Sequence[ParamSpec], optimizers: Mapping[int, Optimizer],
              lazy: Optional[int]) -> "ShardStore":
        """A shard with no rows (filled by ``take``)."""
        tables = {t: make_row_store(t, stored_spec(spec, lazy), optimizers[t], 1, ids=np.empty(0, np.int64),
                                    values=np.empty((0,) + tuple(spec.shape[1:]), spec.dtype))
                  for t, spec in enumerate(specs)}
        return cls(key, specs, optimizers, tables, lazy)

    def rows(self, t: int, ids: np.ndarray) -> np.ndarray:
        """The current values of rows ``ids`` of table ``t`` (ids this shard owns)."""
        table = self.tables[t]
        if self.lazy is not None and self.specs[t].dynamic is None:
            slots = self._made(t, ids)  # first: making rows may reallocate the values
            return gather_rows(table.values, slots)
        if table.dynamic:
            return table.rows(ids)
        local = table.position[ids]  # one probe: checked, then gathered
        if (local < 0).any():
            raise RuntimeError(f"shard {self.key} asked for row {int(ids[np.argmax(local < 0)])} of table "
                               f"{self.specs[t].name!r}, which it does not hold (placements differ)")
        self._read[t] = (ids, local, table.position)
        return gather_rows(table.values, local)

    def _made(self, t: int, ids: np.ndarray) -> np.ndarray:
        """The slots of rows ``ids`` (unique) of a lazy fixed table, those it did not hold yet
        made at their initial values: each row is drawn once, on its first read or push."""
        table = self.tables[t]
        slots = table[ids]
        new = slots < 0
        if new.any():
            slots[new] = table.create(ids[new])
        return slots

    def apply(self, t: int, ids: np.ndarray, grads: np.ndarray, step: int,
              came: Optional[Tuple[np.ndarray, np.ndarray]] = None) -> bool:
        """One optimizer update of rows ``ids`` (sorted, unique) of table ``t`` for ``step``;
        False (nothing changed) when that step was applied already. ``came``: (the items the
        ids were summed from, where each id first came among them): when those are the ids the
        last ``rows`` of a fixed table read, the rows' slots are known (no second probe)."""
        if step <= self.last_step[t]:
            return False
        if len(ids):
            read = self._read.pop(t, None)
            table = self.tables[t]
            if came is not None and read is not None and read[2] is getattr(table, "position", None) and \
                    np.array_equal(read[0], came[0]):
                update_rows(table, read[1][came[1]], grads, self.optimizers[t], step + 1)
            else:
                table.apply(ids, grads, self.optimizers[t], step + 1, self.events)
        self.last_step[t] = step
        return True

    def export(self, t: int) -> Exported:
        """(ids, values, optimizer state) of every row of table ``t`` held here (of a lazy fixed
        table: every row a push changed, as its replica holds); a dynamic table's state also
        holds each row's use counters (``HEAT``), for its eviction."""
        table = self.tables[t]
        kept = slice(None)
        if self.lazy is not None and self.specs[t].dynamic is None:
            kept = table.heat(slice(None))[1] > 0  # rows only read are still their initial values
        state = {k: v[kept].copy() for k, v in table.optimizer_state.items()}
        if table.dynamic:
            state.update(zip(HEAT, (np.array(a) for a in table.heat(kept))))
        return table.ids[kept].copy(), table.values[kept].copy(), state

    def take(self, t: int, ids: np.ndarray, values: np.ndarray, state: Mapping[str, np.ndarray]) -> None:
        """Add rows ``ids`` (none held here yet) of table ``t`` with their values and state."""
        table = self.tables[t]
        if not len(ids):
            return
        if table.dynamic:
            table.take(np.asarray(ids, np.int64), values, dict(state), *(state.get(name) for name in HEAT))
            return
        merged = np.concatenate([table.ids.astype(np.int64), ids])
        order = np.argsort(merged, kind="stable")
        table.values = np.concatenate([table.values, values])[order]
        table.optimizer_state = {k: np.concatenate([v, state[k]])[order] for k, v in table.optimizer_state.items()}
        table.own_rows(merged[order].astype(table.ids.dtype if len(table.ids) else np.int64),
                       self.specs[t].shape[0])

"""One dynamic table's rows on one shard: rows that come with their ids and go past a budget.

``DynamicTable`` is a dynamic table's row store (``row_store``: ``rows``, ``foreign`` and
``apply`` by id, ``values``, ``ids``, ``optimizer_state``, ``version``, the per-slot
``last_push``/``read_version``, as a fixed table's ``TableShard``), but its rows live in the first ``count`` slots of arrays
with room to grow, found by id through an ``IdIndex``. Everything that changes it happens
in ``admit``, inside the shard's update rule, so a replica fed the same pushes in the same
order holds the same rows in the same slots:

- an id with no row is *seen* (a count-min sketch of sightings, ``admit_after`` > 1) and gets
  a row on its ``admit_after``-th push, then with ``admit_probability`` (a coin drawn from
  (id, table version)); until then its gradient is dropped and it reads as ``initial_rows``.
  The sketch is fixed in size (``sketch_width``: 2**20 counters a row, at most an eighth
  of a budget) and ids come without bound, so it ages: every width / 4 sightings all counts
  are halved (an id must come back often, not once in a while; the sketch stays a quarter
  full, so few strangers pass for known ids);
- past the budget, the coldest rows (least recent or least frequent use, by pushes) are
  evicted, at least an eighth of the budget at once; the live rows are compacted into the
  first slots (the last rows move into the holes).

Cost per push of m ids: one index probe (about 1.5 cells an id), the sketch's four cells
for ids without a row, one optimizer pass over the admitted rows. Memory per row: its
values and optimizer state, 24 B of id and use counters and at most 32 B of index.
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, Optional, Tuple

import numpy as np

from ..arrays.hashing import GOLDEN, mix64, name_key, unit_uniform
from .id_index import CELL_BYTES, IdIndex, cells_for
from .kernels import kernel
from .optimizers import Optimizer
from .updates import gather_rows, update_rows
from .tables import SKETCH_COUNT_MAX, ParamSpec, initial_rows

SKETCH_DEPTH, SKETCH_WIDTH, SKETCH_MIN_WIDTH = 4, 1 << 20, 1 << 10  # uint16 counters: 8 MiB at most
SKETCH_CAP = SKETCH_COUNT_MAX
SIGHTING = kernel("sketch", "sighting")  # the conservative count-min update, compiled
EVICT_SHARE = 8  # an eviction frees at least budget // EVICT_SHARE rows
ROW_EVENTS = ("seen", "admitted", "evicted", "dropped")


def row_bytes(spec: ParamSpec, optimizer: Optimizer) -> int:
    """Bytes one row costs a shard beside the index: values, optimizer state, id, use counters."""
    values = int(np.prod(spec.shape[1:], dtype=np.int64)) * np.dtype(spec.dtype).itemsize
    return values * (1 + len(optimizer.state_names)) + 24


def held_bytes(rows: int, spec: ParamSpec, optimizer: Optimizer) -> int:
    """What ``rows`` rows cost a shard at most: the rows, an index sized for them, the sketch."""
    return rows * row_bytes(spec, optimizer) + cells_for(rows) * CELL_BYTES + sketch_bytes(spec)


def sketch_bytes(spec: ParamSpec) -> int:
    """The fixed bytes of a table's admission sketch (none when every id is admitted on sight)."""
    return SKETCH_DEPTH * sketch_width(spec) * 2 if spec.dynamic.admit_after > 1 else 0


def sketch_width(spec: ParamSpec) -> int:
    """Counters per row of a table's admission sketch: ``SKETCH_WIDTH``, or for a budget the
    power of two that keeps the sketch within an eighth of it (at least ``SKETCH_MIN_WIDTH``)."""
    budget = spec.dynamic.budget_bytes
    if not budget:
        return SKETCH_WIDTH
    fits = budget // (8 * SKETCH_DEPTH * 2)
    return max(SKETCH_MIN_WIDTH, min(SKETCH_WIDTH, 1 << max(fits, 1).bit_length() - 1))


def budget_rows(spec: ParamSpec, optimizer: Optimizer) -> int:
    """The rows a shard of dynamic table ``spec`` may hold (0: unbounded)."""
    budget = spec.dynamic.budget_bytes
    if not budget:
        return 0
    per_row, fixed = row_bytes(spec, optimizer), sketch_bytes(spec)
    rows = max(0, (budget - fixed) // (per_row + 2 * CELL_BYTES))
    while rows:  # the index's cells come in powers of two: the most rows that fit with theirs
        cells = cells_for(rows)
        fit = (budget - fixed - cells * CELL_BYTES) // per_row
        if fit >= rows:
            break
        rows = min(rows - 1, max(fit, cells // 4))
    return rows


class DynamicTable:
    """Dynamic table ``table`` (``spec``) on one shard; see the module docstring."""

    sparse, dynamic, start = True, True, 0

    def __init__(self, table: int, spec: ParamSpec, optimizer: Optimizer, slot_count: int):
        self.table, self.spec, self.slot_count = table, spec, slot_count
        self.budget = budget_rows(spec, optimizer)
        self.version = 0
        self.last_push = np.full(slot_count, -1, dtype=np.int64)
        self.read_version = np.zeros(slot_count, dtype=np.int64)
        self.count = 0
        self._state_names = optimizer.state_names
        self._allocate(max(16, self.budget))
        self.index = IdIndex.of(self._ids[:0], room=self.budget)
        self.sketch = np.zeros((SKETCH_DEPTH, sketch_width(spec)), np.uint16) if spec.dynamic.admit_after > 1 \
            else None
        self.sightings = 0  # since the sketch's counts were last halved
        with np.errstate(over="ignore"):
            self._salt = mix64(np.array([spec.dynamic.seed], np.uint64) * GOLDEN ^ name_key(spec.name))

    # -- what a TableShard has -----------------------------------------------------------
    @property
    def values(self) -> np.ndarray:
        return self._values[:self.count]

    @property
    def ids(self) -> np.ndarray:
        return self._ids[:self.count]

    @property
    def optimizer_state(self) -> Dict[str, np.ndarray]:
        return {name: array[:self.count] for name, array in self._state.items()}

    def __getitem__(self, ids) -> np.ndarray:
        """The slot of each id's row, -1 for ids without one."""
        return self.index.find(np.asarray(ids, dtype=np.int64))

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The values of rows ``ids``: their row, or the initial value for ids without one."""
        slots = self.index.find(ids)
        rows = gather_rows(self._values, np.maximum(slots, 0))
        missing = slots < 0
        if missing.any():
            rows[missing] = initial_rows(self.spec, ids[missing])
        return rows

    def heat(self, where) -> Tuple[np.ndarray, np.ndarray]:
        """(last used, uses) of the rows at ``where`` (an index or mask of the live rows)."""
        return self._last_used[:self.count][where], self._uses[:self.count][where]

    @property
    def nbytes(self) -> int:
        """Bytes held: the live rows with their state and counters, the index and the sketch."""
        per_row = self._values[:1].nbytes * (1 + len(self._state)) + 24
        return self.count * per_row + self.index.nbytes + (0 if self.sketch is None else self.sketch.nbytes)

    def foreign(self, ids: np.ndarray) -> None:
        """None: a dynamic table has a row, or an initial value, for any id it is given
        (the placement, not the store, says which ids belong to this shard)."""
        return None

    def apply(self, ids: np.ndarray, grads: np.ndarray, optimizer: Optimizer, step: int, events: Counter) -> None:
        """One optimizer update of rows ``ids`` (sorted, unique): rows found, or admitted now
        (``admit``); the other ids' gradients are dropped."""
        slots, kept = self.admit(ids, grads, events)
        update_rows(self, slots, kept, optimizer, step)

    # -- the update rule's part ----------------------------------------------------------
    def admit(self, ids: np.ndarray, grads: np.ndarray, events: Counter) -> Tuple[np.ndarray, np.ndarray]:
        """The slots of the rows a push of ``ids`` (sorted, unique) updates and their gradients:
        rows found, plus rows created for ids admitted now; the other ids' gradients are
        dropped. Evicts first when the new rows would pass the budget. ``events`` counts
        seen/admitted/evicted/dropped."""
        slots = self.index.find(ids)
        new = np.flatnonzero(slots < 0)
        if len(new):
            admitted = new[self._admitted(ids[new], events)]
            if self.budget and len(admitted) > self.budget:
                admitted = admitted[:self.budget]  # never past the budget, even for a push wider than it
            events["dropped"] += len(new) - len(admitted)
            if self.budget and self.count + len(admitted) > self.budget:
                self._evict(self.count + len(admitted) - self.budget, slots[slots >= 0], events)
                slots = self.index.find(ids)
            slots[admitted] = self.create(ids[admitted])
            events["admitted"] += len(admitted)
        kept = slots >= 0
        if kept.all():  # every id has its row: nothing to drop, no copies
            self._touch(slots)
            return slots, grads
        self._touch(slots[kept])
        return slots[kept], grads[kept]

    def _admitted(self, ids: np.ndarray, events: Counter) -> np.ndarray:
        """Which of ``ids`` (without a row) get one now: seen often enough, and the coin says so."""
        dynamic = self.spec.dynamic
        events["seen"] += len(ids)
        ok = np.ones(len(ids), dtype=bool)
        if self.sketch is not None:
            ok = self._sighting(ids) >= dynamic.admit_after
        if dynamic.admit_probability < 1.0:
            with np.errstate(over="ignore"):
                coin = unit_uniform(mix64(self._salt ^ ids.astype(np.uint64) * GOLDEN + np.uint64(self.version)))
            ok &= coin < dynamic.admit_probability
        return np.flatnonzero(ok)

    def _sighting(self, ids: np.ndarray) -> np.ndarray:
        """Count one more sighting of each id (conservative count-min update); the new counts."""
        counts = SIGHTING(self.sketch, np.ascontiguousarray(ids, dtype=np.int64), self._salt[0], SKETCH_CAP)
        self.sightings += len(ids)
        if self.sightings >= self.sketch.shape[1] // 4:
            self.sketch >>= 1
            self.sightings = 0
        return counts

    def _touch(self, slots: np.ndarray) -> None:
        self._last_used[slots] = self.version
        self._uses[slots] += 1

    def _evict(self, needed: int, protected: np.ndarray, events: Counter) -> None:
        """Drop the coldest rows but ``protected`` (the push's own), at least ``needed`` and an
        eighth of the budget; compact."""
        count = min(self.count, max(needed, self.budget // EVICT_SHARE))
        if count <= 0:
            return
        heat = (self._uses if self.spec.dynamic.eviction == "lfu" else self._last_used)[:self.count].copy()
        heat[protected] = np.iinfo(np.int64).max
        coldest = np.argpartition(heat, count - 1)[:count] if count < self.count else np.arange(self.count)
        self.remove(coldest)
        events["evicted"] += count

    def remove(self, slots: np.ndarray) -> None:
        """Drop the rows at ``slots``: the last live rows move into the holes."""
        keep = np.ones(self.count, dtype=bool)
        keep[slots] = False
        remaining = self.count - len(slots)
        holes = np.flatnonzero(~keep[:remaining])
        movers = np.flatnonzero(keep[remaining:]) + remaining
        self.index.remove(self._ids[slots])
        for array in self._arrays():
            array[holes] = array[movers]
        self.index.move(self._ids[holes], holes)
        self.count = remaining

    def create(self, ids: np.ndarray) -> np.ndarray:
        """Rows for ``ids`` (none held yet) at their initial values, drawn where they are kept,
        with zeroed optimizer state; their slots."""
        begin = self.count
        self._reserve(begin + len(ids))
        initial_rows(self.spec, ids, out=self._values[begin:begin + len(ids)])
        return self._append(ids, {}, None, None)

    def take(self, ids: np.ndarray, values: np.ndarray, state: Dict[str, np.ndarray],
             last_used: Optional[np.ndarray] = None, uses: Optional[np.ndarray] = None) -> np.ndarray:
        """Add rows ``ids`` (none held yet) with ``values`` and optimizer ``state`` (zeros for
        names it lacks), e.g. moved here from another shard or a checkpoint; their slots."""
        begin = self.count
        self._reserve(begin + len(ids))
        self._values[begin:begin + len(ids)] = values
        return self._append(ids, state, last_used, uses)

    def _append(self, ids: np.ndarray, state: Dict[str, np.ndarray], last_used: Optional[np.ndarray],
                uses: Optional[np.ndarray]) -> np.ndarray:
        """The rest of rows ``ids``, whose values are in place after the live rows (room
        reserved): ids, optimizer state, heat, index entries; their slots."""
        begin, end = self.count, self.count + len(ids)
        self._ids[begin:end] = ids
        for name, array in self._state.items():
            array[begin:end] = state[name] if name in state else 0
        self._last_used[begin:end] = self.version if last_used is None else last_used
        self._uses[begin:end] = 0 if uses is None else uses
        slots = np.arange(begin, end, dtype=np.int64)
        self.index.insert(ids, slots)
        self.count = end
        return slots

    # -- storage -----------------------------------------------------------------------
    def _allocate(self, capacity: int) -> None:
        row = tuple(self.spec.shape[1:])
        self._ids = np.empty(capacity, np.int64)
        self._values = np.empty((capacity,) + row, self.spec.dtype)
        self._state = {name: np.empty((capacity,) + row, self.spec.dtype) for name in self._state_names}
        self._last_used = np.empty(capacity, np.int64)
        self._uses = np.empty(capacity, np.int64)

    def _arrays(self):
        return (self._ids, self._values, *self._state.values(), self._last_used, self._uses)

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` rows (doubling): the live rows copied once into larger arrays."""
        if rows <= len(self._ids):
            return
        old = [array[:self.count] for array in self._arrays()]
        self._allocate(max(rows, 2 * len(self._ids)))
        for array, live in zip(self._arrays(), old):
            array[:self.count] = live

    def __getstate__(self) -> dict:
        """Only the live rows travel (a replica, a checkpoint); the index is built again."""
        state = dict(self.__dict__)
        for name in ("_ids", "_values", "_last_used", "_uses"):
            state[name] = state[name][:self.count].copy()
        state["_state"] = {name: array[:self.count].copy() for name, array in self._state.items()}
        del state["index"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.index = IdIndex.of(self._ids, room=max(self.budget - self.count, 0))

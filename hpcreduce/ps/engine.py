"""The update rule of one shard: what a push does to a ``ShardState``.

A server runs it on the shard it serves; with fault tolerance its backup runs the same
code on its replica of that shard, fed with the pushes and BSP decisions the primary
forwards, so both hold the same values bit for bit (same pushes, same order, same
arithmetic). Exactly-once: a push whose step is not above the last step its worker
slot pushed to the table is a duplicate (acknowledged, not applied). BSP buffers a push
until its step is complete and then sums the step's gradients in slot order into one
optimizer update. Cost per push: the optimizer's passes over the piece (ASP/SSP), or
one addition per contributor and one update per step (BSP).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from .optimizers import Optimizer
from .consistency import Consistency
from .protocol import Status
from .shard_state import ShardState
from .updates import apply_dense, sum_rows

Contribution = Tuple[int, object]


class ShardEngine:
    """Applies pushes to ``state``.

    ``measured``: whether update lags are counted (a replica's read versions are not kept
    up to date, so it does not measure). ``before_update(table)`` runs before a dense
    piece changes (the server finishes the replies still reading it); ``pinned(buffer)``
    says whether a gradient buffer is still being sent (then it is not summed into in place).
    """

    def __init__(self, state: ShardState, optimizers: Mapping[int, Optimizer], consistency: Consistency,
                 *, measured: bool = True, before_update: Callable[[int], None] = lambda table: None,
                 pinned: Callable[[np.ndarray], bool] = lambda buffer: False):
        self.state, self.optimizers, self.consistency = state, optimizers, consistency
        self.measured, self.before_update, self.pinned = measured, before_update, pinned
        self.spare: Dict[int, List[np.ndarray]] = {}
        self.deferred: List[Tuple[int, np.ndarray]] = []

    def accept(self, slot: int, step: int, table_id: int, gradient) -> Status:
        """Take worker ``slot``'s push of ``step`` to a table: OK (applied, or buffered under
        BSP), DUPLICATE (already taken) or LATE (BSP: its step was applied already)."""
        state = self.state
        table = state.tables[table_id]
        if step <= table.last_push[slot]:
            state.duplicates[slot] += 1
            return Status.DUPLICATE
        if self.consistency.aggregates and step < state.applied_steps:
            return Status.LATE
        table.last_push[slot] = step
        if self.consistency.aggregates:
            state.pending.setdefault(step, {}).setdefault(table_id, []).append((slot, gradient))
        else:
            self.apply(table_id, [(slot, gradient)], table.version + 1)
        return Status.OK

    def accept_many(self, slot: int, step: int, gradients: List[Tuple[int, object]]) -> Tuple[Status, int]:
        """Take one push of several tables (table id, gradient) as ``accept`` takes each: LATE when
        any is late (under BSP then none is taken: lateness is the same for every table), else
        DUPLICATE when every table had it already, else OK; and how many were duplicates."""
        statuses = [self.accept(slot, step, table_id, gradient) for table_id, gradient in gradients]
        duplicates = statuses.count(Status.DUPLICATE)
        if Status.LATE in statuses:
            return Status.LATE, duplicates
        return (Status.DUPLICATE if statuses and duplicates == len(statuses) else Status.OK), duplicates

    def apply(self, table_id: int, contributions: List[Contribution], step: int) -> None:
        """One optimizer update of ``table_id`` from the contributions, summed in slot order."""
        state = self.state
        table = state.tables[table_id]
        contributions = sorted(contributions, key=lambda c: c[0])
        for slot, _ in contributions:
            if self.measured:
                state.update_lag[int(table.version - table.read_version[slot])] += 1
            state.applied[slot] += 1
        optimizer = self.optimizers[table_id]
        if table.sparse:  # a row store, by id (a dynamic one finds, admits and evicts rows now)
            table.apply(*sum_rows([grad for _, grad in contributions]), optimizer, step, state.row_events)
            return
        total = contributions[0][1]
        if len(contributions) > 1 and self.pinned(total):
            total = total.copy()
        for _, grad in contributions[1:]:
            total += grad
        self.before_update(table_id)
        apply_dense(table, total, optimizer, step)
        for _, grad in contributions:
            self.recycle(table_id, grad)

    def apply_completed(self, below: int, completed: int) -> bool:
        """BSP: apply every buffered step below ``below`` (each its own update, in order) and
        note ``completed`` steps done; True when the count of applied steps moved."""
        state = self.state
        for step in sorted(s for s in state.pending if s < below):
            for table_id, contributions in sorted(state.pending.pop(step).items()):
                self.apply(table_id, contributions, step + 1)
        before = state.applied_steps
        state.applied_steps = max(state.applied_steps, completed)
        return state.applied_steps != before

    def settle(self, restart: int) -> Dict[int, int]:
        """Recovery under BSP: apply the buffered steps below ``restart`` (complete: see
        docs/fault-tolerance.md), drop those from ``restart`` on (they are computed again)
        and forget the dropped pushes, so that they are taken again. Returns the dropped
        contributions per slot."""
        state = self.state
        self.apply_completed(restart, restart)
        dropped: Dict[int, int] = {}
        for step in [s for s in state.pending if s >= restart]:
            for contributions in state.pending.pop(step).values():
                for slot, _ in contributions:
                    dropped[slot] = dropped.get(slot, 0) + 1
        for table in state.tables.values():
            np.minimum(table.last_push, restart - 1, out=table.last_push)
        state.applied_steps = restart
        return dropped

    def take_buffer(self, table_id: int) -> np.ndarray:
        """A buffer for a dense gradient of ``table_id``'s piece (a spare one when there is one)."""
        spare = self.spare.get(table_id)
        if spare:
            return spare.pop()
        return np.empty_like(self.state.tables[table_id].values)

    def recycle(self, table_id: int, buffer: Optional[np.ndarray]) -> None:
        """Give a dense gradient buffer back for reuse; a ``pinned`` one waits in ``deferred``
        until ``recycle_unpinned``."""
        if not isinstance(buffer, np.ndarray):
            return
        if self.pinned(buffer):
            self.deferred.append((table_id, buffer))
        else:
            self.spare.setdefault(table_id, []).append(buffer)

    def recycle_unpinned(self) -> None:
        """Reuse the deferred buffers that are no longer being sent."""
        waiting, self.deferred = self.deferred, []
        for table_id, buffer in waiting:
            self.recycle(table_id, buffer)

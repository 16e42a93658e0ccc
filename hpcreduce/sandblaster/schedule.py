"""Which worker computes which work unit of a pass: load balancing and backup tasks.

Units are handed out in order to whichever worker asks. Once every unit has been handed
out, a free worker gets a backup, at most one per unit, and only one that pays: among the
unfinished units it does not hold, the one whose original is expected to finish last,
if the free worker would finish it sooner (speculative execution by expected finish time,
as Hadoop's LATE scheduler does: a copy of a unit running at normal speed would only take
cores from the original). Expected times come from ``pace``, each worker's seconds per
unit as last measured (a worker not yet measured counts as the typical one); a unit
already running past its expected time is expected to run as long again. The first
report of a unit is kept, later ones are dropped (``duplicates``). A pass is over when
every unit is kept and its keeper has confirmed it pushed to the servers. Pure
bookkeeping: no messages.
"""
from __future__ import annotations

import time
from collections import deque
from statistics import median
from typing import Dict, List, Mapping, Optional, Set


class UnitPass:
    """One pass over ``units`` work units; ``backups``: hand out backup tasks, timed by ``pace``
    (worker -> seconds per unit, read when a backup is considered)."""

    def __init__(self, units: int, backups: bool, pace: Optional[Mapping[int, float]] = None):
        self.units, self.backups = units, backups
        self.pace: Mapping[int, float] = pace if pace is not None else {}
        self.fresh = deque(range(units))
        self.handed: Dict[int, float] = {}     # unit -> when first handed out
        self.original: Dict[int, int] = {}     # unit -> the worker it was first handed to
        self.holders: Dict[int, Set[int]] = {}  # unit -> workers computing it
        self.kept: Dict[int, int] = {}          # unit -> the worker whose result counts
        self.unpushed: Dict[int, List[int]] = {}  # worker -> kept units not yet on the servers
        self.backed: Set[int] = set()
        self.pushed = 0
        self.started = time.perf_counter()
        self.backups_issued = self.duplicates = 0

    @property
    def done(self) -> bool:
        return self.pushed == self.units

    def next_unit(self, worker: int) -> Optional[int]:
        """The unit ``worker`` computes next, or None (nothing for it now)."""
        if self.fresh:
            unit = self.fresh.popleft()
            self.handed[unit], self.original[unit] = time.perf_counter(), worker
        else:
            unit = self._backup_for(worker)
            if unit is None:
                return None
            self.backed.add(unit)
            self.backups_issued += 1
        self.holders.setdefault(unit, set()).add(worker)
        return unit

    def _backup_for(self, worker: int) -> Optional[int]:
        """The unit whose original finishes last, if ``worker`` would finish it sooner."""
        if not self.backups:
            return None
        typical = median(self.pace.values()) if self.pace else 0.0
        now = time.perf_counter()
        best, latest = None, now + self.pace.get(worker, typical)
        for unit, handed in self.handed.items():
            if unit in self.kept or unit in self.backed or worker in self.holders.get(unit, ()):
                continue
            finish = handed + self.pace.get(self.original[unit], typical)
            if finish < now:  # overdue: as long again as it has run so far
                finish = now + (now - handed)
            if finish > latest:
                best, latest = unit, finish
        return best

    def report(self, worker: int, unit: int) -> bool:
        """``worker`` computed ``unit``: whether its result is the one kept."""
        self.holders.get(unit, set()).discard(worker)
        if unit in self.kept or unit not in self.handed:
            self.duplicates += 1
            return False
        self.kept[unit] = worker
        self.unpushed.setdefault(worker, []).append(unit)
        return True

    def holding(self, worker: int) -> bool:
        """Whether ``worker`` holds kept units not yet pushed."""
        return bool(self.unpushed.get(worker))

    def confirm(self, worker: int) -> None:
        """``worker`` pushed every unit it was told to keep."""
        self.pushed += len(self.unpushed.pop(worker, []))

    def fresh_left(self) -> int:
        return len(self.fresh)

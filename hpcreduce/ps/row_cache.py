"""A worker's cache of the sparse rows it pulled, never staler than SSP allows.

Under SSP with staleness s, a read at clock c must see every update of clocks below c - s.
A pulled row carries the slowest live clock m its server had when it answered (the reply's
``SLOWEST``): the value holds every update of clocks below m. It may therefore serve reads
up to clock m + s, and is dropped after. ``split`` finds which ids of a read the cache
holds (newest pull first); ``keep`` adds a pull's rows. At most s + 1 pulls per table are
held (older ones have expired), each as sorted ids and their rows, so a lookup is one
binary search per held pull. What it saved is counted: rows served and rows pulled.
Cost: the rows of the last s + 1 pulls per table; one ``searchsorted`` per held pull.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import numpy as np


@dataclass
class Pulled:
    """Rows of one pull: sorted ``ids`` and their ``values``, valid through clock ``until``."""

    ids: np.ndarray
    values: np.ndarray
    until: int


class RowCache:
    """Rows pulled at most ``staleness`` clocks ago (see the module docstring)."""

    def __init__(self, staleness: int):
        if staleness < 1:
            raise ValueError(f"a row cache needs SSP staleness >= 1 (at 0 no row outlives its step), got {staleness}")
        self.staleness = staleness
        self.pulls: Dict[int, List[Pulled]] = {}
        self.served = 0
        self.pulled = 0

    def split(self, table: int, ids: np.ndarray, clock: int, rows: np.ndarray) -> np.ndarray:
        """Which of ``ids`` the cache can serve at ``clock`` (a mask); their rows are written
        into ``rows`` (aligned with ``ids``)."""
        held = [p for p in self.pulls.get(table, []) if p.until >= clock]
        self.pulls[table] = held
        found = np.zeros(len(ids), dtype=bool)
        for pull in reversed(held):  # newest first
            wanted = np.flatnonzero(~found)
            if not len(wanted):
                break
            at = np.minimum(np.searchsorted(pull.ids, ids[wanted]), len(pull.ids) - 1)
            hit = pull.ids[at] == ids[wanted]
            rows[wanted[hit]] = pull.values[at[hit]]
            found[wanted[hit]] = True
        self.served += int(found.sum())
        return found

    def keep(self, table: int, ids: np.ndarray, values: np.ndarray, slowest: int) -> None:
        """Hold the rows a pull returned (the servers' slowest clock when answering: ``slowest``)."""
        self.pulled += len(ids)
        order = np.argsort(ids, kind="stable")
        self.pulls.setdefault(table, []).append(Pulled(ids[order], values[order], slowest + self.staleness))

    def summary(self) -> Dict[str, float]:
        """Rows served from the cache and pulled, and the share of reads it served."""
        total = self.served + self.pulled
        return {"rows_served": self.served, "rows_pulled": self.pulled,
                "hit_rate": round(self.served / total, 4) if total else 0.0}

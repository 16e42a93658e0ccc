"""The coordinator's committed state: what a survivor needs to carry on after any failure.

At every commit point (after the first evaluation and after each accepted step) the
coordinator sends every server one record (``Kind.RECORD``); servers keep them all. The
vectors a record names (x[c], g[c] and the history slots in ``pairs``) are not written
again before the next record, so a coordinator started from the newest record that some
server holds redoes at most the iteration that was in progress. The records also give the
log rows of the iterations done so far.
Cost: 8 * (17 + 2m) bytes to each server per iteration (m pairs of history).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

STOPS = ("iterations", "gtol", "ftol", "line search")
HEAD = 17


@dataclass
class Committed:
    """``iteration`` (0: after the first evaluation), the committed buffer ``c``, the next first
    step ``t``, ``gamma``, the point's ``f``, ``gg`` and pass ``stats``; the iteration's accepted
    ``step`` and ``evaluations``; the counters ``units``, ``passes``, ``backups``, ``duplicates``;
    ``stop`` (index in ``STOPS``, -1: not stopped); ``pairs`` (slot, rho), newest first."""

    iteration: int
    c: int
    t: float
    gamma: float
    f: float
    gg: float
    stats: Tuple[float, float, float]
    step: float
    evaluations: int
    units: int
    passes: int
    backups: int
    duplicates: int
    stop: int
    pairs: List[Tuple[int, float]]

    def to_array(self) -> np.ndarray:
        head = [self.iteration, self.c, self.t, self.gamma, self.f, self.gg, *self.stats, self.step,
                self.evaluations, self.units, self.passes, self.backups, self.duplicates, self.stop, len(self.pairs)]
        return np.array(head + [value for pair in self.pairs for value in pair], np.float64)

    @classmethod
    def from_array(cls, a: np.ndarray) -> "Committed":
        n = int(a[HEAD - 1])
        pairs = [(int(a[HEAD + 2 * i]), float(a[HEAD + 2 * i + 1])) for i in range(n)]
        return cls(int(a[0]), int(a[1]), float(a[2]), float(a[3]), float(a[4]), float(a[5]),
                   (float(a[6]), float(a[7]), float(a[8])), float(a[9]), int(a[10]), int(a[11]), int(a[12]),
                   int(a[13]), int(a[14]), int(a[15]), pairs)

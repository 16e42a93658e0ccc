"""L-BFGS and gradient descent as vector-op programs on the servers, driven by the coordinator.

Parameters x, gradients g, the direction d and the (s, y) history stay sharded on the
servers; the coordinator keeps only scalars (f, rho_i = 1/s_i.y_i, gamma). x and g are
double buffered: the committed point is c, a trial point 1-c, so every op before a
commit writes only vectors derived from unchanged ones.

Per iteration: the two-loop recursion d = -H g (initial H0 = gamma I, gamma = s.y/y.y of the
newest pair; each loop step one round trip: an axpy then the next dot); if g.d >= 0 the
history is dropped and d = -g. Line search: trial x[1-c] = x[c] + t d, one pass of work units
(f and g together); accepted on Armijo (c1 = 1e-4) with |the upper strong-Wolfe curvature
bound| g_t.d <= c2 |g.d| (c2 = 0.9), else t shrinks to a safeguarded cubic step in
[0.1 t, 0.5 t]. First t = min(1, 1/||g||), then 1 (L-BFGS) or twice the last accepted (gd).
On acceptance s = x[1-c] - x[c], y = g[1-c] - g[c] (dropped if s.y <= 1e-10); c := 1-c.
Stops on ||g|| <= gtol, a relative drop of f <= ftol, or ``iterations``; ``stop_wanted()``, asked
after each commit, ends the run there early (a stop signal: resumed later from the record). After the first
evaluation and each commit the state is recorded on the servers (``record.Committed``);
``resume`` starts from such a record instead of x[0] (after a failure).
Cost: per iteration 2m + 3 op round trips of at most 4 ops (48 bytes each) to each server,
one record, plus per evaluation a pass and one round trip; only scalars come back.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Deque, List, Optional, Tuple

from .coordinator import Coordinator
from .protocol import Code, VectorNames
from .record import STOPS, Committed

C1, C2 = 1e-4, 0.9
MAX_EVALUATIONS = 20
MIN_CURVATURE = 1e-10


@dataclass
class Settings:
    method: str          # "lbfgs" or "gd"
    history: int
    gtol: float
    ftol: float
    iterations: int
    batch: int
    l2: float


@dataclass
class Point:
    """What one evaluation gave: f, ||g||^2, g.d at the point, and the pass's [loss, correct, count]."""

    f: float
    gg: float
    gd: float
    stats: Tuple[float, float, float]


@dataclass
class Iteration:
    iteration: int
    f: float
    accuracy: float
    gradient_norm: float
    step: float
    evaluations: int


class BatchOptimizer:
    """Runs ``settings.method`` through ``coordinator``; ``on_iteration`` gets each iteration."""

    def __init__(self, coordinator: Coordinator, settings: Settings,
                 on_iteration: Callable[[Iteration], None], resume: Optional[Committed] = None,
                 stop_wanted: Callable[[], bool] = lambda: False):
        self.co, self.settings, self.on_iteration, self.resume = coordinator, settings, on_iteration, resume
        self.stop_wanted = stop_wanted
        self.names = VectorNames(settings.history)
        self.c = 0
        self.pairs: Deque[Tuple[int, float]] = deque()  # (slot, rho), newest first
        self.gamma = 1.0
        self.iterations = 0
        self.stopped_by = "iterations"
        self.finished = False
        self.stopped_early = False  # a stop signal ended the run at a commit point (``stop_wanted``)

    def run(self) -> Point:
        """Optimise from x[0] (or from ``resume``); the committed point's evaluation at the end."""
        s = self.settings
        point, t = self._start()
        while not self.finished and self.iterations < s.iterations:
            if math.sqrt(point.gg) <= s.gtol:
                self.stopped_by = "gtol"
                break
            if self.stop_wanted():
                self.stopped_early = True
                break
            gd = self._direction()
            if gd >= 0:
                self.pairs.clear()
                gd = self._ops([(Code.LINCOMB, self.names.G[self.c], self.names.D, self.names.G[self.c], -1, 0),
                                (Code.DOT, self.names.G[self.c], self.names.D)])[-1]
            found = self._line_search(point, gd, t)
            if found is None:
                self.stopped_by = "line search"
                break
            trial, step, evaluations = found
            self._commit()
            self.iterations += 1
            if point.f - trial.f <= s.ftol * max(abs(point.f), abs(trial.f), 1.0):
                self.stopped_by, self.finished = "ftol", True
            t = 1.0 if s.method == "lbfgs" else 2.0 * step
            self._save(trial, t, step, evaluations)
            count = max(trial.stats[2], 1.0)
            self.on_iteration(Iteration(self.iterations, trial.f, trial.stats[1] / count, math.sqrt(trial.gg),
                                        step, evaluations))
            point = trial
        return point

    def _start(self) -> Tuple[Point, float]:
        """The committed point and the first step to try: x[0]'s evaluation (recorded), or the record's."""
        r = self.resume
        if r is None:
            point = self._evaluate(0)
            t = min(1.0, 1.0 / max(math.sqrt(point.gg), 1e-300))
            self._save(point, t, 0.0, 1)
            return point, t
        self.iterations, self.c, self.gamma, self.pairs = r.iteration, r.c, r.gamma, deque(r.pairs)
        self.finished = r.stop >= 0
        self.stopped_by = STOPS[r.stop] if self.finished else self.stopped_by
        co = self.co
        co.counted, co.passes, co.backups_issued, co.duplicates = r.units, r.passes, r.backups, r.duplicates
        co.pass_id = r.passes - 1
        return Point(r.f, r.gg, 0.0, r.stats), r.t

    def _save(self, point: Point, t: float, step: float, evaluations: int) -> None:
        co = self.co
        stop = STOPS.index(self.stopped_by) if self.finished else -1
        co.record(Committed(self.iterations, self.c, t, self.gamma, point.f, point.gg, point.stats, step,
                            evaluations, co.counted, co.passes, co.backups_issued, co.duplicates, stop,
                            list(self.pairs)).to_array())

    def _ops(self, rows: List[tuple]) -> List[float]:
        return list(self.co.ops([tuple(row) + (0,) * (6 - len(row)) for row in rows]))

    def _evaluate(self, j: int) -> Point:
        """A pass at x[j], then g[j] = acc/batch + l2 x[j]; f, ||g||^2 and g.d."""
        n, s = self.names, self.settings
        loss, correct, count = self.co.evaluate(n.X[j], self.iterations + 1)
        _, _, xx, gg, gd = self._ops([(Code.SYNC,), (Code.LINCOMB, n.ACC, n.G[j], n.X[j], 1.0 / s.batch, s.l2),
                                   (Code.DOT, n.X[j], n.X[j]), (Code.DOT, n.G[j], n.G[j]),
                                   (Code.DOT, n.G[j], n.D)])
        return Point(loss / s.batch + 0.5 * s.l2 * xx, gg, gd, (loss, correct, count))

    def _direction(self) -> float:
        """d = -H g[c] by the two-loop recursion (-g for gd or no history); returns g.d."""
        n, g = self.names, self.names.G[self.c]
        pairs = list(self.pairs)
        if self.settings.method == "gd" or not pairs:
            return self._ops([(Code.LINCOMB, g, n.D, g, -1, 0), (Code.DOT, g, n.D)])[-1]
        dot = self._ops([(Code.LINCOMB, g, n.Q, g, 1, 0), (Code.DOT, n.s(pairs[0][0]), n.Q)])[-1]
        alphas = []
        for i, (slot, rho) in enumerate(pairs):
            alpha = rho * dot
            alphas.append(alpha)
            rows = [(Code.AXPY, n.y(slot), n.Q, 0, -alpha)]
            if i + 1 < len(pairs):
                rows.append((Code.DOT, n.s(pairs[i + 1][0]), n.Q))
            else:
                rows += [(Code.SCALE, n.Q, 0, 0, self.gamma), (Code.DOT, n.y(slot), n.Q)]
            dot = self._ops(rows)[-1]
        for i in reversed(range(len(pairs))):
            slot, rho = pairs[i]
            rows = [(Code.AXPY, n.s(slot), n.Q, 0, alphas[i] - rho * dot)]
            if i > 0:
                rows.append((Code.DOT, n.y(pairs[i - 1][0]), n.Q))
            else:
                rows += [(Code.LINCOMB, n.Q, n.D, n.Q, -1, 0), (Code.DOT, g, n.D)]
            dot = self._ops(rows)[-1]
        return dot

    def _line_search(self, start: Point, gd: float, t: float) -> Optional[Tuple[Point, float, int]]:
        """(trial point, step, evaluations) accepted, or None after MAX_EVALUATIONS."""
        n, trial_j = self.names, 1 - self.c
        for evaluations in range(1, MAX_EVALUATIONS + 1):
            self._ops([(Code.LINCOMB, n.X[self.c], n.X[trial_j], n.D, 1, t)])
            trial = self._evaluate(trial_j)
            if trial.f <= start.f + C1 * t * gd and trial.gd <= C2 * abs(gd):
                return trial, t, evaluations
            t = _cubic_step(t, start.f, gd, trial.f, trial.gd)
        return None

    def _commit(self) -> None:
        """Store (s, y) in a free slot (kept if s.y > MIN_CURVATURE), then c := 1 - c."""
        n, c = self.names, self.c
        used = {slot for slot, _ in self.pairs}
        slot = next(i for i in range(n.slots) if i not in used)
        _, _, sy, yy = self._ops([(Code.LINCOMB, n.X[1 - c], n.s(slot), n.X[c], 1, -1),
                                  (Code.LINCOMB, n.G[1 - c], n.y(slot), n.G[c], 1, -1),
                                  (Code.DOT, n.s(slot), n.y(slot)), (Code.DOT, n.y(slot), n.y(slot))])
        if sy > MIN_CURVATURE:
            self.pairs.appendleft((slot, 1.0 / sy))
            self.gamma = sy / yy
            if len(self.pairs) > self.settings.history:
                self.pairs.pop()
        self.c = 1 - c


def _cubic_step(t: float, f0: float, g0: float, ft: float, gt: float) -> float:
    """The minimiser of the cubic through (0, f0, g0) and (t, ft, gt), kept in [0.1 t, 0.5 t]."""
    d1 = g0 + gt - 3.0 * (ft - f0) / t
    radicand = d1 * d1 - g0 * gt
    if radicand < 0 or not math.isfinite(radicand):
        return 0.5 * t
    d2 = math.sqrt(radicand)
    denominator = gt - g0 + 2.0 * d2
    step = t - t * (gt + d2 - d1) / denominator if denominator else 0.5 * t
    return min(max(step, 0.1 * t), 0.5 * t) if math.isfinite(step) else 0.5 * t

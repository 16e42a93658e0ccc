"""The Sandblaster coordinator: issues vector ops to the servers and runs passes of work units.

It holds no parameters. ``ops`` sends one batch of op rows to every server and sums the
servers' partial results (dot products); ``evaluate(point)`` runs one pass at x[point]:
servers begin the pass, workers are handed units (``schedule.UnitPass``: load balancing
and backups), each report is kept (first) or dropped (later), and the pass ends when every
unit is confirmed pushed. Returns [loss_sum, correct, count] of the kept units. ``record``
leaves the optimizer's committed state on every server (``record``).
Cost: per op batch 48n + 16 bytes to each server and 8n back; per unit 64 bytes from the
worker and 48 back; per record its bytes to each server. Every role waits for a message
without spinning (``runtime.idle``): five roles on two busy cores leave them to whoever computes.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ..runtime.context import Traffic
from ..runtime.idle import receive
from .protocol import (DONE, HEADER_LEN, ROW, TAG_ANSWER, TAG_PAYLOAD, TAG_REPLY, TAG_REQUEST, TAG_WORK,
                       WORK_LEN, Action, Code, Kind, Work, answer, header)
from .schedule import UnitPass

OpRow = Tuple[float, float, float, float, float, float]


class Coordinator:
    """Ops to the servers (ranks ``servers``) and passes over ``units`` units by ``workers``;
    ``on_begin(iteration)`` once each pass has begun on the servers."""

    def __init__(self, comm: MPI.Intracomm, servers: Sequence[int], workers: Sequence[int], units: int,
                 backups: bool, traffic: Traffic, on_begin: Callable[[int], None] = lambda iteration: None):
        self.comm, self.servers, self.workers, self.traffic = comm, list(servers), list(workers), traffic
        self.units, self.backups, self.on_begin = units, backups, on_begin
        self.pass_id = -1
        self.passes = self.iteration = 0
        self.sched = UnitPass(0, backups)
        self.parked: List[int] = []
        self.given: Dict[int, float] = {}
        self.unit_s: Dict[int, float] = {}
        self.counted = self.backups_issued = self.duplicates = 0
        self.pass_s: List[float] = []
        self.units_by_worker: Dict[int, int] = {rank: 0 for rank in workers}

    def ops(self, rows: Sequence[OpRow]) -> np.ndarray:
        """Apply ``rows`` on every server, in order; each row's result summed over the servers."""
        payload = np.asarray(rows, np.float64).reshape(-1, ROW)
        for server in self.servers:
            self.comm.Send(header(Kind.OPS, len(payload)), dest=server, tag=TAG_REQUEST)
            self.comm.Send(payload, dest=server, tag=TAG_PAYLOAD)
        total, part = np.zeros(len(payload)), np.empty(len(payload))
        for server in self.servers:
            receive(self.comm, part, server, TAG_REPLY)
            total += part
        self.traffic.add(payload.nbytes * len(self.servers), part.nbytes * len(self.servers))
        return total

    def record(self, values: np.ndarray) -> None:
        """Keep ``values`` (the committed state) on every server; returns once all have it."""
        for server in self.servers:
            self.comm.Send(header(Kind.RECORD, len(values)), dest=server, tag=TAG_REQUEST)
            self.comm.Send(values, dest=server, tag=TAG_PAYLOAD)
        ack = np.empty(HEADER_LEN, np.int64)
        for server in self.servers:
            receive(self.comm, ack, server, TAG_REPLY)
        self.traffic.add(values.nbytes * len(self.servers), 0)

    def evaluate(self, point: int, iteration: int = 0) -> np.ndarray:
        """One pass at x[point] (of ``iteration``): [loss_sum, correct, count] of the units kept."""
        started = time.perf_counter()
        self.pass_id += 1
        self.iteration = iteration
        self.ops([(Code.BEGIN, point, 0, 0, self.pass_id, iteration)])
        self.on_begin(iteration)
        self.sched = UnitPass(self.units, self.backups, self.unit_s)
        stats = np.zeros(3)
        parked, self.parked = self.parked, []
        for worker in parked:
            self._answer(worker, False)
        message, status = np.zeros(WORK_LEN), MPI.Status()
        while not self.sched.done:
            receive(self.comm, message, MPI.ANY_SOURCE, TAG_WORK, status)
            worker = status.Get_source()
            self._answer(worker, self._take(worker, message, stats))
        self.counted += self.units
        self.passes += 1
        self.backups_issued += self.sched.backups_issued
        self.duplicates += self.sched.duplicates
        self.pass_s.append(time.perf_counter() - started)
        return stats

    def _take(self, worker: int, message: np.ndarray, stats: np.ndarray) -> bool:
        """Book a worker's message; whether the unit it reports is kept."""
        current = int(message[Work.PASS]) == self.pass_id
        if message[Work.PUSHED] and current:
            self.sched.confirm(worker)
        if message[Work.KIND] != DONE:
            return False
        now = time.perf_counter()
        self.unit_s[worker] = now - self.given.get(worker, now)
        if current and self.sched.report(worker, int(message[Work.UNIT])):
            stats += message[Work.LOSS:Work.COUNT + 1]
            self.units_by_worker[worker] += 1
            return True
        self.duplicates += not current  # a late result of a pass already complete
        return False

    def _answer(self, worker: int, keep: bool) -> None:
        """Give ``worker`` its next unit, tell it to flush, or park it until the next pass."""
        unit = self.sched.next_unit(worker)
        if unit is not None:
            self.given[worker] = time.perf_counter()
            reply = answer(keep, Action.UNIT, self.pass_id, unit, self._push_first(worker), self.iteration)
        elif self.sched.holding(worker):
            reply = answer(keep, Action.FLUSH, self.pass_id)
        else:
            self.parked.append(worker)
            return
        self.comm.Send(reply, dest=worker, tag=TAG_ANSWER)

    def _push_first(self, worker: int) -> bool:
        """Whether ``worker`` should push what it holds before computing its next unit: when
        its units take longer than the fresh units left will last (else a straggler holding
        kept units would keep the pass open after its backups finished)."""
        sched = self.sched
        if not sched.holding(worker):
            return False
        rate = len(sched.kept) / max(time.perf_counter() - sched.started, 1e-9)
        left = sched.fresh_left() / rate if rate > 0 else math.inf
        return self.unit_s.get(worker, 0.0) >= left

    def stop(self) -> None:
        """End the run: the servers stop, and every worker is told so (late reports dropped)."""
        for server in self.servers:
            self.comm.Send(header(Kind.STOP), dest=server, tag=TAG_REQUEST)
        waiting = set(self.workers) - set(self.parked)
        for worker in self.parked:
            self.comm.Send(answer(False, Action.STOP), dest=worker, tag=TAG_ANSWER)
        message, status = np.zeros(WORK_LEN), MPI.Status()
        while waiting:
            receive(self.comm, message, MPI.ANY_SOURCE, TAG_WORK, status)
            worker = status.Get_source()
            self.duplicates += int(message[Work.KIND] == DONE)
            self.comm.Send(answer(False, Action.STOP), dest=worker, tag=TAG_ANSWER)
            waiting.discard(worker)
        self.parked = []


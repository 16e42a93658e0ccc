"""The server's serve loop: order, consistency, updates, replies.

One loop per server rank: ``Probe`` for any worker's request, receive it whole
(``inbox.receive``), queue it behind that worker's earlier requests, then answer every
queue head that may be answered. A read that consistency holds back blocks only its
own worker's queue; other workers keep being served. Replies leave with ``Isend``; a
dense pull's reply is sent straight from the parameters, so an update of that piece
first waits for those sends to finish. Pushes are acknowledged once applied (ASP,
SSP) or buffered for their step (BSP); the fault-tolerance layer will replicate the
update to the next shard before that acknowledgement (``_acknowledge``).

Cost per request: one header (64 B) each way plus the payloads; see docs/parameter-server.md.
"""
from __future__ import annotations

from collections import deque
from typing import Deque, Dict, List, Mapping, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..runtime.context import Traffic
from ..train.optimizers import Optimizer
from . import inbox, protocol
from .consistency import Consistency
from .inbox import Request
from .layout import Layout
from .protocol import PULLS, TAG_REPLY, Op, Status
from .state import ShardState
from .updates import apply_dense, apply_rows, sum_rows

NOBODY_LIVE = np.iinfo(np.int64).max
EMPTY = np.empty(0, dtype=np.uint8)


class Server:
    """Serves one shard (``state``) to the workers of ``layout``."""

    def __init__(self, comm: MPI.Intracomm, layout: Layout, state: ShardState,
                 optimizers: Mapping[int, Optimizer], consistency: Consistency,
                 traffic: Optional[Traffic] = None):
        self.comm, self.layout, self.state = comm, layout, state
        self.optimizers, self.consistency = optimizers, consistency
        self.traffic = traffic if traffic is not None else Traffic()
        self.queues: List[Deque[Request]] = [deque() for _ in range(layout.workers)]
        self.released = np.zeros(layout.workers, dtype=bool)
        self.outbox: List[Tuple[MPI.Request, np.ndarray, Optional[int]]] = []
        self.spare: Dict[int, List[np.ndarray]] = {}
        self.clock_moved = False

    def serve(self) -> None:
        """Answer requests until every worker has released this server."""
        self.released[:] = False
        status = MPI.Status()
        while not self.released.all():
            self.comm.Probe(MPI.ANY_SOURCE, protocol.TAG_REQUEST, status)
            request = inbox.receive(self.comm, status.Get_source(), self.layout, self.state,
                                    self._take_buffer)
            if request.worker < 0:
                self._answer(request)
            else:
                self.queues[request.worker].append(request)
                self._make_progress()
            self._retire_sends()
        MPI.Request.Waitall([entry[0] for entry in self.outbox])
        self.outbox.clear()

    def slowest(self) -> int:
        """The smallest clock among live (unreleased) workers."""
        live = self.state.clocks[~self.released]
        return int(live.min()) if live.size else NOBODY_LIVE

    def _make_progress(self) -> None:
        """Answer queue heads until nothing moves (a clock that moves may unblock reads)."""
        while True:
            self.clock_moved = False
            for queue in self.queues:
                while queue and self._answer(queue[0]):
                    queue.popleft()
            if not self.clock_moved:
                return

    def _answer(self, request: Request) -> bool:
        """Answer ``request`` if consistency allows it now; False if it must wait."""
        worker = request.worker
        if worker >= 0 and request.clock > self.state.clocks[worker]:
            self.state.clocks[worker] = request.clock
            self._clock_moved()
        if request.problem is not None:
            self._refuse(request)
        elif request.op == Op.RELEASE:
            self.released[worker] = True
            self._clock_moved()
        elif request.op in PULLS:
            slowest = self.slowest()
            if not self.consistency.may_read(request.clock, slowest):
                return False
            self._read(request, slowest)
        elif request.op in (Op.PUSH, Op.PUSH_ROWS):
            self._push(request)
        return True

    def _clock_moved(self) -> None:
        """The slowest clock may have moved: under BSP, apply the steps it completed right
        away, so that no read is ever answered before its step's update."""
        self.clock_moved = True
        if self.consistency.aggregates:
            self._apply_completed_steps()

    def _read(self, request: Request, slowest: int) -> None:
        table = self.state.tables[request.table]
        self.state.read_staleness[max(0, request.clock - slowest)] += 1
        table.read_version[request.worker] = table.version
        if table.sparse:
            self._reply(request, Status.OK, table.values[request.local], reads=None)
        else:
            self._reply(request, Status.OK, table.values, reads=request.table)

    def _push(self, request: Request) -> None:
        table = self.state.tables[request.table]
        worker, step = request.worker, request.clock
        if step <= table.last_push[worker]:
            self.state.duplicates[worker] += 1
            self._release_buffer(request)
            self._reply(request, Status.DUPLICATE)
            return
        if self.consistency.aggregates and step < self.state.applied_steps:
            request.problem = (Status.LATE, step)
            self._refuse(request)
            return
        table.last_push[worker] = step
        grad = self._gradient(request)
        if self.consistency.aggregates:
            self.state.pending.setdefault(step, {}).setdefault(request.table, []).append((worker, grad))
        else:
            self._apply(request.table, [(worker, grad)], table.version + 1)
        self._acknowledge(request)

    def _gradient(self, request: Request):
        if request.op == Op.PUSH:
            return request.payloads[0]
        return request.local, request.payloads[1]

    def _acknowledge(self, request: Request) -> None:
        """Acknowledge an accepted push (the fault-tolerance layer replicates first)."""
        self._reply(request, Status.OK)

    def _apply(self, table_id: int, contributions: List[Tuple[int, object]], step: int) -> None:
        """One optimizer update of ``table_id`` from the contributions, summed in worker order."""
        table = self.state.tables[table_id]
        contributions = sorted(contributions, key=lambda c: c[0])
        for worker, _ in contributions:
            self.state.update_lag[int(table.version - table.read_version[worker])] += 1
            self.state.applied[worker] += 1
        optimizer = self.optimizers[table_id]
        if table.sparse:
            local, grads = sum_rows([grad for _, grad in contributions])
            apply_rows(table, local, grads, optimizer, step)
            return
        total = contributions[0][1]
        for _, grad in contributions[1:]:
            total += grad
        self._wait_reads(table_id)
        apply_dense(table, total, optimizer, step)
        for _, grad in contributions:
            self.spare.setdefault(table_id, []).append(grad)

    def _apply_completed_steps(self) -> None:
        """BSP: apply every buffered step that all live workers have finished."""
        slowest = self.slowest()
        for step in sorted(s for s in self.state.pending if s < slowest):
            for table_id, contributions in sorted(self.state.pending.pop(step).items()):
                self._apply(table_id, contributions, step + 1)
        completed = min(slowest, int(self.state.clocks.max()))
        self.state.applied_steps = max(self.state.applied_steps, completed)

    def _refuse(self, request: Request) -> None:
        status, detail = request.problem
        self._release_buffer(request)
        if request.worker >= 0:
            self.state.refused[request.worker] += 1
        self.state.refusals[status.name] += 1
        if request.op in protocol.REPLIED:
            self._reply(request, status, detail=detail)

    def _reply(self, request: Request, status: Status, payload: Optional[np.ndarray] = None, *,
               reads: Optional[int] = None, detail: int = 0) -> None:
        """Send the reply header and, for pulls, the payload (empty when refused)."""
        table = self.state.tables.get(request.table)
        header = protocol.reply(request.header, self.state.shard, status,
                                version=table.version if table is not None else 0,
                                count=0 if payload is None else payload.size, detail=detail,
                                slowest=self.slowest())
        self._send(header, request.source, None)
        sent = 0
        if request.op in PULLS:
            body = EMPTY if payload is None else payload
            self._send(body, request.source, reads)
            sent = body.nbytes
        self.traffic.add(sent, request.nbytes)
        self.state.count_traffic(request.clock, sent, request.nbytes)

    def _send(self, buffer: np.ndarray, dest: int, reads: Optional[int]) -> None:
        self.outbox.append((self.comm.Isend(buffer, dest, TAG_REPLY), buffer, reads))

    def _retire_sends(self) -> None:
        if self.outbox:
            done = set(MPI.Request.Testsome([entry[0] for entry in self.outbox]) or ())
            if done:
                self.outbox = [entry for i, entry in enumerate(self.outbox) if i not in done]

    def _wait_reads(self, table_id: int) -> None:
        """Finish the replies still reading ``table_id``'s values before they change."""
        waiting = [entry for entry in self.outbox if entry[2] == table_id]
        if waiting:
            MPI.Request.Waitall([entry[0] for entry in waiting])
            self.outbox = [entry for entry in self.outbox if entry[2] != table_id]

    def _take_buffer(self, table_id: int) -> np.ndarray:
        spare = self.spare.get(table_id)
        if spare:
            return spare.pop()
        values = self.state.tables[table_id].values
        return np.empty_like(values)

    def _release_buffer(self, request: Request) -> None:
        """Return a refused or duplicate push's gradient buffer to the spares."""
        if request.borrowed is not None:
            self.spare.setdefault(request.table, []).append(request.borrowed)
            request.borrowed = None

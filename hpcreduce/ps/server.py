"""The server's serve loop: order, consistency, updates, replies.

One loop per server rank: ``Probe`` for any worker's request, receive it whole
(``inbox.receive``), queue it behind that worker's earlier requests, then answer every
queue head that may be answered. A read that consistency holds back blocks only its
own worker's queue; other workers keep being served. Replies leave with ``Isend``; a
dense pull's reply is sent straight from the parameters, so an update of that piece
first waits for those sends to finish. What a push does to the shard is the update
rule of ``engine.ShardEngine``. With fault tolerance (``replicate``), every accepted
push is forwarded to the backup server first and acknowledged to its worker only once
the backup has applied it (``replication.Replication``); the loop then also serves the
forwards of the server whose backup it is. A fused push-pull is taken when it reaches its
queue's head and answered with the values once a read at the next clock may be; while it
waits, the pushes and clocks queued behind it are taken (``_run_ahead``).

An idle server waits without spinning (``idle.wait_until``: polls with back-off up to 1 ms),
and counts its CPU seconds per step (``stats.RequestLoad``).
Cost per request: one header (72 B) each way plus the payloads; see docs/parameter-server.md.
"""
from __future__ import annotations

from collections import deque
from contextlib import nullcontext
from typing import Callable, Deque, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
from mpi4py import MPI

from ..runtime.context import Traffic
from ..runtime.failures import abandon, wait_all
from .optimizers import Optimizer
from . import inbox, protocol
from .consistency import Consistency
from ..runtime.idle import wait_until
from .engine import ShardEngine
from .inbox import Request, table_gradients
from .key_cache import KnownKeys
from .layout import Layout
from .replication import NoForwarding, Replication
from .protocol import (CLOCK_STALENESS, CLOCK_STATS, DENSE_PUSHES, FUSED, PULLS, PUSHES, TAG_REPLY, TAG_REQUEST,
                       VALUES_BACK, Op, Status)
from .shard_state import ShardState
from .stats import RequestLoad

NOBODY_LIVE = np.iinfo(np.int64).max
EMPTY = np.empty(0, dtype=np.uint8)
RETIRE_AT = 16  # finished reply sends are collected in batches, not after every request
Guard = Callable[[str], object]


class Server:
    """Serves one shard (``state``) to the workers of ``layout``.

    ``guard(what)``: a context manager around every blocking wait (the fault-tolerance
    watchdog; none by default). ``on_progress(server, slowest)``: called whenever the
    slowest live clock moves (fault injection, checkpoints, growth, recovery timing).
    """

    def __init__(self, comm: MPI.Intracomm, layout: Layout, state: ShardState,
                 optimizers: Mapping[int, Optimizer], consistency: Consistency,
                 traffic: Optional[Traffic] = None, *, guard: Optional[Guard] = None,
                 on_progress: Optional[Callable[["Server", int], None]] = None):
        self.comm, self.layout, self.consistency = comm, layout, consistency
        self.engine = ShardEngine(state, optimizers, consistency, before_update=self._wait_reads,
                                  pinned=self._pinned)
        self.traffic = traffic if traffic is not None else Traffic()
        self.guard = guard
        self.on_progress = on_progress
        self.forwarding = NoForwarding(self)  # Replication once ``replicate`` gives it a backup
        self.queues: Dict[int, Deque[Request]] = {slot: deque() for slot in layout.worker_slots}
        self.live = np.zeros(layout.slot_count, dtype=bool)
        self.live[list(layout.worker_slots)] = True
        self.released = np.zeros(layout.slot_count, dtype=bool)
        self._counted: List[int] = []  # the live, unreleased slots (``slowest`` reads only these)
        self._recount()
        self.outbox: List[Tuple[MPI.Request, Union[np.ndarray, bytes], Optional[int]]] = []
        self.clock_moved = False
        self.load = RequestLoad()
        self.known_keys = KnownKeys()
        self._slowest = NOBODY_LIVE
        self._listening: Optional[MPI.Request] = None  # the request receive posted while idle
        self._waiting = f"server rank {comm.Get_rank()} waiting for requests"

    @property
    def state(self) -> ShardState:
        return self.engine.state

    @property
    def optimizers(self) -> Mapping[int, Optimizer]:
        return self.engine.optimizers

    def replicate(self, backup_rank: int, primary_rank: int, replica: ShardState) -> None:
        """Keep the shard's replica on ``backup_rank`` and the replica of the shard of
        ``primary_rank`` here (fault tolerance with two or more servers)."""
        self.forwarding = Replication(self, backup_rank, primary_rank, replica)

    def serve(self) -> None:
        """Answer requests until every live worker has released this server (and, when
        replicating, until the forwards both ways are finished)."""
        self.released[:] = False
        self._recount()
        self._slowest = self.slowest()
        status = MPI.Status()
        reported = None
        while True:
            slowest = self._slowest
            if slowest != reported:
                reported = slowest
                self.load.reached(slowest)
                if self.on_progress is not None:
                    self.on_progress(self, slowest)
            if slowest == NOBODY_LIVE and self._finished():
                break
            if self.guard is None:  # the idle wait, on every request's path: no context manager
                header = self._next_message(status)
            else:
                with self.guard(self._waiting):
                    header = self._next_message(status)
            source = status.Get_source()
            if status.Get_tag() == TAG_REQUEST:
                request = inbox.receive(self.comm, source, self.layout, self.state, self.engine.take_buffer,
                                        header=header, keys=self.known_keys)
                queue = self.queues.get(request.slot) if request.slot >= 0 else None
                if queue is None:
                    self._answer(request)
                else:
                    queue.append(request)
                    self._make_progress(queue)
                self.load.request(request.clock - (request.op == Op.CLOCK), request.nbytes)
            else:
                self.forwarding.handle(status.Get_tag(), source)
            if len(self.outbox) >= RETIRE_AT:
                self._retire_sends()
        with self._guarded(f"server rank {self.comm.Get_rank()} finishing its replies"):
            wait_all([entry[0] for entry in self.outbox])
        self.outbox.clear()

    def _guarded(self, what: str):
        """The watchdog's context around a blocking wait (none without a guard)."""
        return nullcontext() if self.guard is None else self.guard(what)

    def _next_message(self, status: MPI.Status) -> Optional[np.ndarray]:
        """Wait for the next message, polled with back-off (an idle server does not spin); a
        request's header when it was received already (no forwarding: only requests arrive,
        one receive and no probe)."""
        if self.forwarding.probes:  # forwards and acknowledgements arrive too
            wait_until(lambda: self.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status))
            return None
        header = np.zeros(protocol.HEADER_LEN, dtype=np.int64)
        test = self._listening = self.comm.Irecv(header, MPI.ANY_SOURCE, TAG_REQUEST)
        wait_until(lambda: test.Test(status))
        self._listening = None
        return header

    def slowest(self) -> int:
        """The smallest clock among live (unreleased) workers (the loop keeps it in
        ``_slowest``, recomputed only when a clock moves or a worker releases)."""
        clocks = self.state.clocks.tolist()
        return min((clocks[slot] for slot in self._counted), default=NOBODY_LIVE)

    def _recount(self) -> None:
        self._counted = np.flatnonzero(self.live & ~self.released).tolist()

    def abandon(self) -> None:
        """Complete every request in flight (with errors) after the communicator was revoked."""
        abandon(self.comm, self.pending_requests())

    def pending_requests(self) -> List[MPI.Request]:
        """Every send still in flight (to be abandoned after a failure)."""
        return [entry[0] for entry in self.outbox] + ([self._listening] if self._listening is not None else []) \
            + self.forwarding.pending_requests()

    def _finished(self) -> bool:
        if not (self.released | ~self.live).all():
            return False
        return self.forwarding.wind_down()

    def _make_progress(self, arrived: Optional[Deque[Request]] = None) -> None:
        """Answer the heads of the queue a request just ``arrived`` in (None: of every
        queue); when a clock moves (which may unblock reads anywhere), every queue's heads
        until nothing moves."""
        self.clock_moved = arrived is None
        if arrived:
            self._drain(arrived)
        while self.clock_moved:
            self.clock_moved = False
            for queue in self.queues.values():
                self._drain(queue)

    def _drain(self, queue: Deque[Request]) -> None:
        """Answer the queue's heads while they may be. Behind a fused push-pull whose reply
        waits, take the pushes and clocks that follow it (their replies, refusals included,
        stay in order; under BSP the step cannot complete without them), up to the first
        other request."""
        while queue:
            if self._answer(queue[0]):
                queue.popleft()
                continue
            if queue[0].op in FUSED:
                self._run_ahead(queue)
            return

    def _run_ahead(self, queue: Deque[Request]) -> None:
        index = 1
        while index < len(queue):
            request = queue[index]
            if request.op == Op.CLOCK and request.refusal is None:
                self._answer(request)
                del queue[index]
            elif request.op in PUSHES:
                self._take(request)
                index += 1
            else:
                return

    def _answer(self, request: Request) -> bool:
        """Answer ``request`` if consistency allows it now; False if it must wait."""
        slot, op, clocks = request.slot, request.op, self.state.clocks
        if slot >= 0 and request.clock > clocks[slot]:
            clocks[slot] = request.clock
            self._clock_moved()
        if op in VALUES_BACK and not self.forwarding.admits(request):
            return False
        if request.refusal is not None:
            self._refuse(request)
            if op == Op.PUSH_PULL_END:
                self._end_step(request)
        elif op in PULLS:
            slowest = self._slowest
            if not self.consistency.may_read(request.clock, slowest):
                return False
            self._read(request, slowest)
        elif op in FUSED:
            return self._push_pull(request)
        elif op in PUSHES:
            self._push(request)
        elif op == Op.CLOCK and slot >= 0:
            step = request.clock if request.table else request.clock - 1  # TABLE 1: the share alone
            self.state.record_share(step, slot, request.header[CLOCK_STATS].view(np.float64),
                                    request.fields[CLOCK_STALENESS])
        elif op == Op.RELEASE:
            self.released[slot] = True
            self._recount()
            self._clock_moved()
        return True

    def _clock_moved(self) -> None:
        """The slowest clock may have moved: under BSP, apply the steps it completed right
        away, so that no read is ever answered before its step's update."""
        self.clock_moved = True
        self._slowest = self.slowest()
        if self.consistency.aggregates:
            slowest = self._slowest
            live = self.state.clocks[self.live]
            completed = min(slowest, int(live.max()) if live.size else 0)
            if self.engine.apply_completed(slowest, completed):
                self.forwarding.forward_apply(slowest, completed)

    def _read(self, request: Request, slowest: int, clock: Optional[int] = None,
              status: Status = Status.OK) -> None:
        """Answer a read at ``clock`` (the request's own by default) with the values."""
        clock = request.clock if clock is None else clock
        state = self.state
        if request.op == Op.PULL_ROWS_MANY:
            self._reply(request, status, self._rows_of_tables(request), reads=None)
        else:
            table = state.tables[request.table]
            table.read_version[request.slot] = table.version
            wire = protocol.DTYPES[request.wire]  # the table's, or narrower (float16)
            if table.sparse:
                self._reply(request, status, table.rows(request.ids).astype(wire, copy=False), reads=None)
            elif wire != table.values.dtype:
                self._reply(request, status, table.values.astype(wire), reads=None)
            else:
                self._reply(request, status, table.values, reads=request.table)
        state.read_staleness[max(0, clock - slowest)] += 1

    def _rows_of_tables(self, request: Request) -> np.ndarray:
        """A PULL_ROWS_MANY's reply: each table's rows in its wire dtype, as bytes, in directory order."""
        parts = []
        for one in request.tables:
            table = self.state.tables[one.table]
            table.read_version[request.slot] = table.version
            rows = table.rows(one.ids).astype(protocol.DTYPES[one.wire], copy=False)
            parts.append(rows.reshape(-1).view(np.uint8))
        return np.concatenate(parts) if parts else EMPTY

    def _push(self, request: Request) -> None:
        if request.pushed is None:
            request.pushed = self._take_push(request)
        if request.pushed is None:
            self._refuse(request)
        else:
            self._reply(request, request.pushed, push=True)

    def _push_pull(self, request: Request) -> bool:
        """A fused push-pull: the push is taken first; the reply (the push's status, then the
        values) once a read at the next clock may be answered. False while it waits."""
        self._take(request)
        if request.pushed is None:
            self._refuse(request)
            return True
        slowest = self._slowest
        if not self.consistency.may_read(request.clock + 1, slowest):
            return False
        self._read(request, slowest, request.clock + 1, request.pushed)
        return True

    def _take(self, request: Request) -> None:
        """Take a queued push once (``request.pushed``); a PUSH_PULL_END then ends its
        worker's step here, whether the push was taken or refused."""
        if request.pushed is None and request.refusal is None:
            request.pushed = self._take_push(request)
        if request.op == Op.PUSH_PULL_END:
            self._end_step(request)

    def _end_step(self, request: Request) -> None:
        """The worker's clock here moves past the step of its PUSH_PULL_END (as a CLOCK would)."""
        clocks = self.state.clocks
        if 0 <= request.slot < len(clocks) and request.clock + 1 > clocks[request.slot]:
            clocks[request.slot] = request.clock + 1
            self._clock_moved()

    def _take_push(self, request: Request) -> Optional[Status]:
        """Hand a push to the engine: its status (OK, DUPLICATE), or None when it came too
        late (``request.refusal`` set; the reply is the caller's)."""
        self.forwarding.pin(request)
        if request.op == Op.PUSH_ROWS_MANY:
            status, request.duplicates = self.engine.accept_many(request.slot, request.clock, table_gradients(request))
        else:
            gradient = request.payloads[0] if request.op in DENSE_PUSHES else (request.ids, request.payloads[1])
            status = self.engine.accept(request.slot, request.clock, request.table, gradient)
        if status == Status.LATE:
            self.forwarding.unpin(request)
            request.refusal = (Status.LATE, request.clock)
            return None
        if status == Status.DUPLICATE:
            self._release_buffer(request)
        return status

    def _refuse(self, request: Request) -> None:
        status, detail = request.refusal
        self._release_buffer(request)
        if status != Status.KEYS_UNKNOWN:  # not the worker's fault: it sends the ids again
            if 0 <= request.slot < self.state.slot_count:
                self.state.refused[request.slot] += 1
            self.state.refusals[status.name] += 1
        if request.op in protocol.REPLIED:
            self._reply(request, status, detail=detail)

    def _reply(self, request: Request, status: Status, payload: Optional[np.ndarray] = None, *,
               reads: Optional[int] = None, detail: int = 0, push: bool = False) -> None:
        """Send the reply header (when and how is the forwarding strategy's: an accepted
        ``push`` goes to a backup first) and, for pulls, the payload (empty when refused)."""
        state, op = self.state, request.op
        table = state.tables.get(request.table)
        count = request.duplicates if op == Op.PUSH_ROWS_MANY else 0 if payload is None else payload.size
        header = protocol.reply(request.fields, state.shard, status, table.version if table is not None else 0,
                                count, detail, self._slowest)
        self.forwarding.send_reply(request, header, push)
        sent = 0
        if op in VALUES_BACK:
            body = EMPTY if payload is None else payload
            self._send(body, request.source, reads)
            sent = body.nbytes
        self.traffic.add(sent, request.nbytes)
        self.load.reply(request.clock, sent)
        state.count_traffic(request.clock, sent, request.nbytes)

    def _send(self, buffer: Union[np.ndarray, bytes], dest: int, reads: Optional[int],
              tag: int = TAG_REPLY) -> None:
        self.outbox.append((self.comm.Isend(buffer, dest, tag), buffer, reads))

    def _retire_sends(self) -> None:
        """Drop the replies that went (one ``MPI_Test`` each: ``Testsome``, like ``Waitall``, may
        null a request still in flight after a failure, which ``abandon`` then cannot complete)."""
        if self.outbox:
            self.outbox = [entry for entry in self.outbox if not entry[0].Test()]

    def _wait_reads(self, table_id: int) -> None:
        """Finish the replies still reading ``table_id``'s values before they change."""
        waiting = [entry for entry in self.outbox if entry[2] == table_id]
        if waiting:
            with self._guarded(f"server rank {self.comm.Get_rank()} finishing reads of table {table_id}"):
                wait_all([entry[0] for entry in waiting])
            self.outbox = [entry for entry in self.outbox if entry[2] != table_id]

    def _pinned(self, buffer: np.ndarray) -> bool:
        return self.forwarding.is_pinned(buffer)

    def _release_buffer(self, request: Request) -> None:
        """Return a refused or duplicate push's gradient buffer to the spares."""
        if request.borrowed is not None:
            self.engine.recycle(request.table, request.borrowed)
            request.borrowed = None

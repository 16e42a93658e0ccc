"""Primary-backup replication of a shard: state-machine replication, cheapest on the wire.

Shard keys form a ring; the backup of a shard is the server of the next key. The
primary forwards every push it accepts (the worker's own header and payloads, on
``TAG_FORWARD``/``TAG_FORWARD_PAYLOAD``) and, under BSP, every step it applies
(``APPLY``); the backup runs the same update rule (``engine.ShardEngine``) on its
replica and acknowledges each push (``TAG_FORWARD_ACK``). Only then does the primary
acknowledge the worker, so no acknowledged update lives on one server only. Neither
side ever waits: replies held for an acknowledgement wait in a FIFO, and a worker's
later replies wait behind its held ones (replies to a worker leave in request order).
A gradient buffer being forwarded is *pinned*: not reused or summed into in place
until the backup has it. ``DONE`` tells the backup that nothing more will come, so
both loops end without leaving a message unreceived.

Cost per push: the gradient once more over the wire (primary to backup), 72 B of ack,
and the backup's copy of the update arithmetic; per BSP step one 72 B ``APPLY``.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List

import numpy as np
from mpi4py import MPI

from ..runtime.failures import wait_all
from . import inbox, protocol
from .engine import ShardEngine
from .inbox import Request
from .protocol import (FUSED, HEADER_LEN, TAG_FORWARD, TAG_FORWARD_ACK, TAG_FORWARD_PAYLOAD, TAG_REPLY,
                       Op, Status)
from .shard_state import ShardState


@dataclass
class Held:
    """A reply to a worker that waits: for the backup's acknowledgement (``forwarded``), or
    behind that worker's earlier held replies."""

    request: Request
    header: bytes  # the reply header (protocol.reply)
    forwarded: bool
    acked: bool = False
    sends: List[MPI.Request] = field(default_factory=list)


class NoForwarding:
    """The forwarding strategy of a server without a backup: nothing forwarded, held or
    pinned; only requests arrive (one receive, no probe)."""

    probes = False

    def __init__(self, server) -> None:
        self.server = server

    def admits(self, request: Request) -> bool:
        """Whether a request that gets values back may be answered now (always)."""
        return True

    def send_reply(self, request: Request, header: bytes, push: bool) -> None:
        """Send a reply header to the worker at once."""
        self.server._send(header, request.source, None)

    def pin(self, request: Request) -> None:
        """Nothing to keep: no backup reads the buffer."""

    def unpin(self, request: Request) -> None:
        """Nothing kept."""

    def is_pinned(self, buffer: np.ndarray) -> bool:
        return False

    def forward_apply(self, below: int, completed: int) -> None:
        """No backup to tell."""

    def wind_down(self) -> bool:
        return True

    def handle(self, tag: int, source: int) -> None:
        raise AssertionError(f"a server without a backup received tag {tag} from rank {source}")

    def pending_requests(self) -> List[MPI.Request]:
        return []


class Replication:
    """Both replication roles of one server: primary of its own shard (forwarding to
    ``backup_rank``) and backup of the shard of ``primary_rank`` (``replica``)."""

    probes = True  # forwards and acknowledgements arrive beside the requests

    def __init__(self, server, backup_rank: int, primary_rank: int, replica: ShardState):
        self.server = server
        self.backup_rank, self.primary_rank = backup_rank, primary_rank
        self.replica = ShardEngine(replica, server.engine.optimizers, server.consistency, measured=False)
        self.held: Deque[Held] = deque()
        self.awaiting: Deque[Held] = deque()
        self.holding_count: Counter = Counter()
        self.pinned: Dict[int, np.ndarray] = {}
        self.done_sent = False
        self.primary_done = False

    # -- primary side ----------------------------------------------------------------
    def admits(self, request: Request) -> bool:
        """Whether a request that gets values back may be answered now: not while its worker's
        earlier pushes wait for the backup (replies stay in order); a push-pull is refused."""
        if self.holding(request.slot):
            return False
        if request.op in FUSED and request.refusal is None:
            request.refusal = (Status.UNSUPPORTED, 0)
        return True

    def send_reply(self, request: Request, header: bytes, push: bool) -> None:
        """A push's reply waits for the backup's acknowledgement (the push forwarded first);
        another waits behind its worker's held replies, or goes at once."""
        if push:
            self.forward(request, header)
        elif self.holding(request.slot):
            self.hold(request, header)
        else:
            self.server._send(header, request.source, None)

    def pin(self, request: Request) -> None:
        """Keep ``request``'s dense gradient buffer from reuse until the backup has it."""
        if request.op == Op.PUSH:
            buffer = request.payloads[0]
            self.pinned[id(buffer)] = buffer

    def unpin(self, request: Request) -> None:
        if request.op == Op.PUSH:
            self.pinned.pop(id(request.payloads[0]), None)

    def is_pinned(self, buffer: np.ndarray) -> bool:
        return id(buffer) in self.pinned

    def forward(self, request: Request, reply_header: bytes) -> None:
        """Send an accepted push to the backup; its reply waits for the acknowledgement."""
        entry = Held(request, reply_header, forwarded=True)
        comm = self.server.comm
        entry.sends.append(comm.Isend(request.header, self.backup_rank, TAG_FORWARD))
        for payload in request.payloads:
            entry.sends.append(comm.Isend(payload, self.backup_rank, TAG_FORWARD_PAYLOAD))
        self.server.traffic.add(request.nbytes, 0)
        self._append(entry)
        self.awaiting.append(entry)

    def hold(self, request: Request, reply_header: bytes) -> None:
        """A reply (no forward) behind this worker's held ones."""
        self._append(Held(request, reply_header, forwarded=False))

    def holding(self, slot: int) -> bool:
        """Whether worker ``slot`` has replies waiting."""
        return self.holding_count[slot] > 0

    def forward_apply(self, below: int, completed: int) -> None:
        """BSP: the primary applied the buffered steps below ``below``; ``completed`` steps done."""
        header = protocol.request(Op.APPLY, 0, 0, min(below, np.iinfo(np.int64).max), completed)
        self.server._send(header, self.backup_rank, None, TAG_FORWARD)

    def wind_down(self) -> bool:
        """Once every reply is out, tell the backup nothing more comes; True when the
        primary of the replica has said the same."""
        if not self.held and not self.done_sent:
            self.server._send(protocol.request(Op.DONE, 0, 0, 0), self.backup_rank, None, TAG_FORWARD)
            self.done_sent = True
        return self.done_sent and self.primary_done

    def handle(self, tag: int, source: int) -> None:
        """A message on a replication tag (the loop probed it)."""
        if tag == TAG_FORWARD_ACK:
            self._acknowledged(source)
        elif tag == TAG_FORWARD:
            self._apply_forward(source)
        else:  # a stray payload: drain it
            status = MPI.Status()
            self.server.comm.Probe(source, tag, status)
            self.server.comm.Recv(np.empty(status.Get_count(MPI.BYTE), np.uint8), source, tag)

    def pending_requests(self) -> List[MPI.Request]:
        return [request for entry in self.awaiting for request in entry.sends]

    def _append(self, entry: Held) -> None:
        self.held.append(entry)
        self.holding_count[entry.request.slot] += 1

    def _acknowledged(self, source: int) -> None:
        ack = np.empty(HEADER_LEN, dtype=np.int64)
        self.server.comm.Recv(ack, source, TAG_FORWARD_ACK)
        entry = self.awaiting.popleft()
        wait_all(entry.sends)  # the backup has the data: these are complete
        entry.acked = True
        self.unpin(entry.request)
        self.server.engine.recycle_unpinned()
        self._flush()
        self.server._make_progress()

    def _flush(self) -> None:
        """Send every held reply whose turn has come (per worker, in order)."""
        blocked, waiting = set(), deque()
        for entry in self.held:
            slot = entry.request.slot
            if slot not in blocked and (entry.acked or not entry.forwarded):
                self.server._send(entry.header, entry.request.source, None, TAG_REPLY)
                self.holding_count[slot] -= 1
            else:
                blocked.add(slot)
                waiting.append(entry)
        self.held = waiting

    # -- backup side -----------------------------------------------------------------
    def _apply_forward(self, source: int) -> None:
        server, replica = self.server, self.replica
        request = inbox.receive(server.comm, source, server.layout, replica.state, replica.take_buffer,
                                forwarded=True)
        if request.op == Op.APPLY:
            replica.apply_completed(request.clock, request.count)
            return
        if request.op == Op.DONE:
            self.primary_done = True
            return
        if request.refusal is not None:  # the primary checked it already: a bug if it happens
            raise RuntimeError(f"server rank {server.comm.Get_rank()}: forwarded push from rank "
                               f"{source} refused: {protocol.refusal(*request.refusal)}")
        if request.op == Op.PUSH_ROWS_MANY:
            status, _ = replica.accept_many(request.slot, request.clock, inbox.table_gradients(request))
        else:
            gradient = request.payloads[0] if request.op == Op.PUSH else (request.ids, request.payloads[1])
            status = replica.accept(request.slot, request.clock, request.table, gradient)
        if status != Status.OK:
            replica.recycle(request.table, request.borrowed)
        ack = protocol.reply(request.fields, replica.state.shard, status)
        server.traffic.add(0, request.nbytes)
        server._send(ack, source, None, TAG_FORWARD_ACK)

"""A Sandblaster worker: asks the coordinator for units, computes them, pushes gradient sums.

On a unit of a new pass it first fetches the pass's point from every server (into one
preallocated flat buffer). Each unit's gradient goes to a scratch buffer; the reply to its
report says whether it is kept, and a kept one is added to the accumulator. Every
``push_units`` kept units, when told to flush, or when told to push before a long unit, the
accumulator goes to the servers (each its slice, with the unit ids) and, once all have
acknowledged, the next report tells the coordinator the units are pushed.
Cost: per pass 8 bytes an element fetched; per push 8 bytes an element plus 8 a unit id.
"""
from __future__ import annotations

from typing import Callable, List, Protocol, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ..runtime.context import Traffic
from ..runtime.idle import receive, wait_each
from .protocol import (ANSWER_LEN, ASK, DONE, TAG_ANSWER, TAG_PAYLOAD, TAG_REPLY, TAG_REQUEST, TAG_WORK,
                       WORK_LEN, Action, Kind, Work, header)


class Compute(Protocol):
    """What a worker computes: ``load(x)`` at each new pass's flat point, then ``unit(u, out)``
    adds unit u's summed gradient into ``out`` (zeroed) and returns (loss_sum, correct, count)."""

    def load(self, x: np.ndarray) -> None: ...

    def unit(self, unit: int, out: np.ndarray) -> Tuple[float, float, float]: ...


class Worker:
    """One worker of a Sandblaster job on ``comm``; ``on_unit(iteration)`` before each unit's compute."""

    def __init__(self, comm: MPI.Intracomm, coordinator: int, slices: Sequence[Tuple[int, int, int, int]],
                 length: int, compute: Compute, push_units: int, traffic: Traffic,
                 on_unit: Callable[[int], None] = lambda iteration: None):
        self.comm, self.coordinator, self.slices = comm, coordinator, list(slices)  # (rank, lo, hi, slice)
        self.on_unit = on_unit
        self.pending: List[MPI.Request] = []
        self.traffic = traffic
        self.compute, self.push_units = compute, push_units
        self.x, self.acc, self.scratch = np.zeros(length), np.zeros(length), np.zeros(length)
        self.held: list = []
        self.pass_id = -1

    def run(self) -> None:
        """Work until the coordinator says STOP."""
        message, reply = np.zeros(WORK_LEN), np.zeros(ANSWER_LEN, np.int64)
        message[Work.KIND], message[Work.PASS], reported = ASK, -1, -1
        while True:
            self.comm.Send(message, dest=self.coordinator, tag=TAG_WORK)
            receive(self.comm, reply, self.coordinator, TAG_ANSWER)
            keep, action, pass_id, unit, push_first, iteration = (int(value) for value in reply)
            if keep:
                self.acc += self.scratch
                self.held.append(reported)
            pushed = bool(self.held) and (len(self.held) >= self.push_units or action != Action.UNIT
                                          or bool(push_first))
            if pushed:
                self._push()
            if action == Action.STOP:
                return
            message[:] = 0
            message[Work.PUSHED], message[Work.PASS], reported = pushed, self.pass_id, -1
            if action == Action.FLUSH:
                message[Work.KIND] = ASK
                continue
            self.on_unit(iteration)
            if pass_id != self.pass_id:
                self._fetch(pass_id)
            self.scratch[:] = 0.0
            stats = self.compute.unit(unit, self.scratch)
            message[Work.KIND], message[Work.PASS], message[Work.UNIT], reported = DONE, pass_id, unit, unit
            message[Work.LOSS:Work.COUNT + 1] = stats

    def _fetch(self, pass_id: int) -> None:
        """Every server's slice of the pass's point into ``x``."""
        for rank, lo, hi, s in self.slices:
            self.comm.Send(header(Kind.FETCH, pass_id, 0, s), dest=rank, tag=TAG_REQUEST)
            self.pending.append(self.comm.Irecv(self.x[lo:hi], source=rank, tag=TAG_REPLY))
        self._wait()
        self.traffic.add(0, self.x.nbytes)
        self.pass_id = pass_id
        self.compute.load(self.x)

    def _push(self) -> None:
        """The accumulator's slices to their servers, with the unit ids; wait for every ack."""
        units = np.asarray(self.held, np.int64)
        acks = np.zeros((len(self.slices), 4), np.int64)
        for index, (rank, lo, hi, s) in enumerate(self.slices):
            self.comm.Send(header(Kind.PUSH, self.pass_id, len(units), s), dest=rank, tag=TAG_REQUEST)
            self.comm.Send(units, dest=rank, tag=TAG_PAYLOAD)
            self.pending.append(self.comm.Isend(self.acc[lo:hi], dest=rank, tag=TAG_PAYLOAD))
            self.pending.append(self.comm.Irecv(acks[index], source=rank, tag=TAG_REPLY))
        self._wait()
        self.traffic.add(self.acc.nbytes + units.nbytes * len(self.slices), 0)
        self.acc[:] = 0.0
        self.held = []

    def _wait(self) -> None:
        """Complete the requests in flight (``pending`` keeps them for ``failures.abandon`` after a failure)."""
        wait_each(self.pending)
        self.pending = []

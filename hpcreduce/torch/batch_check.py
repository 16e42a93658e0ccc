"""The trainers' verdict on a batch, agreed without blocking the step: ``BatchCheck.start`` sends
this trainer's verdict (its problem, if any, and the tables' signature) as a nonblocking
``MPI_Iallreduce(MAX)`` over ``[v, -v, ended]`` on the collection's own duplicate of the trainers'
communicator; ``Verdict.wait`` (just before the batch's pull is sent, under the deadline
watchdog) finishes it. ``ended``: this trainer's data ended (no batch: uneven shards at the end
of an epoch); if any trainer's did, ``wait`` says so on every trainer, which all stop there.
With no problem anywhere and the same tables everywhere, what comes back is known in advance (one bytes
comparison); otherwise every trainer runs the blocking ``agree`` on the trainers' context, which
raises the same error naming each trainer's problem everywhere, before any of the batch's rows move.
Every trainer plans the same sequence of batches, so the checks meet in the same order.
Fault-tolerant contexts keep the blocking ``agree`` (a failure inside a duplicate it does not watch
would hang).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from mpi4py import MPI

from ..collectives.validate import InputProblem, ProblemKind, agree, check_vector, field_values, stable_hash
from ..errors import PSInputError
from ..runtime.context import Context
from ..runtime.watchdog import watchdog

WHAT = "EmbeddingBagCollection batch"


class Verdict:
    """A started check of one batch (``ended``: this trainer has none); ``wait()`` raises on
    every trainer if any trainer's batch is bad, and returns whether any trainer's data ended."""

    __slots__ = ("check", "why", "ended", "request", "received")

    def __init__(self, check: "BatchCheck", why: Optional[str], ended: bool, request: Optional[MPI.Request],
                 received: Optional[np.ndarray]):
        self.check, self.why, self.ended, self.request, self.received = check, why, ended, request, received

    def wait(self) -> bool:
        if self.request is None:
            return self.check.blocking(self.why, self.ended)
        with watchdog.guard(f"the trainers' check of the next {WHAT}"):
            self.request.Wait()
        self.request = None
        if self.received[-1] > 0:
            return True  # some trainer's data ended: every trainer stops (the same bytes everywhere)
        if self.received[:-1].tobytes() != self.check.expected:
            self.check.blocking(self.why, False)  # raises on every trainer
            raise PSInputError(f"{WHAT}: the trainers' verdicts differ")
        return False


class BatchCheck:
    """The batch checks of one collection over ``context`` (the trainers'; None: one process,
    a bad batch raises locally)."""

    def __init__(self, context: Optional[Context], keys: list):
        self.context = context
        self.fields = [("tables", stable_hash(keys), keys)]
        self.vector = check_vector(field_values(self.fields))
        self.expected = self.vector.tobytes()
        self.comm = context.comm.Dup() if context is not None and not context.ft and context.size > 1 else None

    def start(self, why: Optional[str], ended: bool = False) -> Verdict:
        """Send this trainer's verdict (``why``: its batch's problem, None when good; ``ended``:
        it has no batch, its data ended)."""
        if self.comm is None:
            return Verdict(self, why, ended, None, None)
        key = ProblemKind.UNUSABLE_ARRAY.code * self.comm.Get_size() + self.comm.Get_rank() + 1
        vector = np.append(self.vector if why is None else check_vector(field_values(self.fields, key)),
                           np.int64(ended))
        received = np.empty_like(vector)
        request = self.comm.Iallreduce([vector, MPI.INT64_T], [received, MPI.INT64_T], MPI.MAX)
        return Verdict(self, why, ended, request, received)

    def blocking(self, why: Optional[str], ended: bool) -> bool:
        """The blocking check: whether any trainer's data ended; else it raises on every trainer
        when any batch is bad."""
        if self.context is None:
            if why and not ended:
                raise PSInputError(f"EmbeddingBagCollection: {why}")
            return ended
        if self.context.comm.allreduce(int(ended), op=MPI.MAX):
            return True
        agree(self.context, WHAT, self.fields, InputProblem(ProblemKind.UNUSABLE_ARRAY, why) if why else None)
        return False

    def free(self) -> None:
        if self.comm is not None:
            self.comm.Free()
            self.comm = None

"""The trainers' verdict on a batch, agreed without blocking the step: ``BatchCheck.start`` sends
this trainer's verdict (its problem, if any, and the tables' signature) as a nonblocking
``MPI_Iallreduce(MAX)`` over ``[v, -v]`` on the collection's own duplicate of the trainers'
communicator; ``Verdict.wait`` (just before the batch's pull is sent) finishes it. With no problem
anywhere and the same tables everywhere, what comes back is known in advance (one bytes
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

WHAT = "EmbeddingBagCollection batch"


class Verdict:
    """A started check of one batch; ``wait()`` raises on every trainer if any trainer's batch is bad."""

    __slots__ = ("check", "why", "request", "received")

    def __init__(self, check: "BatchCheck", why: Optional[str], request: Optional[MPI.Request],
                 received: Optional[np.ndarray]):
        self.check, self.why, self.request, self.received = check, why, request, received

    def wait(self) -> None:
        if self.request is None:
            self.check.blocking(self.why)
            return
        self.request.Wait()
        self.request = None
        if self.received.tobytes() != self.check.expected:
            self.check.blocking(self.why)  # raises on every trainer
            raise PSInputError(f"{WHAT}: the trainers' verdicts differ")


class BatchCheck:
    """The batch checks of one collection over ``context`` (the trainers'; None: one process,
    a bad batch raises locally)."""

    def __init__(self, context: Optional[Context], keys: list):
        self.context = context
        self.fields = [("tables", stable_hash(keys), keys)]
        self.vector = check_vector(field_values(self.fields))
        self.expected = self.vector.tobytes()
        self.comm = context.comm.Dup() if context is not None and not context.ft and context.size > 1 else None

    def start(self, why: Optional[str]) -> Verdict:
        """Send this trainer's verdict (``why``: its batch's problem, None when good)."""
        if self.comm is None:
            return Verdict(self, why, None, None)
        vector = self.vector if why is None else check_vector(
            field_values(self.fields, ProblemKind.UNUSABLE_ARRAY.code * self.comm.Get_size() + self.comm.Get_rank() + 1))
        received = np.empty_like(vector)
        return Verdict(self, why, self.comm.Iallreduce([vector, MPI.INT64_T], [received, MPI.INT64_T], MPI.MAX),
                       received)

    def blocking(self, why: Optional[str]) -> None:
        """The blocking check (it raises on every trainer when any batch is bad)."""
        if self.context is None:
            if why:
                raise PSInputError(f"EmbeddingBagCollection: {why}")
            return
        agree(self.context, WHAT, self.fields, InputProblem(ProblemKind.UNUSABLE_ARRAY, why) if why else None)

    def free(self) -> None:
        if self.comm is not None:
            self.comm.Free()
            self.comm = None

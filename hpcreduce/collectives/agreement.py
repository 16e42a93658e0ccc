"""``agree``: every rank's local verdict on a call, agreed before any data moves.

Each rank passes its own problem text (None when its input is fine). One ``MPI_Allreduce(MAX)`` of a
single int64 tells every rank whether any rank has one; only then (the error path) do the ranks
gather the texts, so every rank raises the same error naming each failing rank. Under ULFM a dead
peer makes the allreduce raise MPI's process-failure error (``runtime.failures.is_process_failure``);
a rank that never comes is the watchdog's (``HPCREDUCE_DEADLINE``), as for every other blocking wait.
"""
from __future__ import annotations

from typing import Optional, Sequence, Type

import numpy as np
from mpi4py import MPI

from ..errors import InputMismatchError
from ..runtime.context import Comm, Context, resolve
from ..runtime.watchdog import watchdog


def agree(problem: Optional[str], *, comm: Comm = None, what: str = "",
          error: Type[Exception] = InputMismatchError) -> None:
    """Raise ``error`` on every rank if any rank passed a ``problem``, naming each such rank's
    (``"what: rank 2: ...; rank 3: ..."``); else return. Collective over ``comm``."""
    context = comm if type(comm) is Context else resolve(comm)
    flag = np.array([0 if problem is None else 1], dtype=np.int64)
    # a rank that skipped the call would leave the others here: the watchdog's deadline ends that
    with watchdog.guard(f"the ranks' agreement on {what or 'a call'}"):
        context.comm.Allreduce(MPI.IN_PLACE, [flag, MPI.INT64_T], op=MPI.MAX)
        if flag[0]:
            raise_gathered(context.comm, problem, what, error)


def raise_gathered(comm: MPI.Intracomm, problem: Optional[str], what: str, error: Type[Exception]) -> None:
    """The error path, every rank in it: gather each rank's ``problem`` and raise them as one."""
    raise error(worded_problems(what, comm.allgather(problem)))


def worded_problems(what: str, problems: Sequence[Optional[str]]) -> str:
    """``"what: rank 1: ...; rank 3: ..."`` from every rank's problem (None: fine)."""
    listed = "; ".join(f"rank {rank}: {text}" for rank, text in enumerate(problems) if text is not None)
    return f"{what}: {listed}" if what else listed

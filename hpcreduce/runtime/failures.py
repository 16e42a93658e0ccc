"""Recognising ULFM's reports of dead peers, and leaving no request behind after one."""
from __future__ import annotations

from typing import Iterable

from mpi4py import MPI

FAILURE_CLASSES = frozenset({MPI.ERR_PROC_FAILED, MPI.ERR_REVOKED,
                             getattr(MPI, "ERR_PROC_FAILED_PENDING", MPI.ERR_PROC_FAILED)})


def is_process_failure(error: BaseException) -> bool:
    """Whether ``error`` is ULFM's report of a dead peer or a revoked communicator."""
    return isinstance(error, MPI.Exception) and error.Get_error_class() in FAILURE_CLASSES


def abandon(comm: MPI.Comm, requests: Iterable[MPI.Request]) -> None:
    """After a process failure: revoke ``comm`` so every pending request completes (with an
    error), then complete them, so no receive can later write into a reused buffer."""
    try:
        comm.Revoke()
    except MPI.Exception:
        pass
    for request in requests:
        try:
            request.Wait()
        except MPI.Exception:
            pass

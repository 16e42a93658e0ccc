"""The shrink-and-rebuild routine shared by both topologies.

On ``ERR_PROC_FAILED`` or ``ERR_REVOKED`` every survivor calls ``shrink_and_rebuild``:
revoke the communicator (so every rank still blocked in it returns), shrink it to the
survivors, and ``Agree`` on the result; a failure during any of this (a rank dying in
the middle of recovery) starts the round again on what is left. Survivors keep their
old relative order, so in PS mode servers stay first. No ``Dup`` is taken here: a
failure while a communicator is being duplicated has crashed Open MPI 5.0.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from mpi4py import MPI

from ..runtime.failures import is_process_failure


@dataclass
class Shrunk:
    """The survivors' communicator and who was lost, in ranks of the communicator given."""

    comm: MPI.Intracomm
    lost: List[int]
    new_rank: List[Optional[int]]
    rounds: int
    seconds: float = field(default=0.0)


def shrink_and_rebuild(comm: MPI.Intracomm, *, before_shrink: Callable[[], None] = lambda: None) -> Shrunk:
    """Revoke ``comm``, shrink it to the survivors and agree; repeat while ranks keep failing.

    ``before_shrink`` runs after the revoke (fault injection uses it to kill a rank in
    the middle of a recovery). Returns the new communicator (errors returned, not fatal).
    """
    started = time.perf_counter()
    original, current, rounds = comm, comm, 0
    while True:
        rounds += 1
        try:
            current.Revoke()
        except MPI.Exception:
            pass  # already revoked by a peer
        before_shrink()
        try:
            survivors = current.Shrink()
        except MPI.Exception as error:
            if not is_process_failure(error):
                raise
            continue
        survivors.Set_errhandler(MPI.ERRORS_RETURN)
        if current is not original:
            _free(current)
        current = survivors
        try:
            current.Agree(1)
        except MPI.Exception as error:
            if not is_process_failure(error):
                raise
            continue
        break
    old_group, new_group = original.Get_group(), current.Get_group()
    new_rank = MPI.Group.Translate_ranks(old_group, list(range(old_group.Get_size())), new_group)
    old_group.Free()
    new_group.Free()
    mapped = [None if r == MPI.UNDEFINED else r for r in new_rank]
    lost = [old for old, r in enumerate(mapped) if r is None]
    return Shrunk(current, lost, mapped, rounds, time.perf_counter() - started)


def agree_all(comm: MPI.Intracomm, ok: bool) -> bool:
    """True only if every rank says ``ok`` and no rank has failed; the same on every survivor.

    This is the commit point of a step: nobody applies a step's result before it.
    """
    try:
        return bool(comm.Agree(int(ok)))
    except MPI.Exception as error:
        if not is_process_failure(error):
            raise
        return False


def _free(comm: MPI.Intracomm) -> None:
    try:
        comm.Free()
    except MPI.Exception:
        pass

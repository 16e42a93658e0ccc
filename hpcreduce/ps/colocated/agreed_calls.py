"""What both colocated stores (``ColocatedTables``, ``TableWiseTables``) do around their calls
under fault tolerance: a process failure inside a call joins the step's one agreement before
it is raised, and a push is applied only after every rank agreed it arrived everywhere. A store
gives ``comm``, ``ft`` and ``_abandon()`` (revoke, complete its requests in flight)."""
from __future__ import annotations

from typing import Callable, TypeVar

from mpi4py import MPI

from ...runtime.failures import agree_all, is_process_failure

T = TypeVar("T")


class AgreedCalls:
    """``_collective`` and ``_commit`` of a colocated store."""

    comm: MPI.Intracomm
    ft: bool

    def _abandon(self) -> None:
        raise NotImplementedError

    def _collective(self, work: Callable[[], T]) -> T:
        """``work()``; under fault tolerance a process failure in it revokes the communicator,
        completes every request in flight and joins the step's one agreement (where the ranks
        that saw no failure commit their push) before it is raised: every survivor then
        calls ``recover``."""
        try:
            return work()
        except MPI.Exception as error:
            if self.ft and is_process_failure(error, self.comm):
                self._abandon()
                agree_all(self.comm, False)
            raise

    def _commit(self) -> None:
        """Under fault tolerance, agree that every rank received the step (and the replicas
        theirs) before anyone applies it; a process failure (here or anywhere) raises
        ``ERR_PROC_FAILED``, nothing applied."""
        if self.ft and not agree_all(self.comm, True):
            self._abandon()
            raise MPI.Exception(MPI.ERR_PROC_FAILED)

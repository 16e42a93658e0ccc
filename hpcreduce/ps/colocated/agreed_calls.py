"""What both colocated stores (``ColocatedTables``, ``TableWiseTables``) do around their calls
under fault tolerance: a process failure inside a call joins the step's one agreement before
it is raised, and a push is applied only after every rank agreed it arrived everywhere. A store
gives ``comm``, ``ft``, ``key``, ``recover()``, ``_abandon()`` (revoke, complete its requests in flight),
``_settle()``, and for a leave (``hand_over``) ``_replica_holder`` and ``_restored_on``.

A rank joins at most one failure agreement between two recoveries (``failure_agreed``: a push
whose commit agreement failed does not join a second one). Under ``hpcreduce.elastic``
(``torch.hybrid_elastic``) the loop's end, on every rank, ends the store's agreements too
(``end_attempt``), and a recovery the job asks for runs at the store's next call
(``recover_before_next``) or at that end, whichever comes first: every rank makes the same
agreements on the store's communicator, whichever communicator it saw the failure on.
"""
from __future__ import annotations

from typing import Callable, List, Optional, TypeVar

from mpi4py import MPI

from ...errors import UnsupportedInputError
from ...runtime.failures import agree_all, is_process_failure, release

T = TypeVar("T")


class AgreedCalls:
    """``_collective`` and ``_commit`` of a colocated store."""

    comm: MPI.Intracomm
    ft: bool
    key: int
    released: bool
    failure_agreed = False
    on_failure: Optional[Callable[[], None]] = None
    """Called on a failure before the store's failure agreement: revokes the other communicators
    its ranks may be waiting on (a ``start_hybrid`` job's context and DDP wrapper), so that a
    peer blocked there for this rank leaves and joins the agreement too."""
    _before_next: Optional[Callable[[], None]] = None

    def recover(self) -> List[int]:
        raise NotImplementedError

    def hand_over(self, going: bool) -> List[int]:
        """Ranks leaving the job (``hpcreduce.elastic``'s leave), collective over every rank, the
        leaving ones (``going``) included, between steps: the pushes in flight finish, the staying
        ranks split off and take the leaving keys' shards from their replicas as after a failure
        (a replica holds every push its owner applied: both apply it after one agreement), and a
        leaving rank's part ends. Refused on every rank before anything moves when a leaving
        key's replica leaves too, or there are no replicas. The leaving keys."""
        self._settle()
        leaving = [key for key, goes in self.comm.allgather((self.key, bool(going))) if goes]
        orphans = [key for key in leaving if self._replica_holder(key) in leaving + [None]]
        if orphans:
            raise UnsupportedInputError(f"shard keys {orphans} cannot leave: each shard's replica lives on its "
                                        "ring successor, which leaves too (or replicas are off); leave in turns")
        staying = self.comm.Split(MPI.UNDEFINED if going else 0, self.comm.Get_rank())
        if going:
            self.released = True
            release(self.comm)
        else:
            self._restored_on(staying)
        return leaving

    def _replica_holder(self, key: int) -> Optional[int]:
        """The key holding ``key``'s replica (None: no replicas)."""
        raise NotImplementedError

    def _restored_on(self, staying: MPI.Intracomm) -> List[int]:
        """The leaving keys' shards restored on ``staying`` (the ranks that stay), installed; the keys."""
        raise NotImplementedError

    def _abandon(self) -> None:
        raise NotImplementedError

    def recover_before_next(self, prepare: Callable[[], None], then: Callable[[List[int]], None]) -> None:
        """Run ``prepare()``, ``recover()`` and ``then(lost keys)`` before the next call (or at
        ``end_attempt``): collective on the survivors, all at the same point of their calls."""
        def run() -> None:
            prepare()
            then(self.recover())
        self._before_next = run

    @property
    def recovery_pending(self) -> bool:
        """Whether a recovery asked for (``recover_before_next``) has not run yet."""
        return self._before_next is not None

    def recover_now(self) -> None:
        """Run the recovery asked for (``recover_before_next``) now rather than at the next call
        (collective on the survivors): before a replacement joins, the tables are whole again
        over the ranks of before."""
        self._run_before_next()

    def end_attempt(self, failed: bool) -> None:
        """The end of a loop's attempt (``elastic.run``), on every rank: a recovery asked for
        and not yet run is run, then a rank that left by a failure joins the failure agreement
        unless it already did, and one that finished joins a closing one (a peer that failed
        after the last push may be waiting in it)."""
        self._run_before_next()
        if self.failure_agreed or not self.ft or self.released:
            return
        if failed:
            self._abandon()
            self._revoke_others()
            self.failure_agreed = True
        agree_all(self.comm, not failed)

    def _revoke_others(self) -> None:
        if self.on_failure is not None:
            self.on_failure()

    def _run_before_next(self) -> None:
        if self._before_next is not None:
            run, self._before_next = self._before_next, None
            run()

    def _collective(self, work: Callable[[], T]) -> T:
        """``work()``; under fault tolerance a process failure in it revokes the communicator,
        completes every request in flight and joins the step's one agreement (where the ranks
        that saw no failure commit their push) before it is raised: every survivor then
        calls ``recover``."""
        self._run_before_next()
        try:
            return work()
        except MPI.Exception as error:
            if self.ft and is_process_failure(error, self.comm):
                self._abandon()
                self._revoke_others()
                if not self.failure_agreed:
                    self.failure_agreed = True
                    agree_all(self.comm, False)
            raise

    def _commit(self) -> None:
        """Under fault tolerance, agree that every rank received the step (and the replicas
        theirs) before anyone applies it; a process failure (here or anywhere) raises
        ``ERR_PROC_FAILED``, nothing applied."""
        if self.ft and not agree_all(self.comm, True):
            self.failure_agreed = True
            self._abandon()
            raise MPI.Exception(MPI.ERR_PROC_FAILED)

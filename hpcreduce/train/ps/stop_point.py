"""A stop signal in ``--mode ps`` and ``hybrid`` (with ``--ft`` or not): every worker stops after the
same step, the servers checkpoint it (hybrid: the first worker its dense replica too), every
rank exits resumable.

Under BSP a worker's read of step t returns only once every worker has finished step t - 1.
A rank that sees a stop signal tells the first worker (one small message; a server from its
progress callback). The first worker looks, after its read of step d, whether a stop is wanted
(its own signal or such a message): it then names S = d + 1 to the other workers. No worker can
have finished step d + 1 yet (that needs the first worker's clock), and a worker reads step S
only after the first worker finished step d, after it named S: each worker looks for S after
every read and stops, before computing, at the first step >= S. Every worker thus ends with
S steps done. Under ASP/SSP a worker that learns of S after passing it stops where it is; the
servers' checkpoint is then of the slowest worker's step (resumed as ``resume_point`` says).
Cost with no signal: one ``Iprobe`` per step per worker, no collective. At the end, one
exchange says whether and where the run stopped (``agreed``), the servers write their shard
(``save_stop``: the same files as ``--checkpoint-every``) and every rank raises ``StoppedEarly``.
With ``--ft`` each membership epoch has its own ``StopPoint`` (``ps_driver``): the ranks that saw
the signal tell the first worker of the epoch again after a recovery.
"""
from __future__ import annotations

from typing import List, Mapping, Optional, Sequence

import numpy as np
from mpi4py import MPI

from ...errors import OutputFileError
from ...ps.server import Server
from ...runtime.failures import wait_all
from ...runtime.stop import requests, stopped_after
from ..config import TrainConfig
from .dense_checkpoints import save_dense
from .dense_replica import DenseReplica
from .shard_checkpoints import save_shard

TAG_WANTED = 7321  # any rank -> the first worker: a stop signal came here
TAG_AT = 7322      # the first worker -> the others: stop before step S (int64)
NOT_STOPPED = np.iinfo(np.int64).max


class StopPoint:
    """One rank's view of a stop: ``at`` (the step every worker stops before, None until known)."""

    def __init__(self, comm: MPI.Comm, workers: Sequence[int]):
        self.comm, self.first = comm, workers[0]
        self.others = [rank for rank in workers if rank != self.first]
        self.at: Optional[int] = None
        self.stopped = False
        self._sends: List[MPI.Request] = []
        self._told = False

    def after_read(self, step: int) -> bool:
        """A worker read step ``step`` (from 0): whether it stops now, before computing it."""
        if self.at is None:
            self._look(step)
        self.stopped = self.at is not None and step >= self.at
        return self.stopped

    def tell(self) -> None:
        """A rank that is no worker (a server's progress): pass on a stop signal it received."""
        if requests.seen is not None and not self._told:
            self._told = True
            self._sends.append(self.comm.Isend(np.ones(1, np.int64), self.first, TAG_WANTED))

    def _look(self, step: int) -> None:
        comm = self.comm
        if comm.Get_rank() != self.first:
            self.tell()
            if comm.Iprobe(self.first, TAG_AT):
                at = np.zeros(1, np.int64)
                comm.Recv(at, self.first, TAG_AT)
                self.at = int(at[0])
            return
        wanted = requests.seen is not None
        while comm.Iprobe(MPI.ANY_SOURCE, TAG_WANTED):
            comm.Recv(np.zeros(1, np.int64), MPI.ANY_SOURCE, TAG_WANTED)
            wanted = True
        if wanted:
            self.at = step + 1
            at = np.array([self.at], np.int64)
            self._sends += [comm.Isend(at, rank, TAG_AT) for rank in self.others]

    def vote(self, done: Optional[int], failed: bool = False) -> int:
        """This rank's part of the end's agreement (``agreed``; its stop messages delivered first): ``done`` (this
        worker's steps, None on a server) when it stopped, -1 when it ``failed``, else none."""
        wait_all(self._sends)
        return -1 if failed else done if self.stopped and done is not None else NOT_STOPPED


def agreed(votes: Sequence[int]) -> Optional[int]:
    """The step the servers checkpoint (the fewest steps a stopped worker did), or None when no
    worker stopped or some worker failed (the failure is reported, not a stop)."""
    step = min(votes)
    return None if step in (NOT_STOPPED, -1) else step


def save_stop(comm: MPI.Comm, config: TrainConfig, server: Optional[Server], step: int,
              identity: Mapping[str, object], bsp: bool, replica: Optional[DenseReplica] = None) -> None:
    """Every rank (collective): the servers write their shard as checkpoint ``step`` (``replica``:
    the dense replica, given on hybrid's first worker), then
    ``StoppedEarly`` (resumable; not resumable without a checkpoint folder); a shard that could
    not be written is an ``OutputFileError`` on every rank, saying the run cannot resume."""
    fault = config.fault
    problem = None
    if server is not None and fault.checkpoint_dir:
        try:
            save_shard(fault.checkpoint_dir, step, server.state, sorted(server.layout.shard_ranks), bsp,
                       identity=identity, keep=fault.checkpoint_keep)
        except OutputFileError as err:
            problem = str(err)
    if replica is not None and fault.checkpoint_dir:  # hybrid: the first worker's dense replica
        try:
            save_dense(fault.checkpoint_dir, step, replica, identity, fault.checkpoint_keep)
        except OutputFileError as err:
            problem = str(err)
    stopped_after(comm, problem, step, fault.checkpoint_dir)

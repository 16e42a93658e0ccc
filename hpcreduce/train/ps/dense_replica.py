"""The workers' dense parameters in ``--mode hybrid`` (PERSIA's hybrid training).

The servers hold only the model's sparse tables; every worker keeps a whole replica of the
dense parameters and its optimizer state. Each step every live worker adds its share's dense
gradients (already scaled by 1/global batch) into one allreduce over the *workers'*
communicator, so each gets the global batch's mean gradient and applies the same optimizer
step: the replicas stay bitwise identical. The same buffer carries a failed-worker count: a
worker whose model or pushes fail still takes part once, with zeros and a 1 (``bail_out``),
so every worker stops at that step, none waits for it; and the step's [loss sum, correct,
count], so every worker records the global batch's (``totals``, kept by step: a step redone
after a BSP restart keeps what the whole batch gave, the lost workers' share included).

Fault tolerance without an agreement per step: ``applied`` counts the steps whose update is
in. An allreduce that completed on some ranks but failed on others (a peer died) leaves the
survivors at most one step apart, so after every change of ranks (a new layout: recovery,
growth, replacement) the workers make a new communicator (``join``: ``Create_group`` of the
job's communicator over the layout's worker ranks, the servers take no part) and the replica
with the most steps applied is broadcast to all of them: a newcomer gets the dense model, a
survivor whose last allreduce failed gets the update the others applied. A step at or past
``applied`` is reduced; one below it (a BSP restart, a newcomer catching up) is not reduced
again, its dense gradients dropped. A checkpoint restore of the servers (``rollback``) does
not roll the dense replica back.
Cost per step: one allreduce of the dense parameters plus 32 bytes among the W workers
(2(W-1)/W x dense bytes per worker with the ring); per change of ranks: one ``Create_group``
and one broadcast of the dense parameters and their optimizer state.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ...collectives.bucket_sum import BucketSum
from ...errors import PSTrainingError
from ...arrays.finite import all_finite
from ...ps.layout import Layout
from ...ps.optimizers import make_optimizer
from ...ps.tables import numel
from ...ps.worker import Worker
from ...runtime.context import Context
from ...runtime.failures import release, revoke
from ..config import TrainConfig
from ..model import Model
from ..params import part_init
from ..results import checksum


class DenseReplica:
    """One worker's copy of the dense parameters (``params``, by name) and what keeps it in step
    (the dense-sync strategy of ``--mode hybrid``: ``dense_sync``)."""

    pulled = False  # never pulled nor pushed: the servers hold only the sparse tables
    reduces = True  # reduced among the workers after the push

    def __init__(self, ctx: Context, config: TrainConfig, model: Model):
        self.ctx = ctx
        self.specs = [spec for spec in model.param_specs() if not spec.sparse]
        init = part_init(model, config.seed, self.specs)
        self.params: Dict[str, np.ndarray] = {
            spec.name: np.ascontiguousarray(init.dense(t, 0, numel(spec)).reshape(spec.shape), spec.dtype)
            for t, spec in enumerate(self.specs)}
        self.optimizer = make_optimizer(config.optimizer, config.lr)
        self.state = {name: self.optimizer.init_state(value) for name, value in self.params.items()}
        self.applied = 0
        self.stopped = False  # a worker failed: no more reductions
        self.peers: Optional[Context] = None
        self.joined_with: Optional[Worker] = None
        self.sum = BucketSum()  # the same reducer and buckets as the ring trainer's
        self.totals: Dict[int, np.ndarray] = {}  # step -> the workers' summed [loss sum, correct, count]

    def pushes(self, summed: Dict[str, np.ndarray]) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
        """The dense gradients a push carries (none) and those still summed (all: ``reduce``
        takes them after the push)."""
        return {}, summed

    def clock_share(self, current: Tuple[np.ndarray, int]) -> Tuple[Optional[np.ndarray], int]:
        """What the clock tells the servers: nothing (the workers' reduction carries the stats)."""
        return None, 0

    def join(self, worker: Worker) -> None:
        """The workers of ``worker.layout`` (all of them, together): a new communicator of
        theirs and the most advanced replica everywhere."""
        comm = self.ctx.comm
        everyone = comm.Get_group()
        workers = everyone.Incl(list(worker.layout.worker_ranks))
        everyone.Free()
        peers = comm.Create_group(workers)
        workers.Free()
        if self.ctx.ft:
            peers.Set_errhandler(MPI.ERRORS_RETURN)
        old, self.peers = self.peers, Context(peers, ft=self.ctx.ft, cuda_aware=self.ctx.cuda_aware,
                                               launcher=self.ctx.launcher)
        self.peers.traffic = self.ctx.traffic
        self.joined_with = worker
        if old is not None:
            release(old.comm)
        applied = peers.allgather(self.applied)
        root = int(np.argmax(applied))
        for array in self._arrays():
            peers.Bcast(array, root=root)
        self.applied = applied[root]

    def reduce(self, step: int, grads: Mapping[str, np.ndarray], stats: np.ndarray) -> np.ndarray:
        """Step ``step`` (from 0): the workers' summed ``grads`` applied, or nothing when that
        step's update is already in; returns the workers' summed ``stats`` ([loss sum, correct,
        count]) of the step (this worker's own when an update already in was reduced before it
        joined). ``PSTrainingError`` on every worker when one failed or the mean gradient is
        not finite (nothing applied)."""
        if self.applied > step:
            return self.totals.get(step, stats)
        if self.applied < step:
            raise PSTrainingError(f"the dense replica has {self.applied} steps applied, behind step {step + 1}")
        zeros = {spec.name: np.zeros(spec.shape, spec.dtype) for spec in self.specs if spec.name not in grads}
        total = self._allreduce([grads.get(spec.name, zeros.get(spec.name)) for spec in self.specs], 0, stats)
        if total[-1][0]:
            self.stopped = True
            raise PSTrainingError(f"stopped at step {step + 1}: {int(total[-1][0])} worker(s) failed")
        for spec, grad in zip(self.specs, total):
            if not all_finite(grad):
                raise PSTrainingError(f"stopped at step {step + 1}: the mean gradient of the dense parameter "
                                      f"{spec.name!r} contains NaN or Inf; refused on every worker")
        for spec, grad in zip(self.specs, total):
            self.optimizer.update(self.params[spec.name], grad, self.state[spec.name], step + 1)
        self.applied = step + 1
        self.totals[step] = total[-1][1:].copy()
        return self.totals[step]

    def bail_out(self) -> None:
        """This worker failed: take part in the reduction the others wait in, with zeros and a
        failure, so they stop too (once; errors here are the failure's, already reported)."""
        if self.stopped or self.peers is None:
            return
        self.stopped = True
        try:
            self._allreduce([np.zeros(spec.shape, spec.dtype) for spec in self.specs], 1, np.zeros(3))
        except Exception:  # noqa: BLE001 (the run already fails with this worker's own error)
            pass

    def revoke(self) -> None:
        """Wake every worker blocked in the workers' communicator (a failure was seen)."""
        if self.peers is not None:
            revoke(self.peers.comm)

    def close(self) -> None:
        """The run is over: free the workers' communicator (kept if revoked: ``release``)."""
        if self.peers is not None:
            release(self.peers.comm)
            self.peers = None

    def _allreduce(self, grads: List[np.ndarray], failed: int, stats: np.ndarray) -> List[np.ndarray]:
        arrays = [*grads, np.array([failed, *stats], np.float64)]
        return self.sum(arrays, self.peers)

    def _arrays(self) -> List[np.ndarray]:
        """Every array of the replica, in an order all workers share."""
        return [self.params[name] for name in sorted(self.params)] + \
            [self.state[name][key] for name in sorted(self.state) for key in sorted(self.state[name])]


def dense_summary(ctx: Context, layout: Layout,
                  replica: Optional[DenseReplica]) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """The dense parameters on every rank (the first worker's) and, for the results, each live
    worker's checksum of its replica and steps applied, by worker index (collective)."""
    comm, first = ctx.comm, layout.worker_ranks[0]
    dense = comm.bcast(replica.params if ctx.rank == first else None, root=first)
    live = replica if replica is not None and ctx.rank in layout.worker_ranks else None
    found = dict(filter(None, comm.allgather((ctx.rank, (checksum(live.params), live.applied)) if live else None)))
    sums = [found[rank][0] for rank in layout.worker_ranks]
    return dense, {"dense_checksums": sums, "dense_steps_applied": [found[rank][1] for rank in layout.worker_ranks],
                   "dense_identical": len(set(sums)) == 1}

"""``TrainPipeline``: TorchRec's ``TrainPipelineSparseDist`` for a hybrid job: the next batch's
ids are checked, deduplicated and routed while this batch computes, the push is in flight
while the dense optimizer steps (``clock()`` waits for it: the servers' exactly-once rule),
the dense part goes through the job's ``DistributedDataParallel``.

    pipeline = hpcreduce.torch.TrainPipeline(job, dense_optimizer)
    batches = iter(my_shard)                  # each batch has .sparse_features, a KeyedJaggedTensor
    while True:
        try:
            output = pipeline.progress(batches)   # one step: forward, backward, push, step, clock
        except StopIteration:
            break
    job.release()

The model's forward takes a batch and returns ``(loss, output)``. Step i: batch i's pull is in
flight; batch i+1 is taken from the iterator and planned (ids deduplicated per table, its check
by every trainer started as a nonblocking allreduce: ``batch_check``) while that pull travels;
forward on batch i, backward, push (one request for all tables), the dense optimizer's step,
``clock()``. Batch i+1's check is finished just before its pull is sent: a bad batch raises
on every trainer there, with nothing of it sent; a trainer whose iterator ended sends "ended"
instead, and every trainer's next ``progress`` raises ``StopIteration`` (uneven shards).
Staleness: under BSP (and SSP with staleness 0) the pull of batch i+1 leaves after step i's
clock, so it reads exactly what an unpipelined run reads (same result, bit for bit); under
SSP(s >= 1) or ASP it leaves after step i's forward, before its backward, so the rows of batch
i+1 may miss step i's updates as well: a read up to s + 1 steps stale (the pipeline's ``extra_staleness`` is that 1). Colocated tables
pull collectively: right after the clock, or, when the job recovers in place (a colocated job
under a fault-tolerant launch, ``hybrid_elastic``), at the start of the next ``progress``, so
that ``progress`` ends with ``clock()`` and a commit right after it keeps exactly once.

Under ``hpcreduce.elastic.run`` (track the job, not the pipeline: ``State(hybrid=job, ...)``;
a pipeline given to ``State`` is refused), a batch planned in an earlier call of the loop (from
that call's iterator, shared out over the ranks of then) is dropped, nothing of it waited for:
its pull, if posted, went with the recovery (``ElasticJob.elastic_receive`` forgets the
collection's calls in flight). Recreate the iterator from the committed step in each call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch

from .hybrid import HybridWorker
from .routing import BatchPlan

TRACKED = ("a TrainPipeline holds nothing to commit (only the next batch, planned from the loop's iterator): "
           "track its job (State(hybrid=job, ...)); after a recovery the pipeline drops what it planned before, "
           "and the loop recreates its iterator from the committed step")


@dataclass
class Planned:
    """A batch taken from the iterator: its ``plan``, the job's ``attempt`` (calls of the loop
    ended under ``elastic.run``) when it was planned, and whether its pull is posted."""

    batch: Any
    plan: BatchPlan
    attempt: int
    pulled: bool = False


class TrainPipeline:
    """Pipelined steps of ``job`` (a ``HybridWorker``) with ``optimizer`` on its dense part."""

    def __init__(self, job: HybridWorker, optimizer: torch.optim.Optimizer):
        self.job, self.optimizer = job, optimizer
        self.extra_staleness = 1 if job.early_pull else 0
        self._pull_after_clock = not job.recovers_in_place
        self._next: Optional[Planned] = None

    def progress(self, batches: Iterator[Any]) -> Any:
        """One training step on the next batch; its ``output``. ``StopIteration`` on every
        trainer once any trainer's ``batches`` is exhausted (uneven shards: the trainers agree
        that the data ended, as torch's ``Join``; a longer shard's batches beyond it are not
        trained)."""
        current = self._held()
        if current is None:
            current = self._planned(batches)
        self._pull(current)
        if current.plan.ended:
            raise StopIteration
        self._next = self._planned(batches)
        self.optimizer.zero_grad()
        loss, output = self.job.module(current.batch)
        if self.job.early_pull:
            self._pull(self._next)
        loss.backward()
        self.job.push()
        self.optimizer.step()
        self.job.clock()
        if self._pull_after_clock:
            self._pull(self._next)
        return output

    def elastic_problem(self) -> str:
        """Why ``elastic.State`` refuses to track a pipeline (on every rank alike)."""
        return TRACKED

    def _held(self) -> Optional[Planned]:
        """The next batch planned by the last step, unless planned in an earlier call of the loop
        under ``elastic.run`` (then dropped, unwaited: before a recovery, a leave or a growth, from
        another iterator)."""
        held, self._next = self._next, None
        return held if held is not None and held.attempt == self.job.attempts_ended else None

    def _pull(self, planned: Optional[Planned]) -> None:
        """Start a planned batch's pull unless posted (or none); a bad batch (refused on every
        trainer) is dropped."""
        if planned is None or planned.pulled or planned.plan.ended:
            return
        try:
            self.job.collection.start_pull(planned.plan)
        except Exception:
            self._next = None
            raise
        planned.pulled = True

    def _planned(self, batches: Iterator[Any]) -> Planned:
        """The next batch of ``batches``, its check started (this trainer's data ended: said so)."""
        batch = next(batches, _ENDED)
        plan = self.job.collection.start_plan(getattr(batch, "sparse_features", None), ended=batch is _ENDED)
        return Planned(batch, plan, self.job.attempts_ended)


_ENDED = object()  # an iterator's end (a batch may be None)

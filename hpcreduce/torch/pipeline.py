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
on every trainer there, after step i, with nothing of it sent. Staleness: under BSP (and SSP
with staleness 0) the pull of batch i+1 leaves right after step i's clock, so it reads exactly
what an unpipelined run reads (same result, bit for bit); under SSP(s >= 1) or ASP it leaves
after step i's forward, before its backward, so the rows of batch i+1 may miss step i's updates
as well: a read up to s + 1 steps stale (the pipeline's ``extra_staleness`` is that 1).
Colocated tables pull collectively: after the clock.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional, Tuple

import torch

from .hybrid import HybridWorker
from .routing import BatchPlan


class TrainPipeline:
    """Pipelined steps of ``job`` (a ``HybridWorker``) with ``optimizer`` on its dense part."""

    def __init__(self, job: HybridWorker, optimizer: torch.optim.Optimizer):
        self.job, self.optimizer = job, optimizer
        self.extra_staleness = 1 if job.early_pull else 0
        self._next: Optional[Tuple[Any, BatchPlan]] = None
        self._pulled = False

    def progress(self, batches: Iterator[Any]) -> Any:
        """One training step on the next batch; its ``output``. ``StopIteration`` when
        ``batches`` is exhausted (after the last step)."""
        if self._next is None:
            self._next = self._planned(next(batches))
            self._pulled = False
        batch, routed = self._next
        if not self._pulled:
            self._pull(routed)
        following = next(batches, None)
        self._next = None if following is None else self._planned(following)
        self.optimizer.zero_grad()
        loss, output = self.job.module(batch)
        self._pulled = self._next is not None and self.job.early_pull
        if self._pulled:
            self._pull(self._next[1])
        loss.backward()
        self.job.push()
        self.optimizer.step()
        self.job.clock()
        if self._next is not None and not self._pulled:
            self._pull(self._next[1])
            self._pulled = True
        return output

    def _pull(self, routed: BatchPlan) -> None:
        """Start a planned batch's pull; a bad batch (refused on every trainer) is dropped."""
        try:
            self.job.collection.start_pull(routed)
        except Exception:
            self._next = None
            raise

    def _planned(self, batch: Any) -> Tuple[Any, BatchPlan]:
        return batch, self.job.collection.start_plan(getattr(batch, "sparse_features", None))

"""A PS worker's training loop: pull, compute its share, push, clock.

Step t (from 0) of the worker at index i of W live workers:

1. its examples: ``partition.worker_batch(t, i, W)``, those of the data shards worker i of W
   owns (the same split as ring mode; after a failure or growth, i and W change and so
   do the shards it reads);
2. ``read``: every dense table (on steps where t % fetch_every == 0; otherwise the last
   copy is reused) and the sparse rows the batch touches, all requests in flight at once;
3. ``compute``: ``model.loss_and_grads`` on the share; gradients scaled by 1/global
   batch, so the workers' pushes add up to the global batch's mean gradient;
4. ``push`` (when (t + 1) % push_every == 0, or at the last step): the gradients summed
   since the last push, every table at once, then wait for the acknowledgements; when step
   t + 1 reads the dense tables anyway, they are pushed with ps-lite's fused push-pull
   (``Worker.push_pull_step_async``: one round trip brings back the values step t + 1 reads,
   so its read moves only sparse rows, and the last push-pull to a server ends the step there
   instead of a CLOCK message), and ``clock()`` goes out before the wait (not with fault
   tolerance: a replicating server does not serve push-pulls);
5. ``clock()``.

The loop is a small state machine (``step``, ``stage``) so that the fault-tolerance
layer can resume it after a recovery: a read is simply redone; a push in flight is
kept (``outgoing``) until every piece is acknowledged, and re-pushed after a recovery
(servers drop what they already have); BSP recovery restarts the loop at a step
(``restart``). Every acknowledged piece is logged in ``pushed`` as (step, table, shard
key), which is what exactly-once is checked against.
In ``--mode hybrid`` (``dense_replica``) the servers hold only the sparse tables: the read
pulls sparse rows only, the push carries sparse rows only, and between the push and the clock
every worker's dense gradients go into one allreduce among the workers
(``DenseReplica.reduce``), after which each applies the same update to its replica; the
workers' communicator is made again at the start of ``run_steps`` after any change of ranks.
Each step is recorded in a ``StepLog`` (loss, accuracy and examples of this worker's share;
hybrid: of the global batch, which the dense reduction sums; bytes, and the read staleness
the servers reported) and handed to the run's observer, if any.
On ``config.device`` gpu the model computes on cupy arrays: pulled dense tables are
copied up once per fetch and pulled rows every step, the gradients copied down before
they are summed and pushed; requests, replies and the summing stay on the host.
A stop signal (``stop_point``) ends the loop after a read, before its compute:
every worker then has the same steps done.
Cost per step: see ``hpcreduce.ps.Worker`` (one header each way per request, payloads once).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ...arrays import Device, to_host
from ...ps.handles import Handle, issue_all, wait_all
from ...ps.protocol import Rep, Status
from ...ps.updates import sum_rows
from ...ps.worker import Worker
from ...runtime.context import Context
from ..config import TrainConfig
from ..data import Dataset
from ..model import Model, SparseRows, StepOutput, checked_grads
from ..partition import worker_batch
from ..results import StepLog
from ..straggler import factor_for, slow_down
from .dense_replica import DenseReplica
from .dense_sync import DenseSync, dense_sync
from .stop_point import StopPoint

PHASES = {"read": "communication", "compute": "compute", "push": "communication", "reduce_dense": "communication"}
READ, PUSH, CLOCK = "read", "push", "clock"
RowGrads = Tuple[np.ndarray, np.ndarray]


@dataclass
class WorkerLog:
    """``stats[t]``: this worker's [loss_sum, correct, count] of step t; ``log``: its
    StepLog (wall time, bytes per step); ``failure``: why the loop stopped early;
    ``replica``: the dense replica (hybrid; None when the servers hold the dense tables)."""

    stats: np.ndarray
    log: StepLog
    failure: Optional[str] = None
    replica: Optional[DenseReplica] = None


@dataclass
class Outgoing:
    """A push not yet acknowledged everywhere: its step and the gradients it carries."""

    step: int
    dense: Dict[str, np.ndarray] = field(default_factory=dict)
    rows: Dict[str, RowGrads] = field(default_factory=dict)


class WorkerLoop:
    """Runs ``config.steps`` steps of ``model`` on ``dataset`` through ``worker``.

    ``before_step(step)`` runs at the start of every step (from 1) the first time it is
    reached (fault injection, checkpoints of the steps before it); ``after_steps(done)`` once the
    loop ran its last step (the checkpoint of the last step).
    """

    def __init__(self, worker: Worker, config: TrainConfig, model: Model, dataset: Dataset,
                 ctx: Context):
        self.worker, self.config, self.model, self.dataset = worker, config, model, dataset
        self.specs = model.param_specs()
        self.dense_sync: DenseSync = dense_sync(ctx, config, model)  # the servers', or a replica (hybrid)
        self.dense = self.dense_sync.params
        self.device = Device(config.device)  # the model computes there; pushes and pulls go through the host
        self.dense_on_device: Optional[Dict[str, object]] = None
        self.summed: Dict[str, np.ndarray] = {}
        self.summed_rows: Dict[str, List[RowGrads]] = {}
        self.result = WorkerLog(np.zeros((config.steps, 3)), StepLog(ctx, config.steps), replica=self.replica)
        self.step, self.stage = 0, READ
        self.outgoing: Optional[Outgoing] = None
        self.pushed: List[Tuple[int, int, int]] = []
        self.refetch = False
        self.taking_over = False  # a replacement's first push: what the dead worker's push left is not counted again
        self.fused = not ctx.ft and self.dense_sync.pulled  # push-pull: replicating servers refuse it
        self.prefetched: Optional[int] = None  # dense tables already pulled by a push-pull: its staleness
        self.before_step: Callable[[int], None] = lambda step: None
        self.after_steps: Callable[[int], None] = lambda done: None
        self.stop: Optional[StopPoint] = None  # where a stop signal ends the loop
        self._current: Tuple[np.ndarray, int] = (np.zeros(3), 0)
        # a straggler (--slow) is named by its stable id, slot + K for the workers the job started with
        self.slow = factor_for(config.fault, worker.slot + config.servers)

    @property
    def replica(self) -> Optional[DenseReplica]:
        """The dense replica (hybrid), for its checkpoints; None when the servers hold the dense."""
        return self.dense_sync if isinstance(self.dense_sync, DenseReplica) else None

    def run(self, ctx: Context, observer: Optional[Any] = None) -> WorkerLog:
        """Every step, then release the servers; errors end up in ``failure``."""
        try:
            self.run_steps(observer)
        except Exception as err:  # reported on every rank by trainer.run_ps_training
            self.fail(ctx, err)
        finally:
            self.worker.release()
        return self.result

    def fail(self, ctx: Context, err: Exception) -> None:
        """Stop with ``err`` as the reason (hybrid: the other workers stop at the same step)."""
        self.result.failure = f"worker rank {ctx.rank} at step {self.step}: " \
                              f"{type(err).__name__}: {err}"
        self.dense_sync.bail_out()

    def abandon(self) -> None:
        """Complete the requests in flight with errors and wake the workers blocked in a reduction."""
        self.worker.abandon()
        self.dense_sync.revoke()

    def run_steps(self, observer: Optional[Any] = None) -> None:
        """Go on from ``step``/``stage`` to the last step (MPI errors propagate)."""
        phases = observer.timed(self, PHASES) if observer is not None else self
        if self.dense_sync.joined_with is not self.worker:
            self.dense_sync.join(self.worker)  # a new layout: every worker of it is here
        while self.step < self.config.steps and not (self.stop is not None and self.stop.stopped):
            self.advance(phases, observer)
        if self.step >= self.config.steps:
            self.after_steps(self.step)

    def advance(self, phases: Any, observer: Optional[Any]) -> None:
        """The current step from its current stage to its end."""
        config, worker, step = self.config, self.worker, self.step
        if self.stage == READ:
            self.before_step(step + 1)
            indices = worker_batch(step, worker.index, worker.layout.worker_count, batch=config.batch,
                                   shards=self.dataset.shard_sizes("train"), seed=config.seed)
            stats, staleness = np.zeros(3), 0
            if len(indices):
                batch = self.dataset.batch("train", indices)
                fetch = step % config.topology.fetch_every == 0 or self.refetch
                params, staleness = phases.read(batch, fetch_dense=fetch)
                self.refetch = False
            if self.stop is not None and self.stop.after_read(step):
                return  # a stop signal: every worker stops before this step (``stop_point``)
            if len(indices):
                output = phases.compute(params, batch)
                stats[:] = (output.loss_sum, output.correct, output.count)
            self._current = (stats, staleness)
            self.stage = PUSH
        if self.stage == PUSH:
            if (step + 1) % config.topology.push_every == 0 or step + 1 == config.steps:
                phases.push()
            self.stage = CLOCK
        if self.dense_sync.reduces:
            phases.reduce_dense()
        if worker.clock_value <= step:
            worker.clock(*self.dense_sync.clock_share(self._current))  # ps: the servers keep each share
        stats, staleness = self._current
        self.result.stats[step] = stats
        loss_sum, correct, count = stats
        self.result.log.record(step + 1, loss_sum / max(count, 1.0), correct / max(count, 1.0),
                               int(count), read_staleness=staleness)
        self.step, self.stage = step + 1, READ
        if observer is not None:
            observer.step_done(self.result.log)

    def read(self, batch, *, fetch_dense: bool) -> Tuple[Dict[str, object], int]:
        """The parameters the model reads for ``batch`` (dense tables, sparse rows), and
        the largest staleness (this worker's clock - the slowest) the servers reported."""
        rows = self.model.rows(batch)
        sparse = [spec.name for spec in self.specs if spec.sparse]
        prefetched, self.prefetched = self.prefetched, None
        pull_dense = fetch_dense and prefetched is None and self.dense_sync.pulled
        starts = [partial(self.worker.pull_async, name, out=value) for name, value in self.dense.items()] \
            if pull_dense else []
        starts += [partial(self.worker.pull_rows_async, name, rows[name]) for name in sparse]
        handles = issue_all(starts)
        pulled = wait_all(handles)[len(starts) - len(sparse):]
        if fetch_dense or self.dense_on_device is None:  # the pulled bytes go up once per fetch
            self.dense_on_device = self.device.put_all(self.dense)
        params: Dict[str, object] = dict(self.dense_on_device)
        for name, values in zip(sparse, pulled):
            params[name] = SparseRows(np.asarray(rows[name], dtype=np.int64), self.device.put(values))
        staleness = [reported_staleness(h, self.worker.clock_value) for h in handles]
        return params, max(staleness + ([] if prefetched is None else [prefetched]), default=0)

    def compute(self, params: Dict[str, object], batch) -> StepOutput:
        """The model's loss and gradients; the gradients, checked against the parameters
        (``ModelError``, reported on every rank as ``PSTrainingError``) and scaled by
        1/global batch, are added to those waiting to be pushed."""
        with slow_down(self.slow):
            output = self.model.loss_and_grads(params, batch)
            grads = checked_grads(self.model, self.specs, output)
        scale = 1.0 / self.config.batch
        for spec in self.specs:
            grad = grads[spec.name]
            if spec.sparse:
                values = (to_host(grad.values) * scale).astype(spec.dtype, copy=False)
                self.summed_rows.setdefault(spec.name, []).append((to_host(grad.ids), values))
            elif spec.name in self.summed:
                self.summed[spec.name] += to_host(grad).astype(spec.dtype, copy=False) * scale
            else:
                self.summed[spec.name] = (to_host(grad) * scale).astype(spec.dtype, copy=False)
        return output

    def push(self) -> None:
        """Push every waiting gradient, all tables at once, and wait for the acknowledgements;
        the push stays in ``outgoing`` until then."""
        if self.outgoing is None:
            dense, self.summed = self.dense_sync.pushes(self.summed)  # hybrid: reduce_dense takes them
            self.outgoing = Outgoing(self.step, dense,
                                     {name: sum_rows(parts) for name, parts in self.summed_rows.items()})
            self.summed_rows = {}
        out = self.outgoing
        following = self.step + 1
        fused = self.fused and following < self.config.steps and following % self.config.topology.fetch_every == 0 \
            and bool(self.dense) and out.dense.keys() == self.dense.keys()
        starts = [partial(self.worker.push_rows_async, name, ids, grads)
                  for name, (ids, grads) in out.rows.items()]
        if not fused:
            starts += [partial(self.worker.push_async, name, grad) for name, grad in out.dense.items()]
        handles = issue_all(starts)
        if fused:  # the dense pushes last: the last push-pull to a server ends the step there
            handles += self.worker.push_pull_step_async(out.dense, self.dense)
            self.worker.clock(*self._current)  # under BSP the values come back once every worker's clock has moved
        wait_all(handles)
        if fused:
            self.prefetched = max(reported_staleness(h, self.worker.clock_value) for h in handles[len(out.rows):])
        layout = self.worker.layout
        self.acknowledged([(handle.table, layout.shard_of(part.rank)) for handle in handles for part in handle.parts
                           if not (self.taking_over and int(part.reply[Rep.STATUS]) == Status.DUPLICATE)])
        self.taking_over = False

    def reduce_dense(self) -> None:
        """Hybrid: the dense gradients summed since the last reduction, reduced among the workers
        and applied (``DenseReplica.reduce``; kept for a retry if the reduction fails), and the
        step's stats made the global batch's."""
        stats, staleness = self._current
        self._current = (self.dense_sync.reduce(self.step, self.summed, stats), staleness)
        self.summed = {}

    def acknowledged(self, pieces: List[Tuple[int, int]]) -> None:
        """Every piece of ``outgoing`` is acknowledged: (table, shard key) of each, logged."""
        self.pushed += [(self.outgoing.step, table, key) for table, key in pieces]
        self.outgoing = None

    def restart(self, step: int) -> None:
        """BSP recovery: go back to the start of ``step``; everything pushed from it on is
        dropped by the servers (and from the log), and the gradients not pushed are dropped."""
        self.step, self.stage = step, READ
        self.summed, self.summed_rows, self.outgoing = {}, {}, None
        self.prefetched = None
        self.pushed = [entry for entry in self.pushed if entry[0] < step]
        self.result.stats[step:] = 0
        self.result.log.drop_after(step)
        self.worker.clock_value = step
        self.refetch = True


def reported_staleness(handle: Handle, clock: int) -> int:
    """How many clocks behind ``clock`` the slowest worker was when the servers answered."""
    return max([clock - int(part.reply[Rep.SLOWEST]) for part in handle.parts], default=0)

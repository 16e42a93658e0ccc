"""A PS worker's training loop: pull, compute its share, push, clock.

Step t (from 0) of worker w of W:

1. its examples: ``partition.worker_batch(t, w, W)``, the same split as ring mode;
2. ``read``: every dense table (on steps where t % fetch_every == 0; otherwise the last
   copy is reused) and the sparse rows the batch touches, all requests in flight at once;
3. ``compute``: ``model.loss_and_grads`` on the share; gradients scaled by 1/global
   batch, so the workers' pushes add up to the global batch's mean gradient;
4. ``push`` (when (t + 1) % push_every == 0, or at the last step): the gradients summed
   since the last push, every table at once, then wait for the acknowledgements;
5. ``clock()``.

Each step is recorded in a ``StepLog`` (this worker's share: loss, accuracy, bytes, and
the read staleness the servers reported) and handed to the run's observer, if any
(progress, metrics file, timeline; ``read``/``compute``/``push`` are its phases).
Any error stops the loop; the worker still releases the servers, and the error is
reported on every rank afterwards (``training``), so nobody waits for it.
Cost per step: see ``PSWorker`` (one header each way per request, payloads once).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..runtime.context import Context
from ..train.config import TrainConfig
from ..train.data import Dataset
from ..train.model import Model, SparseRows, StepOutput
from ..train.partition import worker_batch
from ..train.results import StepLog
from .handles import Handle, issue_all, wait_all
from .protocol import Rep
from .updates import sum_rows
from .worker import PSWorker

PHASES = {"read": "communication", "compute": "compute", "push": "communication"}


@dataclass
class WorkerLog:
    """``stats[t]``: this worker's [loss_sum, correct, count] of step t; ``log``: its
    StepLog (wall time, bytes per step); ``failure``: why the loop stopped early."""

    stats: np.ndarray
    log: StepLog
    failure: Optional[str] = None


class WorkerLoop:
    """Runs ``config.steps`` steps of ``model`` on ``dataset`` through ``worker``."""

    def __init__(self, worker: PSWorker, config: TrainConfig, model: Model, dataset: Dataset):
        self.worker, self.config, self.model, self.dataset = worker, config, model, dataset
        self.specs = model.param_specs()
        self.dense = {spec.name: np.empty(spec.shape, spec.dtype) for spec in self.specs
                      if not spec.sparse}
        self.summed: Dict[str, np.ndarray] = {}
        self.summed_rows: Dict[str, List[Tuple[np.ndarray, np.ndarray]]] = {}

    def run(self, ctx: Context, observer: Optional[Any] = None) -> WorkerLog:
        """Every step, then release the servers; errors end up in ``failure``."""
        steps = self.config.steps
        result = WorkerLog(np.zeros((steps, 3)), StepLog(ctx, steps))
        phases = observer.timed(self, PHASES) if observer is not None else self
        try:
            for step in range(steps):
                stats, staleness = self.step(step, phases)
                result.stats[step] = stats
                loss_sum, correct, count = stats
                result.log.record(step + 1, loss_sum / max(count, 1.0), correct / max(count, 1.0),
                                  int(count), read_staleness=staleness)
                if observer is not None:
                    observer.step_done(result.log)
        except Exception as err:  # reported on every rank by training.run_ps_training
            result.failure = f"worker rank {ctx.rank} at step {self.worker.clock_value}: " \
                             f"{type(err).__name__}: {err}"
        finally:
            self.worker.release()
        return result

    def step(self, step: int, phases: Any) -> Tuple[np.ndarray, int]:
        """One step through ``phases`` (this loop, or it timed); returns this worker's
        [loss_sum, correct, count] and the largest read staleness the servers reported."""
        config, worker = self.config, self.worker
        indices = worker_batch(step, worker.id, worker.layout.workers, batch=config.batch,
                               num_examples=self.dataset.size("train"), seed=config.seed)
        stats, staleness = np.zeros(3), 0
        if len(indices):
            batch = self.dataset.batch("train", indices)
            params, staleness = phases.read(batch, fetch_dense=step % config.fetch_every == 0)
            output = phases.compute(params, batch)
            stats[:] = (output.loss_sum, output.correct, output.count)
        if (step + 1) % config.push_every == 0 or step + 1 == config.steps:
            phases.push()
        worker.clock()
        return stats, staleness

    def read(self, batch, *, fetch_dense: bool) -> Tuple[Dict[str, object], int]:
        """The parameters the model reads for ``batch`` (dense tables, sparse rows), and
        the largest staleness (this worker's clock - the slowest) the servers reported."""
        rows = self.model.rows(batch)
        sparse = [spec.name for spec in self.specs if spec.sparse]
        starts = [partial(self.worker.pull_async, name, out=value)
                  for name, value in self.dense.items()] if fetch_dense else []
        starts += [partial(self.worker.pull_rows_async, name, rows[name]) for name in sparse]
        handles = issue_all(starts)
        pulled = wait_all(handles)[len(starts) - len(sparse):]
        params: Dict[str, object] = dict(self.dense)
        for name, values in zip(sparse, pulled):
            params[name] = SparseRows(np.asarray(rows[name], dtype=np.int64), values)
        return params, max([reported_staleness(h, self.worker.clock_value) for h in handles], default=0)

    def compute(self, params: Dict[str, object], batch) -> StepOutput:
        """The model's loss and gradients; the gradients, scaled by 1/global batch, are
        added to those waiting to be pushed."""
        output = self.model.loss_and_grads(params, batch)
        scale = 1.0 / self.config.batch
        for spec in self.specs:
            grad = output.grads[spec.name]
            if spec.sparse:
                values = (np.asarray(grad.values) * scale).astype(spec.dtype, copy=False)
                self.summed_rows.setdefault(spec.name, []).append((np.asarray(grad.ids), values))
            elif spec.name in self.summed:
                self.summed[spec.name] += np.asarray(grad, dtype=spec.dtype) * scale
            else:
                self.summed[spec.name] = (np.asarray(grad) * scale).astype(spec.dtype, copy=False)
        return output

    def push(self) -> None:
        """Push every waiting gradient, all tables at once, and wait for the acknowledgements."""
        starts = [partial(self.worker.push_async, name, grad) for name, grad in self.summed.items()]
        starts += [partial(self.worker.push_rows_async, name, *sum_rows(parts))
                   for name, parts in self.summed_rows.items()]
        self.summed.clear()
        self.summed_rows.clear()
        wait_all(issue_all(starts))


def reported_staleness(handle: Handle, clock: int) -> int:
    """How many clocks behind ``clock`` the slowest worker was when the servers answered."""
    return max([clock - int(part.reply[Rep.SLOWEST]) for part in handle.parts], default=0)

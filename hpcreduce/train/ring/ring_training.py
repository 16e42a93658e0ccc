"""``run_ring_training``: train a model with ring AllReduce (``hpcreduce train --mode ring``).

Every rank is a worker (``ring_steps.RingTrainer``), driven through failures, growth and
leaves by ``ring_driver`` when the launch and ``config.fault`` ask for them; at the end all
ranks evaluate the (identical) parameters on the held-out split and build the result.
"""
from __future__ import annotations

import time

import numpy as np

from ...arrays import Device
from ...ps.stats import staleness_summary
from ...runtime.context import Context
from ..config import TrainConfig
from ..data import Dataset
from ..evaluation import evaluate
from ..model import Model
from ..observe import RING_PHASES, Observer
from ..results import FinalMetrics, StepLog, TrainResult, checksum
from ..run_checks import refuse_unfit_replicas
from .ring_driver import Saving, ring_state, train_steps
from .ring_steps import RingTrainer, StepMetrics


def run_ring_training(ctx: Context, config: TrainConfig, model: Model, dataset: Dataset,
                      observer: Observer) -> TrainResult:
    """Ring AllReduce training to the held-out result, on every rank of ``ctx`` (collective)."""
    started = time.perf_counter()
    steps = RingTrainer(ctx, config, model, dataset)
    if not ctx.joined:  # a newcomer joins ranks that made the check
        refuse_unfit_replicas(ctx, model, steps.optimizer)
    trainer = observer.timed(steps, RING_PHASES, collective=("reduce",))
    saving = Saving.of(trainer, config.fault)
    state = ring_state(ctx, trainer, config.fault, config.seed, saving, observer.echo)
    log = StepLog(ctx, config.steps)

    def on_step(metrics: StepMetrics) -> None:
        log.record(metrics.step, metrics.loss, metrics.accuracy, metrics.examples)
        observer.step_done(log)

    final = train_steps(state, trainer, saving, config.steps, on_step)
    train_s = time.perf_counter() - log.started
    loss, accuracy = evaluate(ctx, model, final.params, dataset)
    in_sync = np.zeros(len(log.rows) * ctx.size, np.int64)  # one read and one push per rank per step
    return TrainResult(config=config, model=model.name, ranks=ctx.size, worker_count=ctx.size,
                       dataset=dataset.info(), steps=log.rows, traffic=log.gather_traffic(),
                       staleness=staleness_summary(in_sync, in_sync), wall_s=time.perf_counter() - started,
                       train_s=train_s, final=FinalMetrics(loss, accuracy, checksum(final.params)),
                       params=Device("cpu").put_all(final.params), recovery=state.job.changes.as_dicts())

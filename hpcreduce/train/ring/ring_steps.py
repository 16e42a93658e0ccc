"""Synchronous data-parallel training over ring AllReduce.

Every rank holds the whole model, on its device (``config.device``: numpy arrays, or
cupy arrays on the rank's GPU, which ``allreduce_many`` hands to CUDA-aware MPI or stages
through host memory; the step's statistics stay on the host). A step has three phases:

* ``compute``: the rank's share of the step's global batch (``partition``: the examples
  of the data shards it owns, re-split over the ranks after a failure or growth) gives
  summed gradients; sparse gradients are scattered into dense zero tables.
* ``reduce``: one fused ``allreduce_many(..., "sum")`` of every gradient and of the
  step's [loss, correct, count, failed ranks, stop requests] over all ranks (a rank that
  received a stop signal, ``runtime.stop``, counts 1: every rank learns it in the same step).
* ``apply``: gradients are divided by the global batch and the optimizer runs
  locally, so all ranks keep bitwise-identical parameters.

Errors (the same policy as PS training): a rank whose model fails (its own error, or
gradients that do not match the parameters: ``model.checked_grads``) takes part in the
reduce with zero gradients and counts itself as failed, so no rank is left waiting;
every rank then sees the count, gathers the reasons and raises ``TrainingError``. A
reduced gradient with NaN or Inf is refused on every rank (it is the same everywhere,
so they all decide alike without another message): the step is not applied and
``TrainingError`` names the step and the parameter, as a PS server refuses such a push.

``compute`` and ``reduce`` change nothing, so a step whose reduce fails can be
retried from the same state on a replaced communicator (with the shares re-split
for the new number of ranks). Sparse tables get lazy updates, as parameter servers
give them: only rows with a non-zero summed gradient go through the optimizer (the
same result for SGD and Adagrad; for momentum and Adam untouched rows stay put).

Cost per step: one allreduce of the whole model (sparse tables densified) and 40
bytes of statistics: 2(N-1)/N * model bytes sent and received per rank with the
ring algorithm, plus the input check's small allreduce.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np

from ...arrays import Device
from ...collectives.broadcast import broadcast_arrays
from ...collectives.bucket_sum import BucketSum
from ...errors import TrainingError
from ...arrays.finite import all_finite
from ...ps.optimizers import Optimizer, make_optimizer
from ...runtime.context import Context
from ...runtime.stop import requests
from ..config import TrainConfig
from ..data import Dataset
from ..model import Model, checked_grads
from ..params import batch_view, dense_grads, zero_grads
from ..partition import worker_batch
from ..straggler import factor_for, slow_down
from .ring_state import TrainState
from .sharded import ShardedUpdate, rows_update


@dataclass
class StepGrads:
    """Summed gradients (whole tensors) and ``stats`` = float64 [loss_sum, correct, count,
    failed ranks, stop requests], of one rank's share (after ``compute``) or of the global batch (after
    ``reduce``), for ``step``; ``failure``: why this rank's model failed (its gradients
    are then zeros)."""

    grads: Dict[str, object]
    stats: np.ndarray
    step: int
    failure: Optional[str] = None


@dataclass
class StepMetrics:
    """One finished step, over its global batch: mean loss and accuracy."""

    step: int
    loss: float
    accuracy: float
    examples: int


class RingTrainer:
    """The three phases of a ring step over ``ctx``'s ranks (all of them are workers)."""

    def __init__(self, ctx: Context, config: TrainConfig, model: Model, dataset: Dataset,
                 optimizer: Optional[Optimizer] = None):
        self.ctx, self.config, self.model, self.dataset = ctx, config, model, dataset
        self.optimizer = optimizer or make_optimizer(config.optimizer, config.lr)
        self.specs = model.param_specs()
        self.device = Device(config.device)  # selected (runtime.devices.open_device) before training
        # a straggler (--slow) is named by its stable id: its launch rank (ranks that join are never slowed)
        self.slow = 1.0 if ctx.joined else factor_for(config.fault, ctx.rank)
        self.sum = BucketSum()  # the numpy trainers' one dense reducer (persistent fusion buffers)
        self.sharded = ShardedUpdate(ctx, self.specs, self.optimizer) if config.shard_optimizer else None

    def initial_state(self) -> TrainState:
        """The initial state, with rank 0's parameters on every rank of the starting job (as torch DDP
        starts): a model whose initial values come from each rank's own random state (a ``TorchModel``
        built without seeding torch alike) would otherwise train a different replica on each rank.
        A rank that joins a running job makes its own, then takes the job's state (collective over
        the starting ranks only)."""
        state = TrainState.initial(self.model, self.optimizer, self.config.seed, self.device,
                                   sharded=self.sharded.init_state if self.sharded is not None else None)
        if not self.ctx.joined:
            broadcast_arrays(self.ctx, [state.params[name] for name in sorted(state.params)])
        return state

    def compute(self, state: TrainState) -> StepGrads:
        """This rank's summed gradients for step ``state.step``; changes nothing. A model
        error is kept in ``failure`` (with zero gradients) for ``reduce`` to report."""
        indices = worker_batch(state.step, self.ctx.rank, self.ctx.size, batch=self.config.batch,
                               shards=self.dataset.shard_sizes("train"), seed=self.config.seed)
        step = state.step + 1
        if len(indices) == 0:
            return StepGrads(zero_grads(self.specs, state.params), stop_row([0, 0, 0, 0]), step)
        try:
            with slow_down(self.slow):
                batch = self.dataset.batch("train", indices)
                output = self.model.loss_and_grads(batch_view(self.model, state.params, batch), batch)
                grads = dense_grads(self.specs, checked_grads(self.model, self.specs, output), state.params)
            stats = stop_row([output.loss_sum, output.correct, output.count, 0])
        except Exception as err:  # reported on every rank by reduce
            failure = f"rank {self.ctx.rank}: {type(err).__name__}: {err}"
            failed = stop_row([0, 0, 0, 1])
            return StepGrads(zero_grads(self.specs, state.params), failed, step, failure)
        return StepGrads(grads, stats, step)

    def reduce(self, local: StepGrads) -> StepGrads:
        """Sum every rank's gradients and statistics; changes nothing. Raises
        ``TrainingError`` on every rank when a model failed on some rank or a summed
        gradient is not finite."""
        arrays = [local.grads[spec.name] for spec in self.specs] + [local.stats]
        summed = self.sum(arrays, self.ctx)
        step = local.step
        total = StepGrads({spec.name: grad for spec, grad in zip(self.specs, summed)}, summed[-1], step)
        if total.stats[3]:  # the same count on every rank: all of them gather the reasons
            reasons = [text for text in self.ctx.comm.allgather(local.failure) if text]
            raise TrainingError(f"training stopped at step {step}: model {self.model.name!r} failed on "
                                f"{len(reasons)} rank(s): " + "; ".join(reasons))
        for spec in self.specs:
            if not all_finite(total.grads[spec.name]):
                raise TrainingError(f"training stopped at step {step}: the summed gradient of parameter "
                                    f"{spec.name!r} contains NaN or Inf; refused on every rank, the step "
                                    f"was not applied")
        return total

    def apply(self, state: TrainState, total: StepGrads) -> StepMetrics:
        """Update ``state`` in place with the global batch's mean gradient."""
        step = state.step + 1
        scale = 1.0 / self.config.batch
        if self.sharded is not None:  # --shard-optimizer: this rank's slices, then an allgather
            self.sharded.apply(state.params, total.grads, state.optimizer_state, scale, step)
        else:
            for spec in self.specs:
                param, grad = state.params[spec.name], total.grads[spec.name]
                grad *= scale
                if spec.sparse:
                    rows_update(self.optimizer, param, grad, state.optimizer_state[spec.name], step)
                else:
                    self.optimizer.update(param, grad, state.optimizer_state[spec.name], step)
        state.step = step
        loss_sum, correct, count = (float(v) for v in total.stats[:3])
        return StepMetrics(step, loss_sum / max(count, 1.0), correct / max(count, 1.0), int(count))


def stop_row(stats) -> np.ndarray:
    """``stats`` and this rank's stop request (1 once it received a stop signal), as float64."""
    return np.array([*stats, requests.seen is not None], np.float64)

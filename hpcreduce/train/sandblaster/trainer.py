"""``run_sandblaster_training``: a model trained by Sandblaster (``hpcreduce train --mode sandblaster``).

Ranks 0..K-1 serve slices of the flat parameter vector and the optimizer's vectors
(``hpcreduce.sandblaster.server``), rank K coordinates (``coordinator`` and ``lbfgs``), the
others compute work units of the fixed batch (the first ``batch`` examples of the seeded
training order, ``train.partition``). At the end every rank gathers the committed x and g,
evaluates x on the held-out split and builds the result: one step row per iteration
(loss = the objective f, accuracy = the pass's training accuracy) and a ``sandblaster``
block of counters; ``traffic`` holds each rank's payload bytes for the whole run (one
entry a rank, not one a step). Cost: see ``hpcreduce.sandblaster``; the end gathers x and g (16 bytes
an element) to every rank.
"""
from __future__ import annotations

import math
import time
import traceback
from typing import Any, Dict, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ...errors import ConfigurationError
from ...ps.stats import staleness_summary
from ...runtime.context import Context
from ...sandblaster import Roles, unit_size
from ...sandblaster.coordinator import Coordinator
from ...sandblaster.lbfgs import BatchOptimizer, Iteration, Settings
from ...sandblaster.protocol import VectorNames
from ...sandblaster.server import SliceVectors, serve
from ...sandblaster.worker import Worker
from ..config import TrainConfig
from ..data import Dataset
from ..evaluation import evaluate
from ..model import Model
from ..observe import Observer
from ..partition import global_batch
from ..results import FinalMetrics, StepLog, TrainResult, checksum
from ..straggler import factor_for
from .flat import FlatParams
from .units import ModelUnits


def run_sandblaster_training(ctx: Context, config: TrainConfig, model: Model, dataset: Dataset,
                             observer: Observer) -> TrainResult:
    """Train on every rank of ``ctx`` (collective); the result on every rank. Bad settings
    raise ``ConfigurationError`` on every rank before anything starts; an error on one rank
    (a model's) ends the whole job (MPI_Abort) rather than leave the others waiting."""
    problems = config.problems(ctx.size, ctx.ft)
    if problems:
        raise ConfigurationError(problems)
    started = time.perf_counter()
    roles, flat = Roles(config.servers, ctx.size), FlatParams(model)
    comm = ctx.comm.Dup()
    log = StepLog(ctx, config.steps)
    try:
        mark = (ctx.traffic.sent, ctx.traffic.received)
        c, summary, vectors = _play_role(ctx, comm, roles, flat, config, model, dataset, observer, log)
        moved = [ctx.traffic.sent - mark[0], ctx.traffic.received - mark[1]]
    except Exception:
        traceback.print_exc()
        MPI.COMM_WORLD.Abort(1)
    train_s = time.perf_counter() - log.started
    c, summary, rows = comm.bcast((c, summary, log.rows), root=roles.coordinator)
    per_rank = comm.allgather(moved)
    summary["duplicates_discarded"] += comm.allreduce(vectors.duplicates if vectors else 0, op=MPI.SUM)
    full_x, full_g = _gather(comm, roles, flat.length, vectors, c)
    comm.Free()
    params = flat.params(full_x)
    loss, accuracy = evaluate(ctx, model, params, dataset)
    none = np.zeros(1, np.int64)
    return TrainResult(config=config, model=model.name, ranks=ctx.size, worker_count=len(roles.workers),
                       dataset=dataset.info(), steps=rows, traffic={"bytes_sent": [[sent] for sent, _ in per_rank],
                                                             "bytes_received": [[got] for _, got in per_rank]},
                       staleness=staleness_summary(none, none), wall_s=time.perf_counter() - started,
                       train_s=train_s, final=FinalMetrics(loss, accuracy, checksum(params)), params=params,
                       sandblaster=summary, gradient=full_g)


def _play_role(ctx: Context, comm: MPI.Intracomm, roles: Roles, flat: FlatParams, config: TrainConfig, model: Model,
               dataset: Dataset, observer: Observer,
               log: StepLog) -> Tuple[int, Optional[Dict[str, Any]], Optional[SliceVectors]]:
    """This rank's part: (committed index c and summary: the coordinator's; the server's vectors)."""
    rank, workers = ctx.rank, len(roles.workers)
    unit = unit_size(config.batch, config.unit, workers)
    if rank < roles.servers:
        _, lo, hi = roles.slices(flat.length)[rank]
        vectors = SliceVectors(VectorNames(config.history), flat.flatten(model.init_params(config.seed))[lo:hi])
        serve(comm, vectors, ctx.traffic)
        return 0, None, vectors
    if rank == roles.coordinator:
        coordinator = Coordinator(comm, range(roles.servers), roles.workers, math.ceil(config.batch / unit),
                                  config.backups, ctx.traffic)

        def on_iteration(it: Iteration) -> None:
            log.record(it.iteration, it.f, it.accuracy, config.batch * it.evaluations,
                       gradient_norm=it.gradient_norm, step_size=it.step, evaluations=it.evaluations)
            observer.step_done(log)

        optimizer = BatchOptimizer(coordinator, Settings(config.optimizer, config.history, config.gtol, config.ftol,
                                                         config.steps, config.batch, config.l2), on_iteration)
        final = optimizer.run()
        coordinator.stop()
        return optimizer.c, {
            "units": coordinator.counted, "backups_issued": coordinator.backups_issued,
            "duplicates_discarded": coordinator.duplicates, "iterations": optimizer.iterations,
            "evaluations": len(coordinator.pass_s), "pass_s": coordinator.pass_s,
            "units_by_worker": {str(w): n for w, n in coordinator.units_by_worker.items()},
            "units_per_pass": coordinator.units, "optimizer": config.optimizer, "history": config.history,
            "unit": unit, "backups": config.backups, "stopped_by": optimizer.stopped_by,
            "final_gradient_norm": math.sqrt(final.gg), "objective": final.f}, None
    indices = global_batch(0, config.batch, dataset.size("train"), config.seed)
    compute = ModelUnits(model, dataset, flat, indices, unit, factor_for(config.fault, rank))
    Worker(comm, roles.coordinator, roles.slices(flat.length), flat.length, compute, config.push_units,
           ctx.traffic).run()
    return 0, None, None


def _gather(comm: MPI.Intracomm, roles: Roles, length: int, vectors: Optional[SliceVectors],
            c: int) -> Tuple[np.ndarray, ...]:
    """The committed x[c] and g[c], whole, on every rank (the servers send their slices)."""
    counts = [hi - lo for _, lo, hi in roles.slices(length)] + [0] * (roles.size - roles.servers)
    displacements = [0] * roles.size
    for rank, (_, lo, _) in enumerate(roles.slices(length)):
        displacements[rank] = lo
    names = VectorNames(1)
    found = []
    for ids in (names.X, names.G):
        mine = vectors.vectors[ids[c]] if vectors is not None else np.zeros(0)
        whole = np.empty(length)
        comm.Allgatherv(np.ascontiguousarray(mine), [whole, counts, displacements, MPI.DOUBLE])
        found.append(whole)
    return tuple(found)

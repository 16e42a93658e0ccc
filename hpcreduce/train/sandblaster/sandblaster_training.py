"""``run_sandblaster_training``: a model trained by Sandblaster (``hpcreduce train --mode sandblaster``).

Ranks 0..K-1 serve slices of the flat parameter vector and the optimizer's vectors
(``hpcreduce.sandblaster.server``), rank K coordinates (``coordinator`` and ``lbfgs``), the
others compute work units of the fixed batch (the first ``batch`` examples of the seeded
training order, ``train.partition``). At the end every rank gathers the committed x and g,
evaluates x on the held-out split and builds the result: one step row per iteration
(loss = the objective f, accuracy = the pass's training accuracy) and a ``sandblaster``
block of counters; ``traffic`` holds each rank's payload bytes for the whole run (one
entry a rank, not one a step). Cost: see ``hpcreduce.sandblaster``; the end gathers x and g (16 bytes
an element) to every rank. With ``--ft`` a run survives dead workers, servers and its
coordinator (``run``). A stop signal ends the run after an iteration, checkpointed into
``--checkpoint-dir``, and a run started again over it resumes (``stop_resume``).
"""
from __future__ import annotations

import time
import traceback

import numpy as np

from ...errors import TrainingError
from ...ps.stats import staleness_summary
from ...runtime.context import Context
from ...runtime.failures import abort_job
from ..config import TrainConfig
from ..data import Dataset
from ..evaluation import evaluate
from ..model import Model
from ..observe import Observer
from ..results import FinalMetrics, StepLog, TrainResult, checksum
from .run import SandblasterRun
from .stop_resume import save_stop


def run_sandblaster_training(ctx: Context, config: TrainConfig, model: Model, dataset: Dataset,
                             observer: Observer) -> TrainResult:
    """Train on every rank of ``ctx`` (collective; ``config`` checked by ``train``); the result
    on every rank. A failure that cannot
    be recovered from raises ``TrainingError`` on every survivor; any other error on one rank
    (a model's) ends the whole job (MPI_Abort) rather than leave the others waiting."""
    started = time.perf_counter()
    log = StepLog(ctx, config.steps)
    try:
        mark = (ctx.traffic.sent, ctx.traffic.received)
        run = SandblasterRun(ctx, config, model, dataset, observer, log)
        run.run()
        moved = [ctx.traffic.sent - mark[0], ctx.traffic.received - mark[1]]
    except TrainingError:
        raise
    except Exception:
        traceback.print_exc()
        abort_job(1)
    train_s = time.perf_counter() - log.started
    ends = run.results()
    if ends["stopped"]:  # every rank: checkpointed, then StoppedEarly (``stop_resume``)
        save_stop(run.comm, config, run.server, run.placement, run.identity, len(ends["rows"]))
    per_rank = run.comm.allgather(moved)
    full_x, full_g = run.gather(ends["c"])
    if not ctx.ft:
        run.comm.Free()
    params = run.flat.params(full_x)
    loss, accuracy = evaluate(ctx, model, params, dataset)
    none = np.zeros(1, np.int64)
    return TrainResult(config=config, model=model.name, ranks=ctx.size, worker_count=len(run.roles.workers),
                       dataset=dataset.info(), steps=ends["rows"],
                       traffic={"bytes_sent": [[sent] for sent, _ in per_rank],
                                "bytes_received": [[got] for _, got in per_rank]},
                       staleness=staleness_summary(none, none), wall_s=time.perf_counter() - started,
                       train_s=train_s, final=FinalMetrics(loss, accuracy, checksum(params)), params=params,
                       sandblaster=ends["summary"], gradient=full_g,
                       recovery=ends["recovery"] if ctx.ft or ends["recovery"] else None)

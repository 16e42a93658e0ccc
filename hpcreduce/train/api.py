"""``train(model, dataset, config)``: the Python entry point both topologies share.

    from hpcreduce.train import TrainConfig, train
    result = train(model, dataset, TrainConfig(steps=100, batch=64, lr=0.1))

Run it on every rank of an MPI job (``hpcreduce launch -n 4 -- python script.py``).
"""
from __future__ import annotations

import importlib
import time
from typing import Any, Dict, List, Optional

import numpy as np

from ..ft.elastic import ElasticRing
from ..runtime.context import Context, resolve
from .config import TrainConfig
from .data import Dataset
from .evaluation import evaluate
from .model import Model
from .observe import RING_PHASES, Observer
from .results import (StepLog, build_result, checksum, final_line, json_path_problem,
                      staleness_summary, write_json)
from .ring import RingTrainer

PS_MODULE = "hpcreduce.ps.training"


def ps_unavailable() -> Optional[str]:
    """Why ``--mode ps`` cannot run in this installation, or None when it can."""
    try:
        importlib.import_module(PS_MODULE)
    except ImportError as err:
        if err.name in ("hpcreduce.ps", PS_MODULE):
            return (f"--mode ps needs the parameter server ({PS_MODULE}), "
                    "which this installation of hpcreduce does not have yet")
        raise
    return None


def config_problems(config: TrainConfig, ctx: Context) -> List[str]:
    """What stops ``config`` running on ``ctx``'s ranks, the same list on every rank:
    ``config.problems``, a missing parameter server for ``ps`` mode, and an output file
    (--json, --metrics, --timeline) rank 0 cannot write (checked before training rather
    than lost after it)."""
    problems = config.problems(ctx.size)
    if config.mode == "ps" and not problems:
        problems.append(ps_unavailable())
    outputs = config.output_paths()
    if outputs and not ctx.joined:  # a newcomer's first collective belongs to the job
        problems += ctx.comm.bcast([json_path_problem(path, flag) for flag, path in outputs.items()]
                                   if ctx.rank == 0 else None)
    return [problem for problem in problems if problem]


def train(model: Model, dataset: Dataset, config: Optional[TrainConfig] = None, *,
          comm=None, verbose: bool = True) -> Dict[str, Any]:
    """Train ``model`` on ``dataset`` over the ranks of ``comm`` (a Context, an MPI
    intracommunicator, or None for ``hpcreduce.init()``'s); call it on every rank.

    ``config.mode`` picks the topology: ``ring`` (every rank a worker) or ``ps``
    (``hpcreduce.ps.training.run_ps_training``). Returns the result (see ``results``)
    on every rank; in ring mode ``result["params"]`` holds the trained parameters
    (the same on every rank). Rank 0 prints progress and the final line when
    ``verbose`` and writes ``config.json_path`` when set. Bad settings raise
    ValueError on every rank.
    """
    ctx = resolve(comm)
    config = config or TrainConfig()
    problems = config_problems(config, ctx)
    if problems:
        raise ValueError("; ".join(problems))
    observer = Observer(ctx, config, verbose=verbose, reporter=config.servers if config.mode == "ps" else 0)
    if config.mode == "ps":
        from ..ps.training import run_ps_training
        result = run_ps_training(ctx, config, model, dataset, observer)
    else:
        result = train_ring(ctx, config, model, dataset, observer)
    observer.finish()
    observer.echo(final_line(result))
    if config.json_path and ctx.rank == 0:
        write_json(config.json_path, result)
    return result


def train_ring(ctx: Context, config: TrainConfig, model: Model, dataset: Dataset,
               observer: Observer) -> Dict[str, Any]:
    """Ring AllReduce training to the held-out result, through failures and growth
    (``hpcreduce.ft.elastic``) when the launch and ``config.fault`` ask for them."""
    started = time.perf_counter()
    trainer = observer.timed(RingTrainer(ctx, config, model, dataset), RING_PHASES, collective=("reduce",))
    elastic = ElasticRing(ctx, trainer, config.fault, config.seed, observer.echo)
    log = StepLog(ctx, config.steps)

    def on_step(metrics) -> None:
        log.record(metrics.step, metrics.loss, metrics.accuracy, metrics.examples)
        observer.step_done(log)

    state = elastic.run(config.steps, on_step)
    train_s = time.perf_counter() - log.started
    loss, accuracy = evaluate(ctx, model, state.params, dataset)
    in_sync = np.zeros(len(log.rows) * ctx.size, np.int64)  # one read and one push per rank per step
    return build_result(config=config, ctx=ctx, workers=ctx.size, model=model, dataset=dataset,
                        log=log, traffic=log.gather_traffic(),
                        staleness=staleness_summary(in_sync, in_sync), loss=loss, accuracy=accuracy,
                        params_checksum=checksum(state.params), train_s=train_s,
                        wall_s=time.perf_counter() - started, params=state.params,
                        recovery=elastic.events.as_dicts())

"""``run_ps_training``: train a model with parameter servers (``hpcreduce train --mode ps``).

Ranks 0..K-1 serve the model's shards, the others run ``loop.WorkerLoop``; when every
worker has released them the servers stop, and all ranks together assemble the
final parameters, evaluate them on the held-out split and build the same result as
the ring trainer (``hpcreduce.train.results``), plus ``ps``: the layout, the push
counters per worker (applied, duplicate, refused) and the refusal reasons.
``staleness`` holds the measured read staleness and update lag histograms. With fault
tolerance, ``ps.pushes`` adds ``made_per_worker`` (pieces each live worker had
acknowledged, by slot; -1 for a worker that is gone) and ``updates_lost_per_worker``,
``ps.ids`` the stable id of every rank and ``ps.worker_slots`` the live workers' slots;
``recovery`` lists the recovery events (rank 0's, a server: it times the next step).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..runtime.context import Context
from ..train.config import TrainConfig
from ..train.data import Dataset
from ..train.evaluation import evaluate
from ..train.model import Model
from ..train.results import StepLog, build_result, checksum
from .collect import assemble_params, merge_summaries, server_traffic
from .consistency import Consistency
from .errors import PSConfigError, PSTrainingError
from .job import start
from .layout import Layout
from .loop import WorkerLog, WorkerLoop
from .server import Server
from .state import ShardState


def run_ps_training(ctx: Context, config: TrainConfig, model: Model, dataset: Dataset,
                    observer: Optional[Any] = None) -> Dict[str, Any]:
    """Train on every rank of ``ctx`` (collective); returns the result on every rank, with
    the final parameters (whole) under ``params``, as the ring trainer does.

    ``observer`` (``hpcreduce.train.observe.Observer``, optional) gets every step of the
    first worker (its share) for progress and metrics, and times its phases.
    Bad settings raise ``PSConfigError`` on every rank before anything starts; a
    failure during training raises ``PSTrainingError`` on every rank after the
    servers stopped. With fault tolerance (``ctx.ft``) the run survives dead ranks and
    grows (``hpcreduce.ft.ps_elastic``); the result then also has ``recovery``.
    """
    problems = dataclasses.replace(config, mode="ps").problems(ctx.size)
    fault = config.fault
    if not ctx.ft and (fault.kills or fault.kill_random or fault.grow or fault.discover or fault.replace
                       or fault.checkpoint_dir):
        problems.append("in --mode ps, --kill, --kill-random, --grow, --discover, --replace and "
                        "--checkpoint-dir need in-job fault tolerance: launch with --ft (ULFM); "
                        "PS mode has no checkpoint-and-relaunch fallback")
    if problems:
        raise PSConfigError("; ".join(problems))
    started = time.perf_counter()
    if ctx.ft:
        return _run_elastic(ctx, config, model, dataset, observer, started)
    role = start(ctx, model.param_specs(), lambda: model.init_params(config.seed),
                 servers=config.servers, consistency=Consistency(config.consistency, config.staleness),
                 optimizer=config.optimizer, lr=config.lr)
    if isinstance(role, Server):
        role.serve()
        return _result(ctx, config, model, dataset, role.layout, role.state, None, started)
    run = WorkerLoop(role, config, model, dataset, ctx).run(ctx, observer)
    return _result(ctx, config, model, dataset, role.layout, None, run, started)


def _run_elastic(ctx: Context, config: TrainConfig, model: Model, dataset: Dataset,
                 observer: Optional[Any], started: float) -> Dict[str, Any]:
    from ..ft.ps_elastic import ElasticPS
    from ..train.observe import Observer
    if observer is None:
        observer = Observer(ctx, config, verbose=False, reporter=config.servers)
    elastic = ElasticPS(ctx, config, model, dataset, observer)
    elastic.run()
    loop = elastic.worker_loop
    mine = None if loop is None else (loop.worker.id, len(loop.pushed), elastic.lost_updates)
    layout = elastic.layout
    made = np.full(layout.slot_count, -1, np.int64)
    lost = np.full(layout.slot_count, -1, np.int64)
    for slot, count, missing in filter(None, ctx.comm.allgather(mine)):
        made[slot], lost[slot] = count, missing
    return _result(ctx, config, model, dataset, layout, elastic.state, loop.result if loop else None, started,
                   recovery=ctx.comm.bcast(elastic.events.as_dicts(), root=0),
                   ps_extra={"ids": list(elastic.members.ids), "worker_slots": list(layout.worker_slots),
                             "made_per_worker": made.tolist(), "updates_lost_per_worker": lost.tolist()})


def _result(ctx: Context, config: TrainConfig, model: Model, dataset: Dataset, layout: Layout,
            state: Optional[ShardState], run: Optional[WorkerLog], started: float, *,
            ps_extra: Optional[Dict[str, Any]] = None, **extra: Any) -> Dict[str, Any]:
    """The end of a run on every rank: failures reported everywhere, per-step metrics summed,
    parameters assembled and evaluated, the servers' counters merged."""
    steps = config.steps
    if run is None:
        failure, stats, wall = None, np.zeros((steps, 3)), np.zeros(steps + 1)
        traffic = server_traffic(state, steps) if state is not None else [[0, 0]] * steps
    else:
        failure, stats = run.failure, run.stats.copy()
        traffic, wall = _worker_traffic_and_wall(run.log, steps)
        wall[-1] = time.perf_counter() - started
    failures = [text for text in ctx.comm.allgather(failure) if text]
    if failures:
        raise PSTrainingError("; ".join(failures))
    ctx.comm.Allreduce(MPI.IN_PLACE, stats, op=MPI.SUM)
    ctx.comm.Allreduce(MPI.IN_PLACE, wall, op=MPI.MAX)
    params = assemble_params(ctx.comm, layout, state)
    merged = merge_summaries(ctx.comm.allgather(state.summary() if state else None), layout.slot_count)
    per_rank = ctx.comm.allgather(traffic)
    loss, accuracy = evaluate(ctx, model, params, dataset)

    rows = StepLog(ctx, steps)
    rows.rows = [{"step": t + 1, "loss": float(s[0] / max(s[2], 1.0)),
                  "accuracy": float(s[1] / max(s[2], 1.0)), "examples": int(s[2]),
                  "wall_s": round(float(wall[t]), 6)} for t, s in enumerate(stats)]
    pushes = {**merged["pushes"], **{k: v for k, v in (ps_extra or {}).items() if k.endswith("_per_worker")}}
    return build_result(
        config=config, ctx=ctx, workers=layout.workers, model=model, dataset=dataset, log=rows,
        traffic={"bytes_sent": [[cell[0] for cell in rank] for rank in per_rank],
                 "bytes_received": [[cell[1] for cell in rank] for rank in per_rank]},
        staleness=merged["staleness"], loss=loss, accuracy=accuracy,
        params_checksum=checksum(params), train_s=float(wall[-1]),
        wall_s=time.perf_counter() - started,
        ps={"consistency": config.consistency, "staleness_bound": config.staleness,
            "fetch_every": config.fetch_every, "push_every": config.push_every,
            "server_ranks": sorted(layout.shard_ranks.values()),
            "pieces": {spec.name: [[p.shard, p.start, p.stop] for p in layout.placement.pieces[t]]
                       for t, spec in enumerate(layout.specs) if not spec.sparse},
            "pushes": pushes,
            **{k: v for k, v in (ps_extra or {}).items() if not k.endswith("_per_worker")}},
        params=params, **extra)


def _worker_traffic_and_wall(log: StepLog, steps: int) -> Tuple[List[List[int]], np.ndarray]:
    """A worker's [sent, received] bytes and end time of each step (zeros for steps it did
    not reach), and a last slot for the whole run's time."""
    done = len(log.rows)
    traffic = [[sent, received] for sent, received in zip(log.bytes_sent, log.bytes_received)]
    wall = np.zeros(steps + 1)
    wall[:done] = [row["wall_s"] for row in log.rows]
    return traffic + [[0, 0]] * (steps - done), wall

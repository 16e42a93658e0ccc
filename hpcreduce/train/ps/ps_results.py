"""The result of a PS run on every rank: failures reported everywhere, per-step metrics summed,
parameters evaluated and checksummed shard by shard (``final``), the servers' counters merged,
the trained model written sharded (``--model-dir``), as ``train.results.TrainResult``. In
``--mode hybrid`` the dense parameters are the first worker's replica, and ``ps.hybrid`` has
every live worker's checksum of its replica (``dense_replica.dense_summary``)."""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ...errors import PSTrainingError
from ...ps.gather import gather_dense
from ...ps.layout import Layout
from ...ps.shard_state import ShardState
from ...ps.stats import RequestLoad, load_summary, merge_summaries, server_traffic
from ...runtime.context import Context
from ..results import FinalMetrics, StepLog, TrainResult
from .dense_replica import dense_summary
from .export import save_model
from .final import evaluate_sharded, final_params, memory_report, sharded_checksum
from .loop import WorkerLog
from .ps_setup import PSSetup


def ps_result(ctx: Context, setup: PSSetup, layout: Layout, state: Optional[ShardState],
              worker_log: Optional[WorkerLog], started: float, *,
              placement: List[Dict[str, Any]], recovery: Optional[List[Dict[str, Any]]] = None,
              pushes_extra: Optional[Dict[str, Any]] = None, ps_extra: Optional[Dict[str, Any]] = None,
              load: Optional[RequestLoad] = None, first_step: int = 0) -> TrainResult:
    """The end of a run on every rank: failures reported everywhere, per-step metrics summed,
    parameters evaluated and checksummed shard by shard, the servers' counters merged.
    ``first_step``: the steps before it were trained by an earlier launch (a resume): the
    per-step rows and traffic start after it."""
    config, model, dataset, ps = setup.config, setup.model, setup.dataset, setup.ps
    steps = config.steps
    if worker_log is None:
        failure, stats, wall = None, np.zeros((steps, 3)), np.zeros(steps + 1)
        traffic = server_traffic(state, steps) if state is not None else [[0, 0]] * steps
    else:
        failure, stats = worker_log.failure, worker_log.stats.copy()
        traffic, wall = _worker_traffic_and_wall(worker_log.log, steps, first_step)
        wall[-1] = time.perf_counter() - started
    if worker_log is not None and worker_log.replica is not None:
        worker_log.replica.close()  # the workers' reductions are over
    failures = [text for text in ctx.comm.allgather(failure) if text]
    if failures:
        raise PSTrainingError("; ".join(failures))
    ctx.comm.Allreduce(MPI.IN_PLACE, stats, op=MPI.SUM)
    ctx.comm.Allreduce(MPI.IN_PLACE, wall, op=MPI.MAX)
    hybrid = config.mode == "hybrid"
    if hybrid:
        dense, replicas = dense_summary(ctx, layout, worker_log.replica if worker_log else None)
        ps_extra = {**(ps_extra or {}), "hybrid": replicas}
    else:
        dense = gather_dense(ctx.comm, layout, state)
    merged = merge_summaries(ctx.comm.allgather(state.summary() if state else None), layout.slot_count)
    per_rank = ctx.comm.allgather(traffic[first_step:])
    loss, accuracy = evaluate_sharded(ctx, model, dataset, layout, state, dense)
    final = FinalMetrics(loss, accuracy, sharded_checksum(ctx.comm, layout, state, dense if hybrid else {}))
    params = final_params(ctx.comm, layout, state, dense)
    if ps.model_dir:
        save_model(ctx.comm, ps.model_dir, layout, state, setup.identity, steps, dense if hybrid else None)
    rows = [{"step": t + 1, "loss": float(s[0] / max(s[2], 1.0)), "accuracy": float(s[1] / max(s[2], 1.0)),
             "examples": int(s[2]), "wall_s": round(float(wall[t]), 6)}
            for t, s in enumerate(stats) if t >= first_step]
    return TrainResult(
        config=config, model=model.name, ranks=ctx.size, worker_count=layout.worker_count, dataset=dataset.info(),
        steps=rows, staleness=merged["staleness"],
        traffic={"bytes_sent": [[cell[0] for cell in rank] for rank in per_rank],
                 "bytes_received": [[cell[1] for cell in rank] for rank in per_rank]},
        wall_s=time.perf_counter() - started, train_s=float(wall[-1]),
        final=final, params=params, recovery=recovery,
        memory=memory_report(ctx.comm, "server" if state is not None else "worker"),
        ps={"consistency": ps.consistency, "staleness_bound": ps.staleness,
            "fetch_every": ps.fetch_every, "push_every": ps.push_every,
            "server_ranks": sorted(layout.shard_ranks.values()), "placement": placement,
            "pieces": {spec.name: [[p.shard, p.start, p.stop] for p in layout.placement.pieces[t]]
                       for t, spec in enumerate(layout.specs) if not spec.sparse},
            "pushes": {**merged["pushes"], **(pushes_extra or {})},
            **({"dynamic_rows": merged["dynamic_rows"]} if "dynamic_rows" in merged else {}),
            **_load(ctx, load, steps, first_step), **(ps_extra or {})})


def _load(ctx: Context, load: Optional[RequestLoad], steps: int, first_step: int) -> Dict[str, Any]:
    """``ps.load`` (the servers' requests, bytes and CPU seconds per step from ``first_step``
    on, ``ps.stats.load_summary``) when the servers counted it."""
    mine = (ctx.rank, (load.per_step(steps)[first_step:], load.cpu_per_step(steps)[first_step:])) \
        if load is not None else None
    per_server = dict(filter(None, ctx.comm.allgather(mine)))
    return {"load": load_summary({rank: cells for rank, (cells, _) in per_server.items()},
                                 {rank: cpu for rank, (_, cpu) in per_server.items()})} if per_server else {}


def _worker_traffic_and_wall(log: StepLog, steps: int, first_step: int) -> Tuple[List[List[int]], np.ndarray]:
    """A worker's [sent, received] bytes and end time of each step (zeros for steps it did
    not reach; its log starts at ``first_step``), and a last slot for the whole run's time."""
    done = len(log.rows)
    traffic = [[sent, received] for sent, received in zip(log.bytes_sent, log.bytes_received)]
    wall = np.zeros(steps + 1)
    wall[first_step:first_step + done] = [row["wall_s"] for row in log.rows]
    return [[0, 0]] * first_step + traffic + [[0, 0]] * (steps - first_step - done), wall

"""``run_ps_training``: train a model with parameter servers (``hpcreduce train --mode ps``).

Ranks 0..K-1 serve the model's shards (``hpcreduce.ps``; each server makes only its own
part: ``final.part_init``), the others run ``loop.WorkerLoop``; when every worker has
released them the servers stop, and all ranks together evaluate the final parameters on
the held-out split, each rank with the rows its share touches, and checksum them shard by
shard (``final``: no rank assembles a model above ``final.WHOLE_BYTES``), and build the
same result as the ring trainer (``train.results``), plus ``memory`` (each rank's peak RSS
and role) and ``ps``: the layout, the push counters per worker
slot (applied, duplicate, refused) and the refusal reasons. ``staleness`` holds the
measured read staleness and update lag histograms. With fault tolerance, ``ps.pushes``
adds ``made_per_worker`` (pieces each live worker had acknowledged, by slot; -1 for a
worker that is gone) and ``updates_lost_per_worker``, ``ps.ids`` the stable id of every
rank and ``ps.worker_slots`` the live workers' slots; ``ps.placement`` says where each shard
lived at the start: its primary's rank and node and (with fault tolerance, K > 1) its replica's; ``recovery`` lists the recovery
events (rank 0's, a server: it times the next step). Without ULFM but with a checkpoint folder
(``fallback``) the run resumes from the latest complete checkpoint: ``recovery`` then holds the
``resume`` event, the per-step rows, traffic and push counters cover the resumed steps, and
``ps.pushes.made_per_worker`` the pieces each worker had acknowledged.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ...errors import PSConfigError, PSTrainingError
from ...ft.watchdog import watchdog
from ...ps import Consistency, Server, Worker, start
from ...ps.gather import gather_dense
from ...ps.layout import Layout
from ...ps.optimizers import make_optimizer
from ...ps.shard_state import ShardState
from ...ps.stats import RequestLoad, load_summary, merge_summaries, server_traffic
from ...runtime.context import Context
from ...runtime.nodes import rank_nodes
from ..config import TrainConfig
from ..data import Dataset
from ..model import Model
from ..observe import Observer
from ..results import FinalMetrics, StepLog, TrainResult
from .ps_driver import ElasticPS
from .fallback import Fallback
from ..identity import run_identity
from .export import save_model
from .final import evaluate_sharded, final_params, memory_report, part_init, sharded_checksum
from .loop import WorkerLog, WorkerLoop


def run_ps_training(ctx: Context, config: TrainConfig, model: Model, dataset: Dataset,
                    observer: Optional[Observer] = None) -> TrainResult:
    """Train on every rank of ``ctx`` (collective); returns the result on every rank, with
    the final parameters in ``params`` (whole, as the ring trainer gives them, up to
    ``final.WHOLE_BYTES``; else this rank's part).

    ``observer`` (optional) gets every step of the first worker (its share) for progress
    and metrics, and times its phases. Bad settings raise ``PSConfigError`` on every rank
    before anything starts; a failure during training raises ``PSTrainingError`` on every
    rank after the servers stopped. With fault tolerance (``ctx.ft``) the run survives
    dead ranks and grows (``elastic``); the result then also has ``recovery``. Without it, a
    checkpoint folder makes the run resume from its checkpoints when relaunched (``fallback``).
    """
    problems = dataclasses.replace(config, mode="ps").problems(ctx.size, ctx.ft)
    if problems:
        raise PSConfigError(problems)
    started = time.perf_counter()
    if ctx.ft:
        return _run_elastic(ctx, config, model, dataset, observer, started)
    nodes = rank_nodes(ctx.comm)
    watchdog.deadline_s = config.fault.deadline_s  # --deadline: a hung peer ends the job, with or without --ft
    if config.fault.checkpoint_dir:
        return _run_fallback(ctx, config, model, dataset, observer, started, nodes)
    specs = model.param_specs()
    role = start(specs, part_init(model, config.seed, specs), servers=config.servers,
                 consistency=Consistency(config.consistency, config.staleness),
                 optimizer=config.optimizer, lr=config.lr, comm=ctx, guard=watchdog.guard)
    placement = role.layout.homes(nodes, replicated=False)
    if isinstance(role, Server):
        role.serve()
        return _result(ctx, config, model, dataset, role.layout, role.state, None, started, placement=placement,
                       load=role.load)
    role.wire_dtype = None if config.wire_dtype == "float32" else np.dtype(config.wire_dtype)
    loop = WorkerLoop(role, config, model, dataset, ctx)
    hangs = config.fault.schedule(config.seed)  # without --ft or a checkpoint folder only hangs (``:hang``)
    loop.before_step = lambda step: hangs.strike("step", step, ctx.rank, range(ctx.size))
    run = loop.run(ctx, observer)
    return _result(ctx, config, model, dataset, role.layout, None, run, started, placement=placement)


def _run_fallback(ctx: Context, config: TrainConfig, model: Model, dataset: Dataset, observer: Optional[Observer],
                  started: float, nodes: List[str]) -> TrainResult:
    """Without ULFM, with a checkpoint folder: resumed from its latest complete checkpoint,
    checkpointed as it goes, killed where asked (``fallback``)."""
    fallback = Fallback(ctx, config, model, dataset, observer or Observer(ctx, config, verbose=False,
                                                                          reporter=config.servers))
    role = fallback.start(nodes)
    placement = role.layout.homes(nodes, replicated=False)
    loop = None
    if isinstance(role, Worker):
        role.wire_dtype = None if config.wire_dtype == "float32" else np.dtype(config.wire_dtype)
        loop = fallback.loop(role)
        loop.run(ctx, observer)
        loop.ledger.close()
    else:
        role.serve()
    mine = (loop.worker.slot, len(loop.pushed)) if loop else None
    made = np.full(role.layout.slot_count, -1, np.int64)
    for slot, count in filter(None, ctx.comm.allgather(mine)):
        made[slot] = count
    return _result(ctx, config, model, dataset, role.layout, None if loop else role.state, loop.result if loop else None,
                   started, placement=placement, recovery=fallback.recovery(), first_step=fallback.first_step,
                   pushes_extra={"made_per_worker": made.tolist()}, load=None if loop else role.load)


def _run_elastic(ctx: Context, config: TrainConfig, model: Model, dataset: Dataset,
                 observer: Optional[Observer], started: float) -> TrainResult:
    if observer is None:
        observer = Observer(ctx, config, verbose=False, reporter=config.servers)
    elastic = ElasticPS(ctx, config, model, dataset, observer)
    elastic.run()
    loop = elastic.worker_side.loop_or_former
    mine = None if loop is None else (loop.worker.slot, len(loop.pushed), elastic.worker_side.lost_updates)
    layout = elastic.layout
    made = np.full(layout.slot_count, -1, np.int64)
    lost = np.full(layout.slot_count, -1, np.int64)
    for slot, count, missing in [*filter(None, ctx.comm.allgather(mine)), *elastic.departed]:  # departed: left
        made[slot], lost[slot] = count, missing
    placement = next(filter(None, ctx.comm.allgather(elastic.placement)), [])  # the founders know it
    return _result(ctx, config, model, dataset, layout, elastic.holdings.own, loop.result if loop else None,
                   started, placement=placement, recovery=ctx.comm.bcast(elastic.events.as_dicts(), root=0),
                   pushes_extra={"made_per_worker": made.tolist(), "updates_lost_per_worker": lost.tolist()},
                   ps_extra={"ids": list(elastic.members.ids), "worker_slots": list(layout.worker_slots)})


def _result(ctx: Context, config: TrainConfig, model: Model, dataset: Dataset, layout: Layout,
            state: Optional[ShardState], run: Optional[WorkerLog], started: float, *,
            placement: List[Dict[str, Any]], recovery: Optional[List[Dict[str, Any]]] = None, pushes_extra: Optional[Dict[str, Any]] = None,
            ps_extra: Optional[Dict[str, Any]] = None, load: Optional[RequestLoad] = None,
            first_step: int = 0) -> TrainResult:
    """The end of a run on every rank: failures reported everywhere, per-step metrics summed,
    parameters evaluated and checksummed shard by shard, the servers' counters merged.
    ``first_step``: the steps before it were trained by an earlier launch (a resume): the
    per-step rows and traffic start after it."""
    steps = config.steps
    if run is None:
        failure, stats, wall = None, np.zeros((steps, 3)), np.zeros(steps + 1)
        traffic = server_traffic(state, steps) if state is not None else [[0, 0]] * steps
    else:
        failure, stats = run.failure, run.stats.copy()
        traffic, wall = _worker_traffic_and_wall(run.log, steps, first_step)
        wall[-1] = time.perf_counter() - started
    failures = [text for text in ctx.comm.allgather(failure) if text]
    if failures:
        raise PSTrainingError("; ".join(failures))
    ctx.comm.Allreduce(MPI.IN_PLACE, stats, op=MPI.SUM)
    ctx.comm.Allreduce(MPI.IN_PLACE, wall, op=MPI.MAX)
    dense = gather_dense(ctx.comm, layout, state)
    merged = merge_summaries(ctx.comm.allgather(state.summary() if state else None), layout.slot_count)
    per_rank = ctx.comm.allgather(traffic[first_step:])
    loss, accuracy = evaluate_sharded(ctx, model, dataset, layout, state, dense)
    final = FinalMetrics(loss, accuracy, sharded_checksum(ctx.comm, layout, state))
    params = final_params(ctx.comm, layout, state, dense)
    if config.model_dir:
        save_model(ctx.comm, config.model_dir, layout, state, run_identity(config, model, make_optimizer(config.optimizer, config.lr)),
                   steps)
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
        ps={"consistency": config.consistency, "staleness_bound": config.staleness,
            "fetch_every": config.fetch_every, "push_every": config.push_every,
            "server_ranks": sorted(layout.shard_ranks.values()), "placement": placement,
            "pieces": {spec.name: [[p.shard, p.start, p.stop] for p in layout.placement.pieces[t]]
                       for t, spec in enumerate(layout.specs) if not spec.sparse},
            "pushes": {**merged["pushes"], **(pushes_extra or {})}, **_load(ctx, load, steps, first_step), **(ps_extra or {})})


def _load(ctx: Context, load: Optional[RequestLoad], steps: int, first_step: int) -> Dict[str, Any]:
    """``ps.load`` (the servers' requests and bytes per step from ``first_step`` on,
    ``ps.stats.load_summary``) when the servers counted it."""
    mine = (ctx.rank, load.per_step(steps)[first_step:]) if load is not None else None
    per_server = dict(filter(None, ctx.comm.allgather(mine)))
    return {"load": load_summary(per_server)} if per_server else {}


def _worker_traffic_and_wall(log: StepLog, steps: int, first_step: int) -> Tuple[List[List[int]], np.ndarray]:
    """A worker's [sent, received] bytes and end time of each step (zeros for steps it did
    not reach; its log starts at ``first_step``), and a last slot for the whole run's time."""
    done = len(log.rows)
    traffic = [[sent, received] for sent, received in zip(log.bytes_sent, log.bytes_received)]
    wall = np.zeros(steps + 1)
    wall[first_step:first_step + done] = [row["wall_s"] for row in log.rows]
    return [[0, 0]] * first_step + traffic + [[0, 0]] * (steps - first_step - done), wall

"""``run_ps_training``: train a model with parameter servers (``hpcreduce train --mode ps``).

Ranks 0..K-1 serve the model's shards (``hpcreduce.ps``; each server makes only its own
part: ``params.part_init``), the others run ``loop.WorkerLoop``; when every worker has
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

import time
from typing import Callable, List, Optional

import numpy as np

from ...ft.watchdog import watchdog
from ...ps import Server, Worker, start
from ...runtime.context import Context
from ...runtime.nodes import rank_nodes
from ..config import TrainConfig
from ..data import Dataset
from ..model import Model
from ..observe import Observer
from ..params import part_init
from ..results import TrainResult
from .fallback import Fallback
from .live_lines import ShareLines
from .loop import WorkerLoop
from .ps_driver import PSDriver
from .ps_results import ps_result
from .ps_setup import PSSetup
from .stop_point import StopPoint, agreed, save_stop


def run_ps_training(ctx: Context, config: TrainConfig, model: Model, dataset: Dataset,
                    observer: Optional[Observer] = None) -> TrainResult:
    """Train on every rank of ``ctx`` (collective); returns the result on every rank, with
    the final parameters in ``params`` (whole, as the ring trainer gives them, up to
    ``final.WHOLE_BYTES``; else this rank's part).

    ``observer`` (optional) gets every step of the first worker (its share) for progress
    and metrics, and times its phases. Bad settings raise ``PSConfigError`` on every rank
    before anything starts; a failure during training raises ``PSTrainingError`` on every
    rank after the servers stopped. With fault tolerance (``ctx.ft``) the run survives
    dead ranks and grows (``ps_driver``); the result then also has ``recovery``. Without it, a
    checkpoint folder makes the run resume from its checkpoints when relaunched (``fallback``).
    With or without it a stop signal stops every worker after the same step, checkpoints it and
    raises ``StoppedEarly`` on every rank (``stop_point``).
    """
    setup = PSSetup.of(config, model, dataset, ctx.size, ctx.ft)
    started = time.perf_counter()
    observer = observer or Observer(ctx, config, verbose=False, reporter=config.servers)
    if config.mode == "ps":
        observer.lines_rank = 0  # the first server writes the metrics lines (ranks 0..K-1 serve at the start)
    if ctx.ft:
        return _run_elastic(ctx, setup, observer, started)
    watchdog.deadline_s = config.fault.deadline_s  # --deadline: a hung peer ends the job, with or without --ft
    if config.fault.checkpoint_dir:
        return _run_fallback(ctx, setup, observer, started)
    nodes, ps = rank_nodes(ctx.comm), setup.ps
    specs = setup.tables.specs
    role = start(specs, part_init(model, config.seed, specs), servers=ps.servers, consistency=setup.tables.consistency,
                 optimizer=config.optimizer, lr=config.lr, comm=ctx, guard=watchdog.guard, wire_dtype=ps.wire_dtype)
    placement = role.layout.homes(nodes, replicated=False)
    stop = StopPoint(ctx.comm, role.layout.worker_ranks)
    if isinstance(role, Server):
        lines = _lines(observer, config.steps)

        def progress(server: Server, slowest: int) -> None:
            if lines is not None:
                lines(server, slowest)
            stop.tell()
        role.on_progress = progress
        role.serve()
        _stop_here(ctx, setup, stop, role, None)
        return ps_result(ctx, setup, role.layout, role.state, None, started, placement=placement, load=role.load)
    loop = WorkerLoop(role, config, model, dataset, ctx)
    hangs = config.fault.schedule(config.seed)  # without --ft or a checkpoint folder only hangs (``:hang``)
    loop.before_step = lambda step: hangs.strike("step", step, ctx.rank, range(ctx.size))
    loop.stop = stop
    loop.run(ctx, observer)
    _stop_here(ctx, setup, stop, None, loop)
    return ps_result(ctx, setup, role.layout, None, loop.result, started, placement=placement)


def _stop_vote(stop: StopPoint, loop: Optional[WorkerLoop]) -> int:
    """This rank's vote on where the run stopped (``StopPoint.vote``)."""
    return stop.vote(None if loop is None else loop.step, failed=loop is not None and loop.result.failure is not None)


def _stop_here(ctx: Context, setup: PSSetup, stop: StopPoint, server: Optional[Server],
               loop: Optional[WorkerLoop], votes: Optional[List[int]] = None) -> None:
    """Collective (unless every rank's ``votes`` came with an exchange already made): when a stop
    signal stopped the workers, the servers checkpoint the step they stopped after and every
    rank raises ``StoppedEarly`` (``stop_point``); else nothing."""
    step = agreed(ctx.comm.allgather(_stop_vote(stop, loop)) if votes is None else votes)
    if step is not None:
        first = loop is not None and loop.worker.index == 0
        save_stop(ctx.comm, setup.config, server, step, setup.identity,
                  setup.tables.consistency.aggregates, loop.replica if first else None)


def _run_fallback(ctx: Context, setup: PSSetup, observer: Observer, started: float) -> TrainResult:
    """Without ULFM, with a checkpoint folder: resumed from its latest complete checkpoint,
    checkpointed as it goes, killed where asked (``fallback``)."""
    nodes = rank_nodes(ctx.comm)
    fallback = Fallback(ctx, setup, observer)
    fallback.progress.on_server = _lines(observer, setup.config.steps, fallback.first_step)
    role = fallback.start(nodes)
    placement = role.layout.homes(nodes, replicated=False)
    loop = None
    stop = StopPoint(ctx.comm, role.layout.worker_ranks)
    if isinstance(role, Worker):
        loop = fallback.loop(role)
        loop.stop = stop
        loop.run(ctx, observer)
        loop.ledger.close()
    else:
        progress = role.on_progress
        role.on_progress = lambda server, slowest: (stop.tell(), progress(server, slowest))
        role.serve()
    _stop_here(ctx, setup, stop, None if loop else role, loop)
    mine = (loop.worker.slot, len(loop.pushed)) if loop else None
    made = np.full(role.layout.slot_count, -1, np.int64)
    for slot, count in filter(None, ctx.comm.allgather(mine)):
        made[slot] = count
    return ps_result(ctx, setup, role.layout, None if loop else role.state, loop.result if loop else None,
                     started, placement=placement, recovery=fallback.recovery(), first_step=fallback.first_step,
                     pushes_extra={"made_per_worker": made.tolist()}, load=None if loop else role.load)


def _run_elastic(ctx: Context, setup: PSSetup, observer: Observer, started: float) -> TrainResult:
    driver = PSDriver(ctx, setup, observer)
    driver.progress.on_server = _lines(observer, setup.config.steps, driver.epoch.resume_mark)  # from a resume's step
    driver.run()
    epoch = driver.epoch
    loop = epoch.worker.loop_or_former
    mine = None if loop is None else (loop.worker.slot, len(loop.pushed), epoch.worker.lost_updates)
    # the stop's agreement rides in this allgather: one collective less before MPI_Finalize, which
    # (Open MPI 5.0.11) left a rank spawned into a shrunk world spinning for 30 s after another one
    gathered = ctx.comm.allgather((_stop_vote(driver.stop, epoch.worker.loop), mine, driver.first_step))
    _stop_here(ctx, setup, driver.stop, driver.server, epoch.worker.loop, votes=[vote for vote, _, _ in gathered])
    layout = epoch.layout
    made = np.full(layout.slot_count, -1, np.int64)
    lost = np.full(layout.slot_count, -1, np.int64)
    for slot, count, missing in [*filter(None, (part for _, part, _ in gathered)), *epoch.departed]:  # departed: left
        made[slot], lost[slot] = count, missing
    placement = next(filter(None, ctx.comm.allgather(driver.placement)), [])  # the founders know it
    return ps_result(ctx, setup, layout, epoch.holdings.own, loop.result if loop else None,
                     started, placement=placement, recovery=ctx.comm.bcast(driver.events.as_dicts(), root=0),
                     first_step=max(first for _, _, first in gathered),  # a resume's steps before it: not listed
                     pushes_extra={"made_per_worker": made.tolist(), "updates_lost_per_worker": lost.tolist()},
                     ps_extra={"ids": list(epoch.members.ids), "worker_slots": list(layout.worker_slots)})


def _lines(observer: Observer, steps: int, first_step: int = 0) -> Optional[Callable[[Server, int], None]]:
    """ps mode: the servers' hook writing the live metrics lines (``live_lines``); else None."""
    return ShareLines(observer, steps, first_step).on_progress if observer.lines_rank is not None else None

"""PS training without ULFM: shard checkpoints, injected kills, and resuming a relaunched job.

``hpcreduce train --mode ps --checkpoint-dir D --checkpoint-every E [--restarts R] [--kill ...]``
without ``--ft``: a death ends the job (mpirun aborts it) and ``--restarts`` relaunches it.
Every launch, before training:

1. refuses a folder holding another run's checkpoints, on every rank (``shard_checkpoints.refuse_foreign``);
2. rank 0 finds the latest complete checkpoint C (every shard of its placement wrote it and it
   reads back whole), counts the acknowledged pushes it lacks from the workers' push ledgers
   (``ledger``), removes the checkpoints newer than C (never complete) and the ledgers, and
   broadcasts C;
3. each server builds its shard of the *current* placement from checkpoint C, whatever K and
   the worker count were when it was written (``shard_checkpoints.restore_shard``): values, optimizer
   state and table versions; counters, staleness histograms and traffic start at zero (they
   count the resumed part);
4. every worker starts at the same step: the global batch of a step does not depend on the
   number of workers (``partition``), so under BSP the resumed run computes the same steps as
   one never killed (from C), up to summation order. Under ASP/SSP the checkpoint also holds
   pushes that faster workers made past C, and no push is applied twice: with the same servers
   and workers as the run that wrote C, every worker starts at C and the shards keep C's record
   of each slot's last push, so a piece they already hold answers DUPLICATE (and is not counted
   as made again); with other servers or workers (a slot is then another share of the batch)
   every worker starts after the last step any slot had pushed into C, whose slower shares are
   skipped, never applied twice (``resume_point``).

While training, servers write their shard every E steps in parallel and atomically, and kills
fire as with ``--ft`` (``progress``; only in a launch's first attempt). A resume is
a ``recovery`` event of kind ``resume``: ``checkpoint_step`` C, ``updates_lost``,
``ranks_before`` (of the run that wrote C), ``restore_s`` (until every server rebuilt its shard),
``next_step_at`` (wall clock: when every worker had completed a step after resuming) and
``data_shards``.
In ``--mode hybrid`` the first worker also writes the dense replica at those steps and every
worker loads it on a resume (``dense_checkpoints``).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Sequence, Union

from ...ft.events import EventLog
from ...ft.membership import Membership
from ...ft.watchdog import watchdog
from ...ps.roles import initial_layout, make_role
from ...ps.server import Server
from ...ps.worker import Worker
from ...runtime.context import Context
from ..observe import Observer
from ..partition import assignment
from . import shard_checkpoints
from .dense_checkpoints import load_dense, save_when_due
from .final import initial_shards
from .ledger import LedgeredLoop, PushLedger
from .progress import PSKills, ShardCheckpoints, StepProgress
from .ps_setup import PSSetup
from .ps_recovery import PSRecoveryEvent
from .resume_point import Resume


class Fallback:
    """Checkpoints, kills and the resume of one rank of a PS run without ULFM (collective to make)."""

    def __init__(self, ctx: Context, setup: PSSetup, observer: Observer):
        self.ctx, self.setup, self.echo, self.output_failed = ctx, setup, observer.echo, observer.output_failed
        self.events = EventLog()
        self.started = time.time()  # a resume's event counts from here
        shard_checkpoints.refuse_foreign(ctx.comm, setup.fault.checkpoint_dir, setup.identity)
        self.resume = Resume.find(ctx, setup)
        self.first_step = self.resume.first_step
        schedule = setup.fault.schedule(setup.config.seed, protected=(0, setup.ps.servers))
        self.progress = StepProgress(PSKills(schedule, self.first_step),
                                     ShardCheckpoints(setup, observer.output_failed, self.first_step),
                                     self.events, observer.echo)
        self.members = Membership.founding(ctx.size, ctx.rank)

    def start(self, nodes: Sequence[str]) -> Union[Server, Worker]:
        """This rank's server (its shard restored from the resume point, else initial) or worker."""
        ctx, setup, resume = self.ctx, self.setup, self.resume
        layout = initial_layout(ctx, setup.tables, setup.ps.servers, nodes)
        restored = time.time()

        def shard(key: int) -> List[Any]:
            return [resume.shard(setup, layout, key)] if resume.point else initial_shards(setup, layout, [key])
        role = make_role(ctx, layout, setup.tables, shard, guard=watchdog.guard, clock=self.first_step,
                         on_progress=lambda server, slowest: self.progress.server_progress(
                             server, slowest, self.first_step, self.members),
                         wire_dtype=setup.ps.wire_dtype)
        if resume.point is not None:
            self.events.add(resumed_event(ctx, setup, resume, layout.worker_ranks, sorted(layout.shard_ranks),
                                          time.time() - restored, self.started, self.echo))
        return role

    def loop(self, worker: Worker) -> LedgeredLoop:
        """The worker's loop from the resume step, logging its acknowledged pushes."""
        setup, resume = self.setup, self.resume
        loop = LedgeredLoop(worker, setup.config, setup.model, setup.dataset, self.ctx)
        loop.ledger = PushLedger(setup.fault.checkpoint_dir, worker.slot, self.first_step, self.output_failed)
        loop.step = self.first_step
        loop.duplicates_until = resume.point.pushed_until if resume.keep_pushes else 0
        loop.before_step = lambda step: self._before_step(loop, step)
        loop.after_steps = lambda done: self._dense_checkpoint(loop, done + 1)
        if loop.replica is not None and resume.point is not None:
            load_dense(setup.fault.checkpoint_dir, resume.point.step, loop.replica)
        return loop

    def _before_step(self, loop: LedgeredLoop, step: int) -> None:
        """Kills; in hybrid the first worker writes the dense replica at the servers' checkpoint steps."""
        self.progress.worker_step(step, self.members)
        self._dense_checkpoint(loop, step)

    def _dense_checkpoint(self, loop: LedgeredLoop, step: int) -> None:
        """Hybrid: the dense replica of step ``step - 1`` when the servers checkpoint that step."""
        fault = self.setup.fault
        if loop.replica is not None:
            save_when_due(fault.checkpoint_dir, step, loop.replica, loop.worker.index, fault.checkpoint_every,
                          self.first_step, self.setup.identity, fault.checkpoint_keep)

    def recovery(self) -> List[Dict[str, Any]]:
        """The events as rank 0 (a server: it closed them) has them (collective)."""
        return self.ctx.comm.bcast(self.events.as_dicts(), root=0)


def resumed_event(ctx: Context, setup: PSSetup, resume: Resume, workers: Sequence[int], keys: List[int],
                  restore_s: float, started: float, echo: Callable[[str], None]) -> PSRecoveryEvent:
    """The ``resume`` event of a launch that resumed from ``resume.point`` (said on rank 0 by ``echo``)."""
    point = resume.point
    event = PSRecoveryEvent("resume", resume.first_step + 1, point.servers + point.workers, started)
    event.ranks_after = ctx.size
    event.restore_s = restore_s
    event.checkpoint_step, event.updates_lost = point.step, point.updates_lost
    event.shards_restored = keys
    event.restart_step = point.step + 1 if setup.tables.consistency.aggregates else None
    event.data_shards = assignment(list(workers), setup.train_shards)
    echo(f"resumed from the checkpoint of step {point.step} (written by {point.servers} server(s) and "
         f"{point.workers} worker(s), now {len(keys)} and {len(workers)}); "
         f"{point.updates_lost} acknowledged updates lost")
    return event

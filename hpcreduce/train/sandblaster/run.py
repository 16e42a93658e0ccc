"""One rank's part of a Sandblaster run, through failures (``--ft``): roles, kills, recovery.

Every rank plays its role (server, coordinator or worker, ``hpcreduce.sandblaster``) until the
coordinator stops the run. With ``--ft`` the whole run is one ``ft.rounds.attempt``: a
process failure anywhere makes the ranks that see it revoke the communicator, so every
rank leaves its role and the attempt fails on all; the survivors then shrink (servers
keep their order, so they stay first) and re-derive the roles: the surviving servers, a
dead server's slices now served by their replica holders (``placement``), the
coordinator at rank K' (a worker promoted if the coordinator died), the rest workers. The
coordinator's committed state comes from the servers' records (the newest any server
holds, given to every server), and the run starts again from it: the iteration that was
in progress is redone from its committed point, with new passes, so a dead worker's
units go to the others and its partial pushes are dropped with their pass: every unit is
counted once. Kills (``--kill R@S``) fire when rank R first sees iteration S's passes.
Cost while nothing fails: one ``Agree`` at the end (plus the replicas: see ``placement``).
A stop signal ends the run after a commit, and a run started again over its checkpoint folder
resumes from there (``stop_resume``).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import numpy as np
from mpi4py import MPI

from ...ft.events import EventLog, RecoveryEvent
from ...ft.membership import Membership
from ...ft.rounds import attempt
from ...ft.watchdog import watchdog
from ...runtime.context import Context
from ...runtime.failures import abandon
from ...sandblaster.record import Committed
from ...sandblaster.server import ServerState, serve
from ..config import TrainConfig
from ..data import Dataset
from ..model import Model
from ..observe import Observer
from ..results import StepLog
from . import sandblaster_roles
from .flat import FlatParams
from .sandblaster_recovery import Lineup, recover
from .stop_resume import StopTold, identity, resume, resumed_line

if TYPE_CHECKING:
    from ...sandblaster.lbfgs import Iteration
    from ...sandblaster.worker import Worker


class SandblasterRun:
    """This rank's part; after ``run()`` the coordinator's ``summary`` and committed ``c``, a
    server's ``server`` state, and the current ``roles``, ``placement`` and ``comm``."""

    def __init__(self, ctx: Context, config: TrainConfig, model: Model, dataset: Dataset, observer: Observer,
                 log: StepLog):
        self.ctx, self.config, self.model, self.dataset, self.observer, self.log = \
            ctx, config, model, dataset, observer, log
        self.comm = ctx.comm if ctx.ft else ctx.comm.Dup()
        self.flat = FlatParams(model)
        lineup = Lineup.initial(config.servers, ctx.size, self.flat.length, replicate=ctx.ft)
        self.roles, self.placement = lineup.roles, lineup.placement
        self.unit = lineup.unit(config.batch, config.topology.unit)
        self.members = Membership.founding(ctx.size, ctx.rank)
        # random kills never pick rank 0 (the schedule's default): with K = 1 its slice has no replica
        self.kills = config.fault.schedule(config.seed)
        self.events = EventLog()
        self.records: List[np.ndarray] = lineup.records
        self.iteration = 0
        self.c, self.summary, self.stopped = 0, None, False
        self.server: Optional[ServerState] = None
        self.worker: Optional["Worker"] = None
        watchdog.deadline_s = config.fault.deadline_s
        if ctx.rank < config.servers:
            self.server = sandblaster_roles.initial_slices(self.flat, model, config, self.placement, ctx.rank)
        self.identity = identity(config, model)
        started = time.time()
        self.records = resume(self.comm, config, self.identity, self.server) or self.records
        if self.records:
            event = self.events.add(RecoveryEvent("resume", Committed.from_array(self.records[-1]).iteration + 1,
                                                  ctx.size, started))
            event.ranks_after, event.restore_s = ctx.size, time.time() - started
            observer.echo(resumed_line(self.records, len(self.roles.workers)))
        self.told = StopTold(self.comm, self.roles.coordinator)

    def run(self) -> None:
        """Play the role to the end of the run, recovering from failures with ``--ft``."""
        if not self.ctx.ft:
            self._play()
            return
        while True:
            outcome = attempt(self.comm, self._play, "the end of the run or a failure", on_failure=self._abandon,
                              watch_work=False)
            if outcome.committed:
                return
            self._recover(outcome.failed_at or time.time())

    def _strike(self, iteration: int) -> None:
        self.told.tell()
        self.iteration = iteration
        self.kills.strike("step", iteration, self.members.me, self.members.ids)

    def _play(self) -> None:
        rank, roles, ctx = self.comm.Get_rank(), self.roles, self.ctx
        if rank < roles.servers:
            serve(self.comm, self.server, self.placement, ctx.traffic, on_begin=self._strike)
        elif rank == roles.coordinator:
            ends = sandblaster_roles.coordinate(self.comm, roles, self.config, self.unit, self.records,
                                                len(self.log.rows), self._log, self.members.ids, ctx.traffic,
                                                on_begin=self._strike, stop_wanted=self.told.wanted)
            self.c, self.summary, self.stopped = ends["c"], ends["summary"], ends["stopped"]
        else:
            self.worker = sandblaster_roles.work(self.comm, roles, self.placement, self.flat, self.model,
                                                 self.dataset, self.config, self.unit, self.members.me, ctx.traffic,
                                                 on_unit=self._strike)
            self.worker.run()

    def _log(self, it: "Iteration") -> None:
        self.log.record(it.iteration, it.f, it.accuracy, self.config.batch * it.evaluations,
                        gradient_norm=it.gradient_norm, step_size=it.step, evaluations=it.evaluations)
        self.observer.step_done(self.log)
        self.events.step_completed()

    def _abandon(self) -> None:
        """Complete what is in flight (with errors) after the communicator was revoked."""
        pending = (self.server.pending if self.server else []) + (self.worker.pending if self.worker else [])
        abandon(self.comm, pending)

    def _recover(self, detected: float) -> None:
        """Shrink to the survivors, re-derive roles and placement, share the newest record."""
        members = self.members
        survivors, event = recover(self.ctx, members, Lineup(self.roles, self.placement, self.records), self.server,
                                   self.iteration, detected, lambda: self.kills.strike(
                                       "recovery", self.iteration, members.me, members.ids))
        self.comm, self.roles, self.placement, self.records = self.ctx.comm, survivors.roles, survivors.placement, \
            survivors.records
        if self.server:
            self.server.records = list(self.records)
        self.worker = None
        self.told = StopTold(self.comm, self.roles.coordinator)
        self.events.add(event)
        self.observer.reporter = self.roles.coordinator
        self.observer.echo(event.line())

    def results(self) -> Dict[str, Any]:
        """What the end of the run needs on every rank (collective): the coordinator's c, summary,
        log rows, the recovery events and whether a stop signal ended the run; the server
        duplicates added to the summary."""
        root = self.roles.coordinator
        c, summary, rows, events, stopped = self.comm.bcast(
            (self.c, self.summary, self.log.rows, self.events.as_dicts(), self.stopped), root=root)
        duplicates = self.server.duplicates if self.server else 0
        summary["duplicates_discarded"] += self.comm.allreduce(duplicates, op=MPI.SUM)
        return {"c": c, "summary": summary, "rows": rows, "recovery": events, "stopped": stopped}

    def gather(self, c: int) -> List[np.ndarray]:
        """The committed x[c] and g[c], whole, on every rank (each served slice from its primary)."""
        return sandblaster_roles.gather(self.comm, self.server, self.placement, self.flat.length, c)

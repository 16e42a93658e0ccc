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
"""
from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Optional

import numpy as np
from mpi4py import MPI

from ...errors import TrainingError
from ...ft.events import EventLog, RecoveryEvent
from ...ft.membership import Membership
from ...ft.rounds import Shrunk, attempt, shrink_until_restored
from ...ft.watchdog import watchdog
from ...runtime.context import Context
from ...runtime.failures import abandon
from ...sandblaster import Roles, unit_size
from ...sandblaster.coordinator import Coordinator
from ...sandblaster.lbfgs import BatchOptimizer, Iteration, Settings
from ...sandblaster.placement import Placement
from ...sandblaster.protocol import VectorNames
from ...sandblaster.record import Committed
from ...sandblaster.server import ServerState, SliceVectors, serve
from ...sandblaster.worker import Worker
from ..config import TrainConfig
from ..data import Dataset
from ..model import Model
from ..observe import Observer
from ..partition import global_batch
from ..results import StepLog
from ..straggler import factor_for
from .flat import FlatParams
from .units import ModelUnits


class SandblasterRun:
    """This rank's part; after ``run()`` the coordinator's ``summary`` and committed ``c``, a
    server's ``server`` state, and the current ``roles``, ``placement`` and ``comm``."""

    def __init__(self, ctx: Context, config: TrainConfig, model: Model, dataset: Dataset, observer: Observer,
                 log: StepLog):
        self.ctx, self.config, self.model, self.dataset, self.observer, self.log = \
            ctx, config, model, dataset, observer, log
        self.comm = ctx.comm if ctx.ft else ctx.comm.Dup()
        self.flat = FlatParams(model)
        self.roles = Roles(config.servers, ctx.size)
        self.placement = Placement.initial(self.flat.length, config.servers, replicate=ctx.ft)
        self.unit = unit_size(config.batch, config.unit, len(self.roles.workers))
        self.members = Membership.founding(ctx.size, ctx.rank)
        # random kills never pick rank 0 (the schedule's default): with K = 1 its slice has no replica
        self.kills = config.fault.schedule(config.seed)
        self.events = EventLog()
        self.records: List[np.ndarray] = []
        self.iteration = 0
        self.c, self.summary = 0, None
        self.server: Optional[ServerState] = None
        self.worker: Optional[Worker] = None
        watchdog.deadline_s = config.fault.deadline_s
        if ctx.rank < config.servers:
            initial = self.flat.flatten(model.init_params(config.seed))
            self.server = ServerState({s: SliceVectors(VectorNames(config.history), initial[lo:hi])
                                       for s in self.placement.held_by(ctx.rank)
                                       for lo, hi in [self.placement.bounds[s]]})

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
        self.iteration = iteration
        self.kills.strike("step", iteration, self.members.me, self.members.ids)

    def _play(self) -> None:
        rank, roles, config = self.comm.Get_rank(), self.roles, self.config
        if rank < roles.servers:
            serve(self.comm, self.server, self.placement, self.ctx.traffic, on_begin=self._strike)
        elif rank == roles.coordinator:
            self._coordinate()
        else:
            indices = global_batch(0, config.batch, self.dataset.size("train"), config.seed)
            compute = ModelUnits(self.model, self.dataset, self.flat, indices, self.unit,
                                 factor_for(config.fault, self.members.me))
            self.worker = Worker(self.comm, roles.coordinator, self.placement.for_workers(), self.flat.length,
                                 compute, config.push_units, self.ctx.traffic, on_unit=self._strike)
            self.worker.run()

    def _coordinate(self) -> None:
        config, log = self.config, self.log
        coordinator = Coordinator(self.comm, range(self.roles.servers), self.roles.workers,
                                  math.ceil(config.batch / self.unit), config.backups, self.ctx.traffic,
                                  on_begin=self._strike)
        for record in map(Committed.from_array, self.records):
            if record.iteration > len(log.rows):  # iterations a dead coordinator did
                count = max(record.stats[2], 1.0)
                self._log(Iteration(record.iteration, record.f, record.stats[1] / count, math.sqrt(record.gg),
                                    record.step, record.evaluations))
        optimizer = BatchOptimizer(coordinator, Settings(config.optimizer, config.history, config.gtol, config.ftol,
                                                         config.steps, config.batch, config.l2), self._log,
                                   resume=Committed.from_array(self.records[-1]) if self.records else None)
        final = optimizer.run()
        coordinator.stop()
        self.c = optimizer.c
        self.summary = {
            "units": coordinator.counted, "backups_issued": coordinator.backups_issued,
            "duplicates_discarded": coordinator.duplicates, "iterations": optimizer.iterations,
            "evaluations": coordinator.passes, "pass_s": coordinator.pass_s,
            "units_by_worker": {str(self.members.ids[w]): n for w, n in coordinator.units_by_worker.items()},
            "units_per_pass": coordinator.units, "optimizer": config.optimizer, "history": config.history,
            "unit": self.unit, "backups": config.backups, "stopped_by": optimizer.stopped_by,
            "final_gradient_norm": math.sqrt(final.gg), "objective": final.f}

    def _log(self, it: Iteration) -> None:
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
        ctx = self.ctx
        event = RecoveryEvent("failure", self.iteration, ctx.size, detected)

        def restore(shrunk: Shrunk) -> List[np.ndarray]:
            event.lost += self.members.shrink(shrunk)
            event.rounds += shrunk.rounds
            event.shrink_s = time.time() - event.detected_at
            self.comm = ctx.comm
            self.placement = self.placement.after_loss(shrunk.new_rank)
            servers = sum(new is not None for new in shrunk.new_rank[:self.roles.servers])
            self.roles = Roles(servers, ctx.size)
            if not self.roles.workers:
                raise TrainingError("sandblaster: no worker is left (%d ranks for %d servers and the coordinator): "
                                    "nothing left to recover from" % (ctx.size, servers))
            return self._newest_records()

        self.records = shrink_until_restored(
            ctx, restore, f"sandblaster recovery at iteration {self.iteration}",
            before_shrink=lambda: self.kills.strike("recovery", self.iteration, self.members.me, self.members.ids))
        if self.server:
            self.server.records = list(self.records)
        self.worker = None
        event.step = Committed.from_array(self.records[-1]).iteration + 1 if self.records else 1
        event.ranks_after = ctx.size
        event.restore_s = time.time() - event.detected_at - event.shrink_s
        self.events.add(event)
        self.observer.reporter = self.roles.coordinator
        self.observer.echo(event.line())

    def _newest_records(self) -> List[np.ndarray]:
        """Every server's records replaced by the longest list any server holds (collective)."""
        counts = self.comm.allgather(len(self.server.records) if self.server else -1)
        best = int(np.argmax(counts))
        return self.comm.bcast(self.server.records if self.comm.Get_rank() == best else None, root=best)

    def results(self) -> Dict[str, Any]:
        """What the end of the run needs on every rank (collective): the coordinator's c, summary,
        log rows and the recovery events; the server duplicates added to the summary."""
        root = self.roles.coordinator
        c, summary, rows, events = self.comm.bcast((self.c, self.summary, self.log.rows, self.events.as_dicts()),
                                                   root=root)
        duplicates = self.server.duplicates if self.server else 0
        summary["duplicates_discarded"] += self.comm.allreduce(duplicates, op=MPI.SUM)
        return {"c": c, "summary": summary, "rows": rows, "recovery": events}

    def gather(self, c: int) -> List[np.ndarray]:
        """The committed x[c] and g[c], whole, on every rank (each served slice from its primary)."""
        names, me = VectorNames(1), self.comm.Get_rank()
        found = []
        for ids in (names.X, names.G):
            whole = np.zeros(self.flat.length)
            for s, vectors in (self.server.slices.items() if self.server else ()):
                if self.placement.primary[s] == me:
                    lo, hi = self.placement.bounds[s]
                    whole[lo:hi] = vectors.vectors[ids[c]]
            self.comm.Allreduce(MPI.IN_PLACE, whole, op=MPI.SUM)
            found.append(whole)
        return found

"""Parameter-server training that survives dead ranks and takes in new ones (``--mode ps`` with ULFM).

Each rank runs its role (the server loop, or the worker loop) until the run ends with an
``Agree`` of every rank, or until MPI reports a failure: then it abandons what it has in
flight, revokes, and joins the collective recovery (``recovery``), after which roles,
layout and communicator are new and the loop goes on where it was (BSP: from the restart
step). Servers replicate their shard on the next server (``hpcreduce.ps.replication``)
and, with ``checkpoint_dir``, checkpoint it (``checkpoint``); ``progress`` injects faults
and asks for growth as the steps advance, and ``growth`` spawns the newcomers (workers,
appended; they pull the latest parameters). ``kill_random`` never draws id 0 (the first
server) nor id K (the first worker), so a server and a worker always remain.
Cost while nothing fails: the replication of every push, a checkpoint of each shard every
``checkpoint_every`` steps when asked, and one ``Agree`` at the end.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from mpi4py import MPI

from ...ft.events import EventLog
from ...ft.membership import Membership
from ...ft.rounds import attempt
from ...ft.watchdog import watchdog
from ...ps.consistency import Consistency
from ...ps.footprint import refuse_unfit
from ...ps.holdings import ShardHoldings
from ...ps.layout import Layout
from ...ps.recovery_plan import Committed, Report
from ...ps.server import Server
from ...ps.start import everywhere, table_optimizers
from ...ps.shard_state import ShardState
from ...ps.worker import Worker
from ...runtime.context import Context
from ...runtime.nodes import rank_nodes
from ...runtime.failures import abandon
from ..config import TrainConfig
from ..data import Dataset
from ..model import Model
from ..observe import Observer
from ..identity import run_identity
from . import ps_growth, scale_in, shard_checkpoints
from .final import part_init
from .loop import WorkerLoop
from .progress import StepHooks
from .recovery import PSRecoveryEvent, Settled, recover
from .worker_side import WorkerSide, dead_seats


class ElasticPS:
    """One rank of a fault-tolerant PS run; ``run()``, then read ``layout``, ``holdings``
    (a server's shard) and ``worker_side`` (a worker's loop)."""

    def __init__(self, ctx: Context, config: TrainConfig, model: Model, dataset: Dataset, observer: Observer):
        self.ctx, self.config, self.model, self.dataset, self.observer = ctx, config, model, dataset, observer
        self.fault = config.fault
        self.specs = model.param_specs()
        self.consistency = Consistency(config.consistency, config.staleness)
        self.optimizers = table_optimizers(self.specs, config.optimizer, config.lr)
        self.events = EventLog()
        self.holdings = ShardHoldings()
        self.worker_side = WorkerSide()
        self.server: Optional[Server] = None
        self.detected: Optional[float] = None
        self.placement: List[Dict[str, Any]] = []  # the shards' homes at the start (founding ranks)
        self.departed: List[Tuple[int, int, int]] = []  # (slot, pieces made, updates lost) of workers that left
        watchdog.deadline_s = self.fault.deadline_s
        control = ctx.comm.bcast(None, root=0) if ctx.joined else None
        self.members = Membership.from_control(control, ctx.rank) if control else \
            Membership.founding(ctx.size, ctx.rank)
        self.hooks = StepHooks(ctx, self.fault, self.fault.schedule(config.seed, protected=(0, config.servers)),
                               self.members, self.events, observer.echo, self.consistency.aggregates,
                               ask=self._revoke_for_growth,
                               identity=run_identity(config, model, next(iter(self.optimizers.values()))),
                               output_failed=observer.output_failed)
        if control:
            ps_growth.join(self, control)
        else:
            shard_checkpoints.refuse_foreign(ctx.comm, self.fault.checkpoint_dir, self.hooks.identity)
            self._start()

    @property
    def layout(self) -> Layout:
        return self.committed.layout

    def run(self) -> None:
        """Serve or work until every rank agrees the run is over, recovering on the way.

        Every rank ends each stretch of work with exactly one agreement (``ft.rounds``):
        "done" at the end, "failed" after it abandoned its requests and revoked the
        communicator (which wakes every rank blocked in it).
        """
        while True:
            work = self.server.serve if self.server is not None else self._work
            outcome = attempt(self.ctx.comm, work, "the end of the run or a failure", on_failure=self._abandon,
                              watch_work=False)
            if outcome.committed:
                return
            self.detected = self.detected or outcome.failed_at or time.time()
            self.install(*recover(self))

    def _work(self) -> None:
        loop = self.worker_side.loop
        if loop.result.failure is None:
            try:
                loop.run_steps(self.observer)
            except MPI.Exception:
                raise
            except Exception as err:  # reported on every rank at the end (trainer)
                loop.fail(self.ctx, err)
        loop.worker.release()

    def _abandon(self) -> None:
        """Complete everything in flight (with errors) after the communicator was revoked."""
        if self.server is not None:
            abandon(self.ctx.comm, self.server.pending_requests())
        elif self.worker_side.loop is not None:
            self.worker_side.loop.worker.abandon()

    def _revoke_for_growth(self) -> None:
        self.detected = time.time()
        self.ctx.comm.Revoke()

    # -- roles -------------------------------------------------------------------------
    def _start(self) -> None:
        ctx, config = self.ctx, self.config
        nodes = rank_nodes(ctx.comm)
        self.hooks.nodes = dict(zip(self.members.ids, nodes))
        layout = Layout.initial(self.specs, ctx.size, config.servers, nodes)
        self.placement = layout.homes(nodes, replicated=True)
        if layout.same_node_backups():
            self.observer.echo(f"ps: shard(s) {layout.same_node_backups()} keep their replica on their own node "
                               "(it holds more than half the servers): losing that node loses them, unless "
                               "--checkpoint-dir has them")
        refuse_unfit(ctx.comm, layout, self.optimizers, True, nodes)
        self.committed = Committed(layout, config.servers)

        def make() -> None:
            if layout.is_server(ctx.rank):
                initial = part_init(self.model, config.seed, self.specs)
                own = layout.shard_of(ctx.rank)
                self.holdings.own_key = own
                keys = [own, layout.neighbours(own)[1]] if len(layout.shard_ranks) > 1 else [own]
                states = ShardState.create_many(layout, keys, initial, self.optimizers)
                self.holdings.states = {own: states[0]}
                self.holdings.replica = states[1] if len(states) > 1 else None
            else:
                self.worker_side.loop = self.new_loop(Worker(ctx.comm, layout, ctx.traffic, guard=watchdog.guard))
        everywhere(ctx, make)
        self.build_roles(layout)

    def new_loop(self, worker: Worker) -> WorkerLoop:
        loop = WorkerLoop(worker, self.config, self.model, self.dataset, self.ctx)
        loop.before_step = self.hooks.worker_step
        loop.step = worker.clock_value
        return loop

    def build_roles(self, layout: Layout) -> None:
        """The Server object of this rank (with its replication), if it is a server."""
        self.server = None
        self.observer.reporter = layout.worker_ranks[0]
        if not layout.is_server(self.ctx.rank):
            return
        own = self.holdings.own_key
        self.server = Server(self.ctx.comm, layout, self.holdings.own, self.optimizers, self.consistency,
                             self.ctx.traffic, guard=watchdog.guard, on_progress=self.hooks.server_progress)
        if len(layout.shard_ranks) > 1:
            backup, primary = layout.neighbours(own)
            self.server.replicate(layout.shard_ranks[backup], layout.shard_ranks[primary], self.holdings.replica)

    def promote(self, key: int) -> None:
        """This worker becomes the server of shard ``key`` (no server survived)."""
        self.worker_side.promote()
        self.holdings.own_key = key

    # -- recovery ----------------------------------------------------------------------
    def report(self) -> Report:
        """What this rank holds, for the recovery plan."""
        slot, clock, outgoing = self.worker_side.slot_and_clock()
        return Report(self.members.me, self.holdings.own_key, self.holdings.applied_steps(),
                      self.holdings.replica_applied(), slot, clock, outgoing, self.detected,
                      self.hooks.growth_wanted,
                      shard_checkpoints.latest_complete(self.fault.checkpoint_dir) if self.ctx.rank == 0 else None,
                      server_growth=self.hooks.servers_wanted, leaving=self.hooks.leave_wanted)

    def install(self, event: PSRecoveryEvent, settled: Settled) -> None:
        """Everything a committed recovery decided: layout, shards, loops, roles, growth."""
        plan, layout = settled.plan, settled.layout
        seats = dead_seats(self.committed.layout, plan) if self.fault.replace else []
        requested, self.detected = self.detected or event.detected_at, None  # rank 0's: when it asked
        if plan.leaving:
            layout = scale_in.leave(self, event, settled, requested)
        self.committed = Committed(layout, plan.next_key)
        self.worker_side.settle(self.ctx, plan, layout, settled.repushed)
        if layout.is_server(self.ctx.rank):
            self.holdings.settle(self.holdings.own_key, settled.state, settled.replica)
            for slot, clock in plan.clocks.items():
                settled.state.clocks[slot] = clock
        self.hooks.resume_mark = min(plan.clocks.values())
        self.build_roles(layout)
        if event.lost or event.left:
            self.events.add(event)
        count, step = plan.growth
        if count:
            ps_growth.grow(self, count, "growth", plan, step)
        servers, step = plan.server_growth
        if servers:
            ps_growth.grow_servers(self, servers, step, requested)
        if self.fault.replace and event.lost:
            ps_growth.grow(self, len(event.lost), "replacement", plan, 0, seats)

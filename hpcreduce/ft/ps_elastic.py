"""Parameter-server training that survives dead ranks and takes in new ones (``--mode ps --ft``).

Each rank runs its role (the server loop, or the worker loop) until the run ends with an
``Agree`` of every rank, or until MPI reports a failure: then it abandons what it has in
flight, revokes, and joins the collective recovery (``ps_recovery``), after which roles,
layout and communicator are new and the loop goes on where it was (BSP: from the restart
step). Servers replicate their shard on the next server (``ps.replication``) and, with
``--checkpoint-dir``, checkpoint it (``ps_checkpoint``). Fault injection: a worker dies at
``--kill ID@STEP`` at the start of its step STEP; a server when the slowest worker's
clock reaches STEP - 1 (every worker is done with step STEP - 1); ``:recovery`` kills in
the first recovery whose step (the most advanced worker's) is at least STEP, after the
reports are exchanged; ``:checkpoint`` half way through the shard's checkpoint of step
STEP. ``--kill-random`` never draws id 0 (the first server) nor id K (the first worker), so
a server and a worker always remain. Growth (``--grow N@STEP``, ``--discover``) is started by rank 0, a server, when the
slowest clock reaches STEP - 1: it revokes the communicator, and the recovery that follows
spawns the newcomers (workers, appended; they pull the latest parameters).
Cost while nothing fails: the replication of every push (``ps.replication``), a checkpoint of
each shard every ``--checkpoint-every`` steps when asked, and one ``Agree`` at the end.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from mpi4py import MPI

from ..ps.consistency import Consistency
from ..ps.job import checked, everywhere, table_optimizers
from ..ps.layout import Layout
from ..ps.loop import CLOCK, PUSH, WorkerLoop
from ..ps.server import NOBODY_LIVE, Server
from ..ps.state import ShardState
from ..ps.worker import PSWorker
from ..runtime.context import Context
from ..runtime.failures import abandon, is_process_failure
from ..runtime.launch import this_program
from ..train.config import TrainConfig
from ..train.data import Dataset
from ..train.model import Model
from . import ps_checkpoint
from .events import EventLog
from .growth import read_target, spawn_and_merge
from .membership import Membership
from .ps_plan import Committed, Plan, Report
from .ps_recovery import PSRecoveryEvent, Settled, lost_pieces, recover
from .recovery import agree_all
from .watchdog import watchdog


class ElasticPS:
    """One rank of a fault-tolerant PS run; ``run()`` then read ``layout``, ``state``, ``loop``."""

    def __init__(self, ctx: Context, config: TrainConfig, model: Model, dataset: Dataset, observer: Any):
        self.ctx, self.config, self.model, self.dataset, self.observer = ctx, config, model, dataset, observer
        self.fault = config.fault
        self.specs = model.param_specs()
        self.consistency = Consistency(config.consistency, config.staleness)
        self.optimizers = table_optimizers(self.specs, config.optimizer, config.lr)
        self.kills = self.fault.schedule(config.seed, protected=(0, config.servers))
        self.events = EventLog()
        watchdog.deadline_s = self.fault.deadline_s
        self.states: Dict[int, ShardState] = {}
        self.replica: Optional[ShardState] = None
        self.own_key: Optional[int] = None
        self.server: Optional[Server] = None
        self.loop: Optional[WorkerLoop] = None
        self.former: Optional[WorkerLoop] = None
        self.detected: Optional[float] = None
        self.struck = self.struck_recovery = self.checkpointed = self.resume_mark = 0
        self.growth_wanted: Tuple[int, int] = (0, 0)
        self.restored_pushes: Dict[int, Dict[int, Any]] = {}
        self.lost_updates = 0
        if ctx.joined:
            self._join()
        else:
            self._start()

    # -- the run -----------------------------------------------------------------------
    def run(self) -> None:
        """Serve or work until every rank agrees the run is over, recovering on the way.

        Every rank ends each stretch of work with exactly one ``Agree``: "done" at the end,
        "failed" after it abandoned its requests and revoked the communicator (which wakes
        every rank blocked in it). So the agreement is the same everywhere, and no rank can
        still be in it while another shrinks the communicator (Open MPI's shrink agrees
        internally too, and the two must not meet).
        """
        while True:
            done = True
            try:
                if self.server is not None:
                    self.server.serve()
                else:
                    self._work()
            except MPI.Exception as error:
                if not is_process_failure(error, self.ctx.comm):
                    raise
                self.detected = self.detected or time.time()
                self._abandon()
                done = False
            with watchdog.guard("the end of the run or a failure (agreement of every rank)"):
                if agree_all(self.ctx.comm, done):
                    return
            self.detected = self.detected or time.time()
            event, settled = recover(self)
            self._install(event, settled)

    @property
    def layout(self) -> Layout:
        return self.committed.layout

    @property
    def state(self) -> Optional[ShardState]:
        return self.states.get(self.own_key) if self.own_key is not None else None

    @property
    def worker_loop(self) -> Optional[WorkerLoop]:
        """This rank's worker loop: its own, or the one it ran before it was promoted."""
        return self.loop or self.former

    def _work(self) -> None:
        loop = self.loop
        if loop.result.failure is None:
            try:
                loop.run_steps(self.observer)
            except MPI.Exception:
                raise
            except Exception as err:  # reported on every rank at the end (training.py)
                loop.fail(self.ctx, err)
        loop.worker.release()

    def _abandon(self) -> None:
        """Complete everything in flight (with errors) after revoking the communicator."""
        if self.server is not None:
            abandon(self.ctx.comm, self.server.pending_requests())
        elif self.loop is not None:
            self.loop.worker.abandon()

    # -- start and roles ---------------------------------------------------------------
    def _start(self) -> None:
        ctx, config = self.ctx, self.config
        layout = Layout.initial(self.specs, ctx.size, config.servers)
        self.members = Membership.founding(ctx.size, ctx.rank)
        self.committed = Committed(layout, config.servers)

        def make() -> None:
            if layout.is_server(ctx.rank):
                initial = checked(self.model.init_params(config.seed), self.specs)
                keys = sorted(layout.shard_ranks)
                self.own_key = layout.shard_of(ctx.rank)
                self.states = {self.own_key: ShardState.create(layout, self.own_key, initial, self.optimizers)}
                if len(keys) > 1:
                    before = keys[keys.index(self.own_key) - 1]
                    self.replica = ShardState.create(layout, before, initial, self.optimizers)
            else:
                self.loop = self._new_loop(PSWorker(ctx.comm, layout, ctx.traffic, guard=watchdog.guard))
        everywhere(ctx, make)
        self._build_roles(layout)

    def _new_loop(self, worker: PSWorker) -> WorkerLoop:
        loop = WorkerLoop(worker, self.config, self.model, self.dataset, self.ctx)
        loop.before_step = self._worker_step
        loop.step = worker.clock_value
        return loop

    def _build_roles(self, layout: Layout) -> None:
        """The Server object of this rank (with its replication), if it is a server."""
        self.server = None
        self.observer.reporter = layout.worker_ranks[0]
        if not layout.is_server(self.ctx.rank):
            return
        self.server = Server(self.ctx.comm, layout, self.states[self.own_key], self.optimizers,
                             self.consistency, self.ctx.traffic, guard=watchdog.guard,
                             on_progress=self._server_progress)
        keys = sorted(layout.shard_ranks)
        if len(keys) > 1:
            position = keys.index(self.own_key)
            self.server.replicate(layout.shard_ranks[keys[(position + 1) % len(keys)]],
                                  layout.shard_ranks[keys[position - 1]], self.replica)

    def promote(self, key: int) -> None:
        """This worker becomes the server of shard ``key`` (no server survived)."""
        self.former, self.loop = self.loop, None
        self.own_key = key

    # -- what recovery asks of this rank ------------------------------------------------
    def report(self) -> Report:
        loop = self.loop
        return Report(self.members.me, self.own_key,
                      {key: state.applied_steps for key, state in self.states.items()},
                      (self.replica.shard, self.replica.applied_steps) if self.replica is not None else None,
                      loop.worker.id if loop else None, loop.worker.clock_value if loop else 0,
                      bool(loop and loop.outgoing), self.detected, self.growth_wanted,
                      ps_checkpoint.latest_complete(self.fault.checkpoint_dir) if self.ctx.rank == 0 else None)

    def outgoing_pieces(self, holders: Dict[int, int]) -> List[Tuple[int, tuple]]:
        """(destination rank, item) for every piece of this worker's unacknowledged push,
        cut by the placement it was sent under."""
        loop, layout = self.loop, self.committed.layout
        out, slot, step = loop.outgoing, loop.worker.id, loop.outgoing.step
        items = []
        for name, grad in out.dense.items():
            t = layout.table_ids[name]
            flat = grad.reshape(-1)
            for piece in layout.placement.pieces[t]:
                items.append((holders[piece.shard], (piece.shard, t, slot, step, piece.start, None,
                                                      flat[piece.start:piece.stop])))
        for name, (ids, grads) in out.rows.items():
            t = layout.table_ids[name]
            owners = layout.placement.row_owners(t, ids)
            for key in sorted(set(owners.tolist())):
                mask = owners == key
                items.append((holders[key], (key, t, slot, step, 0, ids[mask], grads[mask])))
        return items

    def note_restore(self, plan: Plan, pushes: Dict[int, Dict[int, Any]]) -> None:
        """Remember the restored shards' record of pushes (to count the lost updates)."""
        for key in plan.restored:
            self.restored_pushes[key] = pushes[key] if key in pushes else {}

    def count_lost(self, plan: Plan) -> int:
        """Acknowledged pieces of this rank's pushes that the restored state lacks."""
        loop = self.worker_loop
        if loop is None:
            return 0
        if plan.rollback:
            return sum(1 for entry in loop.pushed if entry[0] >= plan.restart)
        return len(lost_pieces(loop.pushed, loop.worker.id, self.restored_pushes))

    def strike_recovery(self, step: int) -> None:
        """Fault injection in a recovery: kills at or before ``step`` not yet done."""
        for at in range(self.struck_recovery + 1, step + 1):
            self.kills.strike("recovery", at, self.members.me, self.members.ids)
        self.struck_recovery = max(self.struck_recovery, step)

    # -- after a recovery ---------------------------------------------------------------
    def _install(self, event: PSRecoveryEvent, settled: Settled) -> None:
        plan, layout = settled.plan, settled.layout
        self.committed = Committed(layout, plan.next_key, self.committed.grown_before)
        self.lost_updates += self.count_lost(plan)
        for loop in filter(None, (self.loop, self.former)):
            self._settle_loop(loop, plan, settled)
        if layout.is_server(self.ctx.rank):
            self.states, self.replica = {self.own_key: settled.state}, settled.replica
            for slot, clock in plan.clocks.items():
                settled.state.clocks[slot] = clock
        self.restored_pushes = {}
        self.detected = None
        self.resume_mark = min(plan.clocks.values())
        self._build_roles(layout)
        if event.lost:
            self.events.add(event)
        count, step = plan.growth
        if count:
            self._grow(count, "growth", plan, step)
        if self.fault.replace and event.lost:
            self._grow(len(event.lost), "replacement", plan, 0)

    def _settle_loop(self, loop: WorkerLoop, plan: Plan, settled: Settled) -> None:
        """The worker side of the plan: BSP restart, or re-push acknowledged; lost updates."""
        if plan.rollback:
            pass  # restart below drops everything from the checkpoint step on
        elif self.restored_pushes:
            lost = set(lost_pieces(loop.pushed, loop.worker.id, self.restored_pushes))
            loop.pushed = [entry for entry in loop.pushed if entry not in lost]
        if loop is self.former:
            if plan.restart is not None:
                loop.restart(plan.restart)
            return
        loop.worker = PSWorker(self.ctx.comm, settled.layout, self.ctx.traffic, guard=watchdog.guard,
                               clock=plan.clocks[loop.worker.id])
        if plan.restart is not None:
            loop.restart(plan.restart)
            return
        if loop.outgoing is not None:
            loop.acknowledged(settled.repushed)
            if loop.stage == PUSH:
                loop.stage = CLOCK
        loop.refetch = True

    # -- hooks -----------------------------------------------------------------------
    def _worker_step(self, step: int) -> None:
        """A worker starts step ``step`` (from 1)."""
        if step > self.struck:
            self.struck = step
            self.kills.strike("step", step, self.members.me, self.members.ids)

    def _server_progress(self, server: Server, slowest: int) -> None:
        """The slowest live worker's clock is now ``slowest`` (NOBODY_LIVE: all released)."""
        if slowest > self.resume_mark:
            for event in self.events.step_completed():
                self.observer.echo(event.line())
        if slowest == NOBODY_LIVE:
            return
        for step in range(self.struck + 1, slowest + 2):
            self.struck = step
            self.kills.strike("step", step, self.members.me, self.members.ids)
        self._checkpoint(server, slowest)
        if self.ctx.rank == 0:
            self._ask_growth(slowest + 1)

    def _checkpoint(self, server: Server, slowest: int) -> None:
        every, directory = self.fault.checkpoint_every, self.fault.checkpoint_dir
        if not (every and directory):
            return
        step = slowest - slowest % every
        if step > self.checkpointed:
            self.checkpointed = step
            ps_checkpoint.save_shard(directory, step, server.state, sorted(server.layout.shard_ranks),
                                     self.consistency.aggregates,
                                     halfway=lambda: self.kills.strike("checkpoint", step, self.members.me,
                                                                       self.members.ids))

    def _ask_growth(self, step: int) -> None:
        """Rank 0: growth due before ``step``? Then revoke, so that everyone recovers and grows."""
        if self.growth_wanted[0] or step <= self.committed.grown_before:
            return
        count = sum(n for n, at in self.fault.grow if self.committed.grown_before < at <= step)
        if self.fault.discover and step % self.fault.discover_every == 0:
            target = read_target(self.fault.discover)
            if target is not None and target > self.ctx.size + count:
                count = target - self.ctx.size
        if count:
            self.growth_wanted = (count, step)
            self.detected = time.time()
            self.ctx.comm.Revoke()

    # -- growth ----------------------------------------------------------------------
    def _grow(self, count: int, kind: str, plan: Plan, step: int) -> None:
        """Spawn ``count`` workers and merge them in after every rank (collective)."""
        ctx = self.ctx
        event = self.events.add(PSRecoveryEvent(kind, plan.resume_step, ctx.size, time.time()))
        with watchdog.guard(f"{kind}: spawn and merge"):
            merged = spawn_and_merge(ctx.comm, count, this_program())
        self.ctx.replace_comm(merged)
        event.joined = self.members.grow(count)
        old = self.committed.layout
        slots = list(range(old.slot_count, old.slot_count + count))
        layout = old.rebuilt(old.shard_ranks, list(old.worker_ranks) + list(range(ctx.size - count, ctx.size)),
                             list(old.worker_slots) + slots, old.slot_count + count)
        clock = plan.restart if plan.restart is not None else min(plan.clocks.values())
        self.committed = Committed(layout, self.committed.next_key, max(self.committed.grown_before, step))
        started = time.time()
        with watchdog.guard(f"{kind}: the layout to the newcomers"):
            ctx.comm.bcast(self._control(clock), root=0)
        self._grown(slots, clock)
        event.ranks_after, event.restore_s = ctx.size, time.time() - started
        self.growth_wanted = (0, 0)

    def _control(self, clock: int) -> Dict[str, Any]:
        layout = self.committed.layout
        return {**self.members.control(), "shard_ranks": layout.shard_ranks, "worker_ranks": layout.worker_ranks,
                "worker_slots": layout.worker_slots, "slot_count": layout.slot_count,
                "next_key": self.committed.next_key, "grown_before": self.committed.grown_before,
                "clock": clock}

    def _grown(self, slots: List[int], clock: int) -> None:
        """Every rank after a growth: room for the new slots, roles over the new communicator."""
        layout = self.committed.layout
        for state in filter(None, [*self.states.values(), self.replica]):
            state.grow(layout.slot_count)
            state.clocks[slots] = clock
        if self.loop is not None:
            self.loop.worker = PSWorker(self.ctx.comm, layout, self.ctx.traffic, guard=watchdog.guard,
                                        clock=self.loop.worker.clock_value)
        self._build_roles(layout)

    def _join(self) -> None:
        """A spawned newcomer: take the layout from the job and become a worker."""
        ctx = self.ctx
        control = ctx.comm.bcast(None, root=0)
        self.members = Membership.from_control(control, ctx.rank)
        layout = Layout(self.specs, control["shard_ranks"], control["worker_ranks"], control["worker_slots"],
                        control["slot_count"])
        self.committed = Committed(layout, control["next_key"], control["grown_before"])
        self.struck = self.struck_recovery = control["clock"]
        self.loop = self._new_loop(PSWorker(ctx.comm, layout, ctx.traffic, guard=watchdog.guard,
                                            clock=control["clock"]))
        self.observer.reporter = layout.worker_ranks[0]

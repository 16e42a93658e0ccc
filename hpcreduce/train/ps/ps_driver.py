"""Parameter-server training that survives dead ranks and takes in new ones (``--mode ps`` with ULFM).

Each rank runs its role (the server loop, or the worker loop) until the run ends with an
``Agree`` of every rank, or until MPI reports a failure: then it abandons what it has in
flight, revokes, and joins the collective recovery (``ps_recovery``), after which roles,
layout and communicator are new and the loop goes on where it was (BSP: from the restart
step). The driver owns the run's state as one value, its ``Epoch``: a recovery, a leave
(``scale_in``), worker or server growth and replacements (``ps_growth``) each give the next
epoch, and ``install`` is the only place that changes it. Servers replicate their shard on
the next server (``hpcreduce.ps.replication``) and, with ``checkpoint_dir``, checkpoint it;
``progress`` injects faults as the steps advance and ``resize_requests`` has rank 0 ask for
growth and leaves. ``kill_random`` never draws id 0 (the first server) nor id K (the first
worker), so a server and a worker always remain.
Cost while nothing fails: the replication of every push, a checkpoint of each shard every
``checkpoint_every`` steps when asked, and one ``Agree`` at the end. A job started again over a
folder holding a complete checkpoint of this run resumes from it as one without ULFM does
(``resume_point``: shards and replicas from it, every worker at its step; hybrid: the workers'
dense replica too, which the first worker checkpoints with the servers, ``dense_checkpoints``).
A stop signal stops every worker after the same step as without ULFM (``stop_point``): each epoch
has its own ``StopPoint`` over its communicator, so a signal before or during a recovery is acted
on in the epoch after it; the run then ends as usual and ``ps_training`` writes the checkpoint.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from mpi4py import MPI

from ...errors import CheckpointMismatchError, SettingProblem, setting_problem
from ...ft.events import EventLog
from ...ft.rounds import attempt
from ...ft.watchdog import watchdog
from ...ps.roles import serve_shard
from ...runtime.context import Context
from . import shard_checkpoints
from .epoch import Epoch
from .first_epoch import founding_epoch, newcomer_epoch
from .loop import WorkerLoop
from .progress import PSKills, ShardCheckpoints, StepProgress
from .ps_setup import PSSetup
from .ps_recovery import recover
from .resize_requests import Resize, ResizeRequests
from .ps_resizing import carry_out
from .dense_checkpoints import load_dense, save_when_due, saved as dense_saved
from .fallback import resumed_event
from .resume_point import Resume
from .stop_point import StopPoint

if TYPE_CHECKING:
    from ...ps.server import Server
    from ...ps.worker import Worker
    from ..observe import Observer


class PSDriver:
    """One rank of a fault-tolerant PS run; ``run()``, then read ``epoch`` (the layout, this
    rank's shard and worker loop, the workers that left) and ``placement``."""

    def __init__(self, ctx: Context, setup: PSSetup, observer: "Observer"):
        self.ctx, self.setup, self.observer = ctx, setup, observer
        watchdog.deadline_s = setup.fault.deadline_s
        self.events = EventLog()
        self.requests = ResizeRequests(setup, observer.echo)
        self.detected: Optional[float] = None
        self.placement: List[Dict[str, Any]] = []  # the shards' homes at the start (founding ranks)
        self.server: Optional["Server"] = None
        self.first_step = 0  # the steps before it were trained by an earlier launch (a resume; newcomers: 0)
        if ctx.joined:
            epoch, welcome = newcomer_epoch(ctx, setup, self._new_loop)
            # hybrid: the live workers wait in step clock + 1's dense reduction, so its kills were drawn
            # (struck again, a random kill would take every replacement in the dead worker's place)
            drawn = welcome.clock + (setup.config.mode == "hybrid")
            self.progress = self._progress(drawn, welcome.clock if welcome.server_keys else 0)
            self.install(epoch)
        else:
            started = time.time()
            resume = Resume.find(ctx, setup) if refuse_resume(ctx, setup) else Resume(None)
            self.first_step = resume.first_step
            self.progress = self._progress(resume.first_step, resume.first_step)
            epoch, server, self.placement = founding_epoch(ctx, setup, self._new_loop, self._server_progress,
                                                           observer.echo, resume)
            if resume.point is not None:
                if epoch.worker.loop is not None and epoch.worker.loop.replica is not None:
                    load_dense(setup.fault.checkpoint_dir, resume.point.step, epoch.worker.loop.replica)
                layout = epoch.layout
                self.events.add(resumed_event(ctx, setup, resume, layout.worker_ranks, sorted(layout.shard_ranks),
                                              time.time() - started, started, observer.echo))
                epoch = epoch.but(resume_mark=resume.first_step)
            self.install(epoch, server)

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
            self._recover()

    def install(self, epoch: Epoch, server: Optional["Server"] = None) -> None:
        """Make ``epoch`` this rank's: its server (``server``, or one of the epoch's shard) or worker."""
        layout = epoch.layout
        self.epoch = epoch
        if server is None and layout.is_server(self.ctx.rank):
            server = serve_shard(self.ctx, layout, self.setup.tables, epoch.holdings.own, epoch.holdings.replica,
                                 guard=watchdog.guard, on_progress=self._server_progress)
        self.server = server
        self.stop = StopPoint(self.ctx.comm, layout.worker_ranks)  # a stop signal, in this epoch's ranks
        if epoch.worker.loop is not None:
            epoch.worker.loop.stop = self.stop
        self.observer.reporter = layout.worker_ranks[0]
        if self.observer.lines_rank is not None:  # ps mode: the first live server writes the metrics lines
            self.observer.lines_rank = min(layout.shard_ranks.values())

    def _progress(self, step: int, checkpointed: int) -> StepProgress:
        """Kills and checkpoints from ``step`` on (``checkpointed``: the last checkpoint step)."""
        setup = self.setup
        schedule = setup.fault.schedule(setup.config.seed, protected=(0, setup.ps.servers))
        return StepProgress(PSKills(schedule, step), ShardCheckpoints(setup, self.observer.output_failed, checkpointed),
                            self.events, self.observer.echo)

    def _new_loop(self, worker: "Worker") -> WorkerLoop:
        setup = self.setup
        loop = WorkerLoop(worker, setup.config, setup.model, setup.dataset, self.ctx)
        loop.before_step = lambda step: self._worker_step(loop, step)
        loop.after_steps = lambda done: self._dense_checkpoint(loop, done + 1)
        loop.step = worker.clock_value
        return loop

    def _worker_step(self, loop: WorkerLoop, step: int) -> None:
        """Kills; in hybrid the first worker checkpoints the dense replica (``dense_checkpoints``)."""
        self.progress.worker_step(step, self.epoch.members)
        self._dense_checkpoint(loop, step)

    def _dense_checkpoint(self, loop: WorkerLoop, step: int) -> None:
        """Hybrid: the dense replica of step ``step - 1`` when the servers checkpoint that step."""
        fault = self.setup.fault
        if loop.replica is not None:
            save_when_due(fault.checkpoint_dir, step, loop.replica, loop.worker.index, fault.checkpoint_every,
                          self.progress.checkpoints.done, self.setup.identity, fault.checkpoint_keep)

    def _work(self) -> None:
        loop = self.epoch.worker.loop
        if loop.result.failure is None:
            try:
                loop.run_steps(self.observer)
            except MPI.Exception:
                raise
            except Exception as err:  # reported on every rank at the end (ps_training)
                loop.fail(self.ctx, err)
        loop.worker.release()

    def _abandon(self) -> None:
        """Complete everything in flight (with errors) after the communicator was revoked."""
        if self.server is not None:
            self.server.abandon()
        elif self.epoch.worker.loop is not None:
            self.epoch.worker.loop.abandon()

    def _server_progress(self, server: "Server", slowest: int) -> None:
        """The slowest live clock moved: kills, checkpoints, events; rank 0 asks for the growth
        and leaves due before the next step by revoking (everyone recovers, then resizes)."""
        epoch = self.epoch
        self.stop.tell()
        if not self.progress.server_progress(server, slowest, epoch.resume_mark, epoch.members):
            return
        if self.ctx.rank == 0 and self.requests.due(slowest + 1, epoch.resized_before, epoch.members.ids,
                                                    epoch.nodes, server.layout):
            self.detected = time.time()
            self.ctx.comm.Revoke()

    def _recover(self) -> None:
        """The recovery round, then what its plan asks for (``ps_resizing``), installed at the end."""
        before = self.epoch
        event, settled = recover(self.ctx, self.setup, before, self.requests.pending, self.progress.kills,
                                 self.detected or time.time())
        requested, self.detected = self.detected or event.detected_at, None  # rank 0's: when it asked
        epoch, self.events.events = carry_out(self.ctx, self.setup, before, settled, event, requested,
                                              self.events.events)
        self.requests.pending = Resize()
        self.install(epoch)


def refuse_resume(ctx: Context, setup: PSSetup) -> Optional[int]:
    """The latest complete checkpoint of this run in ``--checkpoint-dir`` (None: none); a
    ``CheckpointMismatchError`` on every rank when the folder holds another run's checkpoint, or
    (``--mode hybrid``) this run's latest without the dense replica (written before the replicas
    were checkpointed). Collective: small broadcasts."""
    directory = setup.fault.checkpoint_dir
    shard_checkpoints.refuse_foreign(ctx.comm, directory, setup.identity)
    found = None
    if ctx.rank == 0 and directory:
        step = shard_checkpoints.latest_complete(directory)
        found = step
        if step and setup.config.mode == "hybrid" and not dense_saved(directory, step):
            found = setting_problem(
                "{checkpoint_dir} {path} holds this run's checkpoint of step {step} without the workers' dense "
                "parameters: --mode hybrid does not resume from it (it would start at step 1 and overwrite it); "
                "give an empty folder", path=directory, step=step)
    found = ctx.comm.bcast(found, root=0)
    if isinstance(found, SettingProblem):
        raise CheckpointMismatchError(found)
    return found

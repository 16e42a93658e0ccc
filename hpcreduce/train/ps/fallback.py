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
   skipped, never applied twice.

While training, servers write their shard every E steps in parallel and atomically, and kills
fire as with ``--ft`` (``progress.StepHooks``; only in a launch's first attempt). A resume is
a ``recovery`` event of kind ``resume``: ``checkpoint_step`` C, ``updates_lost``,
``ranks_before`` (of the run that wrote C), ``restore_s`` (until every server rebuilt its shard),
``next_step_at`` (wall clock: when every worker had completed a step after resuming) and
``data_shards``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

from ...errors import OutputFileError, SettingProblem, setting_problem
from ...ft.checkpoint_files import UNREADABLE, print_warning
from ...ft.events import EventLog
from ...ft.membership import Membership
from ...ft.watchdog import watchdog
from ...ps.consistency import Consistency
from ...ps.footprint import refuse_unfit
from ...ps.layout import Layout
from ...ps.server import Server
from ...ps.start import everywhere, table_optimizers
from ...ps.shard_state import ShardState
from ...ps.worker import Worker
from ...runtime.context import Context
from ..config import TrainConfig
from ..data import Dataset
from ..identity import run_identity
from ..model import Model
from ..observe import Observer
from ..partition import assignment
from . import shard_checkpoints
from .final import part_init
from .ledger import PushLedger, count_lost, remove_ledgers
from .loop import WorkerLoop
from .progress import StepHooks
from .recovery import PSRecoveryEvent


@dataclass
class ResumePoint:
    """Checkpoint ``step`` to resume from, written by ``servers`` servers and ``workers``
    workers; ``updates_lost``: acknowledged pieces of the launches before that it lacks."""

    step: int
    servers: int
    workers: int
    updates_lost: int
    pushed_until: int = 0  # 1 + the last step any slot had pushed into C (ASP/SSP)


class LedgeredLoop(WorkerLoop):
    """A worker loop that appends each acknowledged piece to its push ledger."""

    ledger: PushLedger

    duplicates_until = 0  # steps below it were pushed before the relaunch: DUPLICATE pieces are not made again

    def push(self) -> None:
        self.taking_over = self.step < self.duplicates_until
        super().push()

    def acknowledged(self, pieces) -> None:
        step = self.outgoing.step
        super().acknowledged(pieces)
        self.ledger.record([(step, table, key) for table, key in pieces])


class Fallback:
    """Checkpoints, kills and the resume of one rank of a PS run without ULFM (collective to make)."""

    def __init__(self, ctx: Context, config: TrainConfig, model: Model, dataset: Dataset, observer: Observer):
        self.ctx, self.config, self.model, self.dataset = ctx, config, model, dataset
        self.directory = config.fault.checkpoint_dir
        self.specs = model.param_specs()
        self.optimizers = table_optimizers(self.specs, config.optimizer, config.lr)
        self.consistency = Consistency(config.consistency, config.staleness)
        self.events = EventLog()
        identity = run_identity(config, model, next(iter(self.optimizers.values())))
        detected = time.time()
        shard_checkpoints.refuse_foreign(ctx.comm, self.directory, identity)
        self.point: Optional[ResumePoint] = self._find()
        self.keep_pushes = self._same_run_shape(ctx.size - config.servers)
        self.first_step = self._first_step()
        self.hooks = StepHooks(ctx, config.fault, config.fault.schedule(config.seed, protected=(0, config.servers)),
                               Membership.founding(ctx.size, ctx.rank), self.events, observer.echo,
                               self.consistency.aggregates, ask=lambda: None, identity=identity,
                               output_failed=observer.output_failed)
        self.hooks.checkpointed = self.hooks.struck = self.hooks.resume_mark = self.first_step
        self.event = PSRecoveryEvent("resume", self.first_step + 1, 0, detected) if self.point else None
        self.echo = observer.echo

    def _same_run_shape(self, workers: int) -> bool:
        """ASP/SSP resuming with the servers and workers that wrote C: the shards keep C's
        record of each slot's last push (the slots are the same shares of the batches)."""
        point = self.point
        return (point is not None and not self.consistency.aggregates
                and (point.servers, point.workers) == (self.config.servers, workers))

    def _first_step(self) -> int:
        """The step every worker starts at (module docstring, step 4)."""
        point = self.point
        if point is None:
            return 0
        if self.consistency.aggregates or self.keep_pushes:
            return point.step
        return max(point.step, point.pushed_until)

    def _find(self) -> Optional[ResumePoint]:
        """Rank 0 finds the checkpoint to resume from and clears what is newer (step 2 of the
        module docstring); every rank gets its answer, or the same ``OutputFileError``."""
        found: Any = None
        if self.ctx.rank == 0:
            try:
                found = _resume_point(self.directory)
            except UNREADABLE as err:  # a file gone or damaged since it was read, a folder not writable
                found = setting_problem("{checkpoint_dir} {path}: cannot resume from it: {why}", path=self.directory,
                                        why=f"{type(err).__name__}: {err}")
        found = self.ctx.comm.bcast(found, root=0)
        if isinstance(found, SettingProblem):
            raise OutputFileError(found)
        return found

    def start(self, nodes: Sequence[str]) -> Union[Server, Worker]:
        """This rank's server (its shard restored from the resume point, else initial) or worker."""
        ctx, config, step = self.ctx, self.config, self.first_step
        layout = Layout.initial(self.specs, ctx.size, config.servers)
        refuse_unfit(ctx.comm, layout, self.optimizers, False, nodes)
        restored = time.time()

        def make() -> Union[Server, Worker]:
            if not layout.is_server(ctx.rank):
                return Worker(ctx.comm, layout, ctx.traffic, guard=watchdog.guard, clock=step)
            key = layout.shard_of(ctx.rank)
            if self.point is None:
                state = ShardState.create(layout, key, part_init(self.model, config.seed, self.specs), self.optimizers)
            else:
                state = shard_checkpoints.restore_shard(self.directory, self.point.step, key, self.specs,
                                                 layout.placement, self.optimizers, layout.slot_count)
                _restart_at(state, step, self.keep_pushes)
            return Server(ctx.comm, layout, state, self.optimizers, self.consistency, ctx.traffic,
                          guard=watchdog.guard, on_progress=self.hooks.server_progress)
        role = everywhere(ctx, make)
        if self.point is not None:
            self._resumed(layout, time.time() - restored)
        return role

    def _resumed(self, layout: Layout, restore_s: float) -> None:
        point, event = self.point, self.event
        event.ranks_before, event.ranks_after = point.servers + point.workers, self.ctx.size
        event.restore_s = restore_s
        event.checkpoint_step, event.updates_lost = point.step, point.updates_lost
        event.shards_restored = sorted(layout.shard_ranks)
        event.restart_step = point.step + 1 if self.consistency.aggregates else None
        event.data_shards = assignment(list(layout.worker_ranks), self.dataset.shard_sizes("train"))
        self.events.add(event)
        self.echo(f"resumed from the checkpoint of step {point.step} (written by {point.servers} server(s) and "
                  f"{point.workers} worker(s), now {len(layout.shard_ranks)} and {layout.worker_count}); "
                  f"{point.updates_lost} acknowledged updates lost")

    def loop(self, worker: Worker) -> WorkerLoop:
        """The worker's loop from the resume step, logging its acknowledged pushes."""
        loop = LedgeredLoop(worker, self.config, self.model, self.dataset, self.ctx)
        loop.ledger = PushLedger(self.directory, worker.slot, self.first_step)
        loop.step = self.first_step
        loop.duplicates_until = self.point.pushed_until if self.keep_pushes else 0
        loop.before_step = self.hooks.worker_step
        return loop

    def recovery(self) -> List[Dict[str, Any]]:
        """The events as rank 0 (a server: it closed them) has them (collective)."""
        return self.ctx.comm.bcast(self.events.as_dicts(), root=0)


def _resume_point(directory: str) -> Optional[ResumePoint]:
    """Rank 0: the latest complete checkpoint and the pushes it lacks; removes the newer
    checkpoints and the push ledgers."""
    step = shard_checkpoints.latest_complete(directory) or 0
    record = shard_checkpoints.saved_last_pushes(directory, step) if step else {}
    lost = count_lost(directory, step, record, print_warning)
    shard_checkpoints.remove_newer(directory, step)
    remove_ledgers(directory)
    if not step:
        return None
    metadata = shard_checkpoints.step_metadata(directory, step)
    pushed = [int(last.max()) for tables in record.values() for last in tables.values() if last.size]
    return ResumePoint(step, len(metadata["keys"]), int(metadata["slot_count"]), lost, max(pushed, default=-1) + 1)


def _restart_at(state: ShardState, step: int, keep_pushes: bool) -> None:
    """A restored shard ready for workers that all start at ``step``: their clocks at it;
    unless ``keep_pushes`` (the same slots as the checkpoint's), no push of theirs taken yet."""
    state.clocks[:] = step
    state.applied_steps = step
    for table in state.tables.values():
        if not keep_pushes:
            table.last_push[:] = step - 1
        table.read_version[:] = table.version

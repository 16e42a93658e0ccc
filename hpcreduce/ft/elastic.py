"""Ring training that survives dead ranks and takes in new ones.

A step is computed and reduced, then committed by ``Agree``: only when every survivor
reduced it does anyone apply it, so an interrupted step is redone by every survivor
and none is applied twice. State therefore needs no copy to be restorable: what a
rank holds is always the last committed state. On a failure the survivors shrink
(``recovery.shrink_and_rebuild``), are re-ranked in their old order, and rank 0
broadcasts the state (as Horovod's ``State.sync``); the next attempt re-splits the
global batch over the survivors (``train.partition``), so the run computes the same
steps as one without failures, up to summation order. Growth spawns ranks between
steps and broadcasts them the state. Without ULFM, checkpoints (``checkpoint``)
and ``hpcreduce launch --restarts`` take over.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from mpi4py import MPI

from ..runtime.context import Context
from ..runtime.failures import is_process_failure, revoke
from ..runtime.launch import this_program
from . import checkpoint
from .events import EventLog, RecoveryEvent
from .growth import read_target, spawn_and_merge
from .membership import Membership
from .options import FaultConfig
from .recovery import agree_all, shrink_and_rebuild
from .watchdog import watchdog

Echo = Callable[[str], None]


class ElasticRing:
    """Drives ``trainer`` (compute/reduce/apply on a ``TrainState``) through failures and growth."""

    def __init__(self, ctx: Context, trainer, fault: FaultConfig, seed: int, echo: Echo):
        self.ctx, self.trainer, self.fault, self.echo = ctx, trainer, fault, echo
        self.kills = fault.schedule(seed)
        self.events = EventLog()
        self.detected: Optional[float] = None
        self.grown_before = 0  # growth for steps up to this one has been done
        watchdog.deadline_s = fault.deadline_s
        if ctx.joined:
            control = ctx.comm.bcast(None, root=0)
            self.members = Membership.from_control(control, ctx.rank)
            self.grown_before = control["grown_before"]
            self.state = trainer.initial_state()
            self._sync()
        else:
            self.members = Membership.founding(ctx.size, ctx.rank)
            self.state = trainer.initial_state()
            self._resume()

    def run(self, steps: int, on_step: Callable[[object], None]) -> object:
        """Train until ``steps`` steps are committed; ``on_step(metrics)`` after each."""
        state = self.state
        while state.step < steps:
            self._grow_if_asked()
            self.kills.strike("step", state.step + 1, self.members.me, self.members.ids)
            total = self._attempt()
            if total is None:
                self._recover()
                continue
            on_step(self.trainer.apply(state, total))
            for event in self.events.step_completed():
                self.echo(event.line())
            self._checkpoint()
        return state

    def _attempt(self):
        """The step's reduced gradients once every rank has them, else None (a rank failed).

        A rank that sees a failure revokes the communicator, so no peer stays blocked in
        a collective waiting for it; then every rank ends the attempt with one agreement.
        """
        total, ok = None, True
        try:
            with watchdog.guard(f"step {self.state.step + 1} (compute and allreduce)"):
                total = self.trainer.reduce(self.trainer.compute(self.state))
        except MPI.Exception as error:
            if not (self.ctx.ft and is_process_failure(error, self.ctx.comm)):
                raise
            ok = False
            self.detected = self.detected or time.time()
            revoke(self.ctx.comm)
        if not self.ctx.ft:
            return total
        with watchdog.guard(f"step {self.state.step + 1} (commit agreement)"):
            if agree_all(self.ctx.comm, ok):
                return total
        self.detected = self.detected or time.time()
        return None

    def _recover(self) -> None:
        """Shrink to the survivors, restore the committed state on all of them, go on.

        Each round ends, on every rank, with exactly one agreement (as each step does):
        a rank whose restore failed must not start the next shrink while its peers are
        still agreeing, since a shrink runs an agreement of its own.
        """
        step = self.state.step + 1
        event = self.events.add(RecoveryEvent("failure", step, self.ctx.size, self.detected or time.time()))
        self.detected = None
        while True:
            with watchdog.guard(f"recovery at step {step} (revoke, shrink, agree)"):
                shrunk = shrink_and_rebuild(self.ctx.comm, before_shrink=lambda: self.kills.strike(
                    "recovery", step, self.members.me, self.members.ids))
            self.ctx.replace_comm(shrunk.comm)
            event.lost += self.members.shrink(shrunk)
            event.rounds += shrunk.rounds
            event.shrink_s = time.time() - event.detected_at
            restored = True
            try:
                with watchdog.guard(f"recovery at step {step} (restore)"):
                    self._sync()
            except MPI.Exception as error:
                if not is_process_failure(error, self.ctx.comm):
                    raise
                restored = False
                revoke(self.ctx.comm)
            with watchdog.guard(f"recovery at step {step} (commit agreement)"):
                if agree_all(self.ctx.comm, restored):
                    break
        event.ranks_after = self.ctx.size
        event.restore_s = time.time() - event.detected_at - event.shrink_s
        if self.fault.replace and event.lost:
            self._grow(len(event.lost), "replacement")

    def _grow_if_asked(self) -> None:
        """Growth due before this step: ``--grow`` entries and the ``--discover`` file."""
        step = self.state.step + 1
        if step <= self.grown_before:
            return
        self.grown_before = step
        count = sum(n for n, at in self.fault.grow if at == step)
        if self.fault.discover and step % self.fault.discover_every == 0:
            target = read_target(self.fault.discover) if self.ctx.rank == 0 else None
            target = self.ctx.comm.bcast(target, root=0)
            if target is not None and target > self.ctx.size + count:
                count = target - self.ctx.size
        if count:
            self._grow(count, "growth")

    def _grow(self, count: int, kind: str) -> None:
        step = self.state.step + 1
        event = self.events.add(RecoveryEvent(kind, step, self.ctx.size, time.time()))
        with watchdog.guard(f"{kind} at step {step} (spawn and merge)"):
            merged = spawn_and_merge(self.ctx.comm, count, this_program())
        self.ctx.replace_comm(merged)
        event.joined = self.members.grow(count)
        started = time.time()
        with watchdog.guard(f"{kind} at step {step} (state to newcomers)"):
            self.ctx.comm.bcast({**self.members.control(), "grown_before": self.grown_before}, root=0)
            self._sync()
        event.ranks_after = self.ctx.size
        event.restore_s = time.time() - started

    def _sync(self) -> None:
        """Every rank takes rank 0's state (step, parameters, optimizer state)."""
        comm = self.ctx.comm
        self.state.step = comm.bcast(self.state.step, root=0)
        for _name, array in self.state.arrays():
            comm.Bcast(array, root=0)

    def _checkpoint(self) -> None:
        every, folder, step = self.fault.checkpoint_every, self.fault.checkpoint_dir, self.state.step
        if not (folder and every and step % every == 0) or self.ctx.rank != 0:
            return
        checkpoint.save(folder, step, dict(self.state.arrays()), {"ranks": self.ctx.size},
                        halfway=lambda: self.kills.strike("checkpoint", step, self.members.me,
                                                          self.members.ids))

    def _resume(self) -> None:
        """Start from the latest checkpoint, if there is one (any number of ranks)."""
        if not self.fault.checkpoint_dir:
            return
        found = checkpoint.load_latest(self.fault.checkpoint_dir)
        if found is None:
            return
        metadata, arrays = found
        for name, array in self.state.arrays():
            array[...] = arrays[name]
        self.state.step = int(metadata["step"])
        event = self.events.add(RecoveryEvent("resume", self.state.step + 1, int(metadata["ranks"]), time.time()))
        event.ranks_after = self.ctx.size
        self.echo(f"resumed from the checkpoint of step {self.state.step} "
                  f"(written by {metadata['ranks']} ranks, now {self.ctx.size})")

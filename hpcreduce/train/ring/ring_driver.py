"""Ring training that survives dead ranks and takes in new ones.

A step is computed and reduced, then committed by ``Agree`` (``ft.rounds.attempt``):
only when every survivor reduced it does anyone apply it, so an interrupted step is
redone by every survivor and none is applied twice. State therefore needs no copy to
be restorable: what a rank holds is always the last committed state. On a failure the
survivors shrink (``ft.rounds.shrink_until_restored``), are re-ranked in their old
order, and rank 0 broadcasts the state (as Horovod's ``State.sync``); the next attempt
re-splits the global batch over the survivors (``train.partition``), so the run
computes the same steps as one without failures, up to summation order. Growth spawns
ranks between steps (``ft.resize`` says when) and broadcasts them the state; scale-in
(``--leave``, a discovery file asking for fewer ranks or hosts) splits the communicator
without the leavers, which exit at once: every rank holds the committed state, so nothing
moves but the leavers' share of the batch. Without
ULFM, checkpoints (``ft.checkpoint_files``) and a relaunch take over. State on the GPU is
broadcast from device memory where MPI is CUDA-aware and through host copies otherwise
(``collectives.broadcast``); checkpoints store host copies and restore onto the device.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple, TypeVar

from ...arrays import copy_into
from ...collectives.broadcast import broadcast_arrays
from ...errors import CheckpointMismatchError, OutputFileError, setting_problem
from ...ft import checkpoint_files
from ...ft.faults import FaultConfig
from ...ft.events import EventLog, RecoveryEvent
from ...ft.resize import Wanted, known_hosts
from ...ft.membership import Membership
from ...ft.rounds import Shrunk, attempt, shrink_until_restored
from ...ft.watchdog import watchdog
from ...runtime.context import Context
from ...runtime.files import remove_stale_temporaries
from ...runtime.launch import this_program
from ...runtime.nodes import rank_nodes
from ...runtime.spawn import leave_job, spawn_and_merge, split_off
from ..identity import run_identity
from ..partition import assignment
from .ring_state import TrainState
from .ring_steps import RingTrainer, StepGrads, StepMetrics

Echo = Callable[[str], None]
T = TypeVar("T")


@dataclass
class RingRecoveryEvent(RecoveryEvent):
    """``RecoveryEvent`` plus ``data_shards``: ``[rank id, [shards]]``: the training shards
    each rank reads after a failure, growth or leave (``partition.assignment``)."""

    data_shards: List[List[Any]] = field(default_factory=list)


class ElasticRing:
    """Drives ``trainer`` (compute/reduce/apply on a ``TrainState``) through failures, growth and leaves."""

    def __init__(self, ctx: Context, trainer: RingTrainer, fault: FaultConfig, seed: int, echo: Echo):
        self.ctx, self.trainer, self.fault, self.echo = ctx, trainer, fault, echo
        self.kills = fault.schedule(seed)
        self.events = EventLog()
        self.detected: Optional[float] = None
        self.grown_before = 0  # growth and leaves for steps up to this one have been done
        self.warned: Optional[str] = None  # the discovery file's problem at the last poll (printed once)
        watchdog.deadline_s = fault.deadline_s
        self.state: TrainState = trainer.initial_state()
        self.identity = run_identity(trainer.config, trainer.model, trainer.optimizer)
        if ctx.joined:
            control = ctx.comm.bcast(None, root=0)
            self.members = Membership.from_control(control, ctx.rank)
            self.grown_before = control["grown_before"]
            self._sync()
        else:
            self.members = Membership.founding(ctx.size, ctx.rank)
            self._resume()

    def run(self, steps: int, on_step: Callable[[StepMetrics], None]) -> TrainState:
        """Train until ``steps`` steps are committed; ``on_step(metrics)`` after each."""
        state = self.state
        while state.step < steps:
            if not self._resize_if_asked():
                continue
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

    def _attempt(self) -> Optional[StepGrads]:
        """The step's reduced gradients once every rank has them, else None (a rank failed)."""
        return self._together(lambda: self.trainer.reduce(self.trainer.compute(self.state)),
                              f"step {self.state.step + 1} (compute and allreduce)")

    def _together(self, work: Callable[[], T], what: str) -> Optional[T]:
        """``work()``'s result (never None) once every rank has done it, else None (a rank failed)."""
        if not self.ctx.ft:
            with watchdog.guard(what):
                return work()
        outcome = attempt(self.ctx.comm, work, what)
        if outcome.committed:
            return outcome.result
        self.detected = self.detected or outcome.failed_at or time.time()
        return None

    def _recover(self) -> None:
        """Shrink to the survivors, restore the committed state on all of them, go on."""
        step = self.state.step + 1
        event = self.events.add(RingRecoveryEvent("failure", step, self.ctx.size, self.detected or time.time()))
        self.detected = None

        def restore(shrunk: Shrunk) -> None:
            event.lost += self.members.shrink(shrunk)
            event.rounds += shrunk.rounds
            event.shrink_s = time.time() - event.detected_at
            self._sync()

        shrink_until_restored(self.ctx, restore, f"recovery at step {step}", before_shrink=lambda: self.kills.strike(
            "recovery", step, self.members.me, self.members.ids))
        event.ranks_after = self.ctx.size
        event.restore_s = time.time() - event.detected_at - event.shrink_s
        event.data_shards = self._data_shards()
        if self.fault.replace and event.lost:
            self._grow(len(event.lost), "replacement")

    def _resize_if_asked(self) -> bool:
        """Leaves, then growth, due before this step (``FaultConfig.growth``); the discovery
        file is read by rank 0 and its answer broadcast. False when a rank failed meanwhile
        (then recovered: the change is asked for again before the step)."""
        step, rule = self.state.step + 1, self.fault.growth
        if step <= self.grown_before:
            return True
        requested = time.time()
        polled: Optional[Tuple[Any, List[str]]] = (None, [])
        if rule.reads_target(step):
            polled = self._together(lambda: self._poll(step), f"discovery file before step {step}")
        if polled is None:
            self._recover()
            return False
        wanted, nodes = polled
        leaving = rule.leavers(self.grown_before, step, self.members.ids, nodes, wanted)
        if leaving and not self._leave(leaving, requested):
            return False
        count = rule.count(self.grown_before, step, self.ctx.size, wanted)
        self.grown_before = step
        if count:
            self._grow(count, "growth")
        return True

    def _poll(self, step: int) -> Tuple[Optional[Wanted], List[str]]:
        """What the discovery file asks for (rank 0 reads it; everyone gets the answer) and the
        node of every rank. A problem with the file is printed once and changes nothing."""
        nodes = rank_nodes(self.ctx.comm)
        found = None
        if self.ctx.rank == 0:
            found = self.fault.growth.wanted(step, known_hosts(nodes, self.fault.hostfile))
        found = self.ctx.comm.bcast(found, root=0)
        problem = found if isinstance(found, str) else None
        if problem and problem != self.warned:
            self.echo(f"warning: {problem}; the job goes on unchanged (fix the file: it is read again)")
        self.warned = problem
        return (None if problem else found), nodes

    def _leave(self, leaving: List[int], requested: float) -> bool:
        """The ranks with ids ``leaving`` leave: the communicator is split without them (one
        attempt: a failure meanwhile is recovered and False returned) and they exit. Needs
        ULFM (``FaultConfig.needs_ulfm``)."""
        step, going = self.state.step + 1, self.members.me in leaving
        outcome = attempt(self.ctx.comm, lambda: [split_off(self.ctx.comm, going)], f"leave at step {step} (split)")
        if not outcome.committed:
            if outcome.result and outcome.result[0] is not None:
                outcome.result[0].Free()
            self.detected = self.detected or outcome.failed_at or time.time()
            self._recover()
            return False
        staying = outcome.result[0]
        if staying is None:  # a spawned rank finalizes: its exit would end its spawned job (``leave_job``)
            leave_job(self.ctx.comm, finalize=self.ctx.joined)
        event = self.events.add(RingRecoveryEvent("leave", step, self.ctx.size, requested))
        event.requested_at = requested
        self.ctx.replace_comm(staying)
        self.members.leave(leaving)
        event.left = list(leaving)
        event.ranks_after = self.ctx.size
        event.restore_s = time.time() - requested
        event.data_shards = self._data_shards()
        return True

    def _grow(self, count: int, kind: str) -> None:
        step = self.state.step + 1
        event = self.events.add(RingRecoveryEvent(kind, step, self.ctx.size, time.time()))
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
        event.data_shards = self._data_shards()

    def _sync(self) -> None:
        """Every rank takes rank 0's state (step, parameters, optimizer state)."""
        self.state.step = self.ctx.comm.bcast(self.state.step, root=0)
        broadcast_arrays(self.ctx, [array for _name, array in self.state.arrays()], root=0)

    def _data_shards(self) -> List[List[int]]:
        """Who reads which training shards now: every rank, in rank order, by its stable id."""
        return assignment(self.members.ids, self.trainer.dataset.shard_sizes("train"))

    def _checkpoint(self) -> None:
        """Rank 0 writes the checkpoint when one is due; every rank learns whether it could
        (an ``OutputFileError`` everywhere if not; rank 0 dying meanwhile is recovered)."""
        every, folder, step = self.fault.checkpoint_every, self.fault.checkpoint_dir, self.state.step
        if not (folder and every and step % every == 0):
            return
        failure = None
        if self.ctx.rank == 0:
            try:
                checkpoint_files.save(folder, step, dict(self.state.arrays()),
                                {"ranks": self.ctx.size, "identity": self.identity},
                                halfway=lambda: self.kills.strike("checkpoint", step, self.members.me,
                                                                  self.members.ids))
            except OutputFileError as err:
                failure = err.parts
        shared = self._together(lambda: [self.ctx.comm.bcast(failure, root=0)], f"checkpoint of step {step}")
        if shared is None:
            self._recover()
        elif shared[0]:
            raise OutputFileError(*shared[0])

    def _resume(self) -> None:
        """Start from the latest checkpoint, if there is one (any number of ranks) and it
        was written by this run (``train.identity``); a foreign one is refused on every rank."""
        folder = self.fault.checkpoint_dir
        if not folder:
            return
        if self.ctx.rank == 0:  # the writer, before it writes
            remove_stale_temporaries(folder)
        found = checkpoint_files.load_latest(folder, checkpoint_files.print_warning if self.ctx.rank == 0 else _silent)
        if found is None:
            return
        metadata, arrays = found
        problem = checkpoint_files.identity_problem(metadata, self.identity)
        if problem:
            raise CheckpointMismatchError(setting_problem("{checkpoint_dir} {path}: its checkpoint of step {step} "
                                                          "{why}; give another folder or empty it",
                                                          path=folder, step=metadata["step"], why=problem))
        for name, array in self.state.arrays():
            copy_into(array, arrays[name])
        self.state.step = int(metadata["step"])
        event = self.events.add(RecoveryEvent("resume", self.state.step + 1, int(metadata["ranks"]), time.time()))
        event.ranks_after = self.ctx.size
        self.echo(f"resumed from the checkpoint of step {self.state.step} "
                  f"(written by {metadata['ranks']} ranks, now {self.ctx.size})")


def _silent(_text: str) -> None:
    """Warnings of ranks other than rank 0 (which prints the same)."""

"""Ring training that survives dead ranks, takes in new ones and lets ranks leave:
``elastic.State`` and ``elastic.run`` with the ring's policy.

A step is computed and reduced, then committed by ``Agree`` (``elastic.agreed``): only
when every survivor reduced it does anyone apply it, so an interrupted step is redone by
every survivor and none is applied twice. The state (step, parameters, optimizer state) is
therefore tracked ``no_copy``: what a rank holds is always the last committed state, and a
commit copies nothing. On a failure ``elastic.run`` shrinks to the survivors (re-ranked in
their old order) and rank 0's state becomes everyone's (``State.sync``); the next step
re-splits the global batch over the survivors (``train.partition``), so the run computes the
same steps as one without failures, up to summation order. Growth and scale-in (``--grow``,
``--leave``, a discovery file, ``FaultConfig.growth``) are asked for before each step
(``elastic.request_resize``) and carried out by ``run``: newcomers get the membership, the
bookkeeping and the state; leavers exit at once (every rank holds the committed state, so
nothing moves but their share of the batch). ``--replace`` spawns one rank per rank lost.
Kills (``FaultConfig.schedule``) strike at a step's start here, in a recovery and half way
through a checkpoint in ``elastic``. Without ULFM every step runs under the deadline watchdog,
and checkpoints (``elastic.save_checkpoint``) and a relaunch take over (resumed at start).
A stop signal (``runtime.stop``) rides in the step's reduced statistics: every rank applies
and commits that step, the checkpoint of it is written, and every rank raises ``StoppedEarly``.
State on the GPU is broadcast from device memory where MPI is CUDA-aware and through host
copies otherwise (``collectives.broadcast``); checkpoints store host copies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from ... import elastic
from ...errors import OutputFileError
from ...ft.faults import FaultConfig
from ...ft.resize import known_hosts
from ...ft.watchdog import watchdog
from ...runtime.context import Context
from ...runtime.stop import StoppedEarly, requests
from ..identity import run_identity
from ..partition import assignment
from .ring_state import TrainState
from .ring_steps import RingTrainer, StepMetrics

TRACKED = ("step", "params", "optimizer_state")
"""What the ring's ``elastic.State`` holds, all ``no_copy`` (changed only once a step is agreed)."""


@dataclass(frozen=True)
class Saving:
    """Checkpoints every ``every`` steps into ``folder`` (none without one), the newest ``keep``
    kept, marked ``identity`` (``train.identity``: a checkpoint of another run is refused)."""

    folder: Optional[str]
    every: int
    keep: int
    identity: Dict[str, Any]

    @classmethod
    def of(cls, trainer: RingTrainer, fault: FaultConfig) -> "Saving":
        return cls(fault.checkpoint_dir, fault.checkpoint_every, fault.checkpoint_keep,
                   run_identity(trainer.config, trainer.model, trainer.optimizer))

    def due(self, step: int) -> bool:
        return bool(self.folder and self.every and step % self.every == 0)


def ring_state(ctx: Context, trainer: RingTrainer, fault: FaultConfig, seed: int, saving: Saving,
               echo: Callable[[str], None]) -> elastic.State:
    """The ring's ``elastic.State`` with its policy: the initial state, or the latest checkpoint
    of ``saving``'s folder (not on a newcomer: it gets the job's state)."""
    watchdog.deadline_s = fault.deadline_s
    shards = trainer.dataset.shard_sizes("train")
    policy = elastic.Policy(growth=fault.growth, known_hosts=lambda nodes: known_hosts(nodes, fault.hostfile),
                            replace=fault.replace, kills=fault.schedule(seed), echo=echo, warn=echo,
                            data_shards=lambda ids: assignment(ids, shards), step_of=lambda state: state.step + 1,
                            needs_ulfm=False, marks_done=False)
    initial = trainer.initial_state()
    state = elastic.State(context=ctx, policy=policy, no_copy=TRACKED, step=initial.step, params=initial.params,
                          optimizer_state=initial.optimizer_state)
    if saving.folder and not ctx.joined:
        resumed = elastic.resume_checkpoint(state, saving.folder, saving.identity, dict(current(state).arrays()))
        state.step = initial.step if resumed is None else resumed
    return state


def train_steps(state: elastic.State, trainer: RingTrainer, saving: Saving, steps: int,
                on_step: Callable[[StepMetrics], None]) -> TrainState:
    """Train until ``steps`` steps are committed (``on_step(metrics)`` after each), through
    failures, growth and leaves (``elastic.run``); the final state. The changes of ranks are
    ``state.job.changes`` (the JSON's ``recovery``)."""
    elastic.run(_train_steps)(state, trainer, steps, on_step, saving)
    return current(state)


def current(state: elastic.State) -> TrainState:
    """The ring's state as the trainer takes it: the tracked arrays themselves, and the step."""
    return TrainState(state.params, state.optimizer_state, state.step)


def _train_steps(state: elastic.State, trainer: RingTrainer, steps: int, on_step: Callable[[StepMetrics], None],
                 saving: Saving) -> None:
    """The step loop ``elastic.run`` calls (again after each change of ranks)."""
    ctx, kills = state.context, state.job.policy.kills
    while state.step < steps:
        step = state.step + 1
        elastic.request_resize(state, step)
        kills.strike("step", step, state.members.me, state.members.ids)
        now = current(state)
        total = elastic.agreed(ctx, lambda: trainer.reduce(trainer.compute(now)),
                               f"step {step} (compute and allreduce)")
        on_step(trainer.apply(now, total))
        state.step = now.step
        state.commit(check_resize=False)
        stopping = bool(total.stats[4])  # a stop signal reached some rank: the same on every rank
        if saving.due(state.step) or (stopping and saving.folder):
            try:
                elastic.save_checkpoint(state, saving.folder, state.step, dict(now.arrays()),
                                        {"identity": saving.identity}, saving.keep)
            except OutputFileError as err:
                raise OutputFileError(*err.parts, f" (a stop signal came: the run stopped after step {state.step} "
                                      "and cannot resume from it)" if stopping else "") from err
        if stopping:
            raise StoppedEarly(state.step, saving.folder, requests.seen)

"""What a PS run does as its steps advance: injected kills and periodic shard checkpoints.

Fault injection (``PSKills``; ``--kill ID@STEP``, ``--kill-node``, ``--kill-random``): a
worker dies at the start of its step STEP, a server when the slowest clock reaches STEP - 1
(every worker is done with step STEP - 1); recovery-phase kills fire in the first recovery
whose step is at least STEP; checkpoint-phase kills half way through writing that step's
checkpoint. Checkpoints (``ShardCheckpoints``): each server writes its shard when the
slowest clock reaches a multiple of ``checkpoint_every``. ``StepProgress`` does both as the
steps advance, and closes the recovery events (their time to the next step) once the slowest
clock passes the step they resumed at. Growth and leaves are asked for elsewhere
(``resize_requests``). The ids alive are the caller's current membership.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from ...errors import OutputFileError
from ...ft.events import EventLog
from ...ft.inject import KillSchedule
from ...ft.membership import Membership
from ...ps.server import NOBODY_LIVE, Server
from .ps_setup import PSSetup
from .shard_checkpoints import save_shard


class PSKills:
    """The kill schedule of one rank, struck once per step and phase (``start``: the steps
    before it were struck in an earlier launch or before this rank joined)."""

    def __init__(self, schedule: KillSchedule, start: int = 0):
        self.schedule = schedule
        self.struck = self.struck_recovery = start

    def worker_step(self, step: int, me: int, alive: Sequence[int]) -> None:
        """A worker starts step ``step`` (from 1)."""
        if step > self.struck:
            self.struck = step
            self.schedule.strike("step", step, me, alive)

    def server_progress(self, slowest: int, me: int, alive: Sequence[int]) -> None:
        """A server saw the slowest clock reach ``slowest``: the server kills of the steps up to ``slowest + 1``."""
        for step in range(self.struck + 1, slowest + 2):
            self.struck = step
            self.schedule.strike("step", step, me, alive)

    def recovery(self, step: int, me: int, alive: Sequence[int]) -> None:
        """Recovery-phase kills at or before ``step`` not yet done."""
        for at in range(self.struck_recovery + 1, step + 1):
            self.schedule.strike("recovery", at, me, alive)
        self.struck_recovery = max(self.struck_recovery, step)

    def checkpoint(self, step: int, me: int, alive: Sequence[int]) -> None:
        self.schedule.strike("checkpoint", step, me, alive)


class ShardCheckpoints:
    """A server's periodic checkpoints of its shard (``start``: the last step checkpointed).
    A checkpoint that cannot be written is told to ``failed`` once (the run goes on without
    checkpoints and fails at the end, on every rank)."""

    def __init__(self, setup: PSSetup, failed: Callable[[OutputFileError], None], start: int = 0):
        self.setup, self.failed = setup, failed
        self.done, self.saving = start, True

    def progress(self, server: Server, slowest: int, halfway: Callable[[int], None]) -> None:
        """The slowest clock is ``slowest``: write the checkpoint due, if any (``halfway(step)``
        runs half way through writing it: fault injection)."""
        fault = self.setup.fault
        if not (fault.checkpoint_every and fault.checkpoint_dir and self.saving):
            return
        step = slowest - slowest % fault.checkpoint_every
        if step <= self.done:
            return
        self.done = step
        try:
            save_shard(fault.checkpoint_dir, step, server.state, sorted(server.layout.shard_ranks),
                       self.setup.tables.consistency.aggregates, identity=self.setup.identity,
                       keep=fault.checkpoint_keep, halfway=lambda: halfway(step))
        except OutputFileError as err:
            self.saving = False
            self.failed(err)


class StepProgress:
    """One rank's kills, checkpoints and closing of recovery events as the steps advance
    (``echo``: prints a line on rank 0)."""

    def __init__(self, kills: PSKills, checkpoints: ShardCheckpoints, events: EventLog, echo: Callable[[str], None]):
        self.kills, self.checkpoints, self.events, self.echo = kills, checkpoints, events, echo
        self.on_server: Optional[Callable[[Server, int], None]] = None  # ps mode's live lines (``live_lines``)

    def worker_step(self, step: int, members: Membership) -> None:
        """A worker starts step ``step`` (from 1)."""
        self.kills.worker_step(step, members.me, members.ids)

    def server_progress(self, server: Server, slowest: int, resume_mark: int, members: Membership) -> bool:
        """A server saw the slowest live clock move to ``slowest`` (NOBODY_LIVE: every worker
        released it; then False, else True); ``resume_mark``: the clock the last recovery resumed at."""
        if self.on_server is not None:
            self.on_server(server, slowest)
        if slowest > resume_mark:
            for event in self.events.step_completed():
                self.echo(event.line())
        if slowest == NOBODY_LIVE:
            return False
        self.kills.server_progress(slowest, members.me, members.ids)
        self.checkpoints.progress(server, slowest, lambda step: self.kills.checkpoint(step, members.me, members.ids))
        return True

"""What a fault-tolerant PS run does as its steps advance: kills, checkpoints, growth requests.

Workers call ``worker_step(step)`` at the start of each step; servers call
``server_progress(server, slowest)`` whenever the slowest live worker's clock moves.
Fault injection (``--kill ID@STEP``): a worker dies at the start of its step STEP, a
server when the slowest clock reaches STEP - 1 (every worker is done with step STEP - 1);
recovery-phase kills fire in the first recovery whose step is at least STEP
(``strike_recovery``). Servers checkpoint their shard when the slowest clock reaches a
multiple of ``checkpoint_every``, and rank 0 (a server) asks for growth due before the
next step by revoking the communicator (the recovery that follows spawns the newcomers).
The first steps after a recovery close its event (its time to the next step).
"""
from __future__ import annotations

from typing import Callable, Mapping, Tuple

from ...errors import OutputFileError
from ...ft.config import FaultConfig
from ...ft.events import EventLog
from ...ft.inject import KillSchedule
from ...ft.membership import Membership
from ...ps.server import NOBODY_LIVE, Server
from ...runtime.context import Context
from .checkpoint import save_shard

Echo = Callable[[str], None]


class StepHooks:
    """The step hooks of one rank (see the module docstring).

    ``growth_wanted``: (newcomers, before step) rank 0 asked for; ``ask``: called when it
    does (revokes the communicator); ``resume_mark``: the slowest clock right after the
    last recovery; ``grown_before``: growth is done for steps up to it; ``identity``: the
    run's, written into its checkpoints; ``output_failed``: told of a checkpoint that could
    not be written (the run goes on without checkpoints and fails at the end, everywhere).
    """

    def __init__(self, ctx: Context, fault: FaultConfig, kills: KillSchedule, members: Membership,
                 events: EventLog, echo: Echo, aggregates: bool, ask: Callable[[], None],
                 identity: Mapping[str, object], output_failed: Callable[[OutputFileError], None]):
        self.ctx, self.fault, self.kills, self.events, self.echo = ctx, fault, kills, events, echo
        self.members, self.aggregates, self.ask, self.identity = members, aggregates, ask, identity
        self.output_failed, self.saving = output_failed, True
        self.struck = self.struck_recovery = self.checkpointed = self.resume_mark = 0
        self.growth_wanted: Tuple[int, int] = (0, 0)
        self.grown_before = 0

    def strike(self, phase: str, step: int) -> None:
        self.kills.strike(phase, step, self.members.me, self.members.ids)

    def worker_step(self, step: int) -> None:
        """A worker starts step ``step`` (from 1)."""
        if step > self.struck:
            self.struck = step
            self.strike("step", step)

    def strike_recovery(self, step: int) -> None:
        """Recovery-phase kills at or before ``step`` not yet done."""
        for at in range(self.struck_recovery + 1, step + 1):
            self.strike("recovery", at)
        self.struck_recovery = max(self.struck_recovery, step)

    def server_progress(self, server: Server, slowest: int) -> None:
        """The slowest live worker's clock is now ``slowest`` (NOBODY_LIVE: all released)."""
        if slowest > self.resume_mark:
            for event in self.events.step_completed():
                self.echo(event.line())
        if slowest == NOBODY_LIVE:
            return
        for step in range(self.struck + 1, slowest + 2):
            self.struck = step
            self.strike("step", step)
        self._checkpoint(server, slowest)
        if self.ctx.rank == 0:
            self._ask_growth(slowest + 1)

    def _checkpoint(self, server: Server, slowest: int) -> None:
        every, directory = self.fault.checkpoint_every, self.fault.checkpoint_dir
        if not (every and directory and self.saving):
            return
        step = slowest - slowest % every
        if step > self.checkpointed:
            self.checkpointed = step
            try:
                save_shard(directory, step, server.state, sorted(server.layout.shard_ranks), self.aggregates,
                           identity=self.identity, halfway=lambda: self.strike("checkpoint", step))
            except OutputFileError as err:
                self.saving = False
                self.output_failed(err)

    def _ask_growth(self, step: int) -> None:
        """Rank 0: growth due before ``step``? Then revoke, so that everyone recovers and grows."""
        if self.growth_wanted[0] or step <= self.grown_before:
            return
        rule = self.fault.growth
        count = rule.count(self.grown_before, step, self.ctx.size, rule.target(step))
        if count:
            self.growth_wanted = (count, step)
            self.ask()

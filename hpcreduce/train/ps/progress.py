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

from typing import Callable, Dict, List, Mapping, Optional, Tuple

from ...errors import OutputFileError
from ...ft.faults import FaultConfig
from ...ft.events import EventLog
from ...ft.resize import known_hosts
from ...ft.inject import KillSchedule
from ...ft.membership import Membership
from ...ps.server import NOBODY_LIVE, Server
from ...runtime.context import Context
from .shard_checkpoints import save_shard

Echo = Callable[[str], None]


class StepHooks:
    """The step hooks of one rank (see the module docstring).

    ``growth_wanted``/``servers_wanted``: (newcomer workers/servers, before step) rank 0 asked for;
    ``leave_wanted``: (ids leaving, before step), from ``--leave`` and the discovery file; ``ask``: called when it
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
        self.servers_wanted: Tuple[int, int] = (0, 0)
        self.leave_wanted: Tuple[Tuple[int, ...], int] = ((), 0)
        self.nodes: Dict[int, str] = {}  # stable id -> node, for a discovery file of hosts
        self.warned: Optional[str] = None  # the last warning printed
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
            self._ask_growth(slowest + 1, server)

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

    def _ask_growth(self, step: int, server: Server) -> None:
        """Rank 0: growth due before ``step``? Then revoke, so that everyone recovers and grows."""
        if self.growth_wanted[0] or self.servers_wanted[0] or self.leave_wanted[0] or step <= self.grown_before:
            return
        if step < 2:  # not before every rank is done starting: a revoke then has broken their start-up collectives
            return
        rule, ids = self.fault.growth, self.members.ids
        hosts = [self.nodes.get(identity, "") for identity in ids]
        wanted = rule.wanted(step, known_hosts(hosts, self.fault.hostfile)) if rule.discover else None
        if isinstance(wanted, str):
            self._warn(f"{wanted}; the job goes on unchanged (fix the file: it is read again)")
            wanted = None
        servers = [ids[rank] for rank in sorted(server.layout.shard_ranks.values())]
        leaving, kept = kept_going(rule.leavers(self.grown_before, step, ids, hosts, wanted),
                                   [servers, [ids[rank] for rank in server.layout.worker_ranks]])
        for identity in kept:
            self._warn(f"the last {'server' if identity in servers else 'worker'} (id {identity}) cannot leave; "
                       "it stays")
        count = rule.count(self.grown_before, step, self.ctx.size - len(leaving), wanted)
        added = sum(n for n, at in self.fault.grow_servers if self.grown_before < at <= step)
        if count or added or leaving:
            self.growth_wanted, self.servers_wanted = (count, step), (added, step)
            self.leave_wanted = (tuple(leaving), step)
            self.ask()

    def _warn(self, text: str) -> None:
        """Print a warning, once until it changes (the discovery file is read every few steps)."""
        if text != self.warned:
            self.echo(f"warning: {text}")
        self.warned = text


def kept_going(leaving: List[int], roles: List[List[int]]) -> Tuple[List[int], List[int]]:
    """``leaving`` (ids) without the first id of each role (``roles``: the ids of each, the
    servers', the workers') that would lose every member, and the ids so kept: the run needs a
    server and a worker (``--leave`` of every server is refused before launch)."""
    kept = [members[0] for members in roles if members and set(members) <= set(leaving)]
    return [identity for identity in leaving if identity not in kept], kept

"""Rank 0's record of the membership changes it asks for in a fault-tolerant PS run.

As the slowest clock moves, rank 0 (a server) asks ``ResizeRequests.due`` whether growth
(``--grow``, the discovery file), server growth (``--grow-servers``) or leaves (``--leave``,
a discovery file listing fewer ranks or hosts) are due before the next step; if so it keeps the
request (``pending``) and revokes the communicator, and the recovery round that follows
carries the request in every rank's report (``ps.recovery_plan.Report``) into its plan. A
problem with the discovery file is printed once and changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from ...ft.resize import discovery_warning, known_hosts
from ...ps.layout import Layout
from .ps_setup import PSSetup


@dataclass(frozen=True)
class Resize:
    """What rank 0 asked for, all due before ``step``: ``workers`` and ``servers`` to add, the
    ids ``leaving``."""

    step: int = 0
    workers: int = 0
    servers: int = 0
    leaving: Tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.workers or self.servers or self.leaving)

    @property
    def growth(self) -> Tuple[int, int]:
        return self.workers, self.step

    @property
    def server_growth(self) -> Tuple[int, int]:
        return self.servers, self.step

    @property
    def leave(self) -> Tuple[Tuple[int, ...], int]:
        return self.leaving, self.step


class ResizeRequests:
    """Rank 0's pending request (``pending``; empty when none) and the discovery file's last problem."""

    def __init__(self, setup: PSSetup, warn: Callable[[str], None]):
        self.setup, self.warn = setup, warn
        self.pending = Resize()
        self.warned: Optional[str] = None

    def due(self, step: int, done_before: int, ids: Sequence[int], nodes: Mapping[int, str],
            layout: Layout) -> Resize:
        """The changes due before ``step`` (growth and leaves before ``done_before`` done; ``ids``:
        by rank; ``nodes``: by id), kept as ``pending``; empty while one is pending."""
        if self.pending or step <= done_before or step < 2:  # not before every rank is done starting:
            return Resize()                                   # a revoke then breaks their start-up collectives
        fault = self.setup.fault
        rule = fault.growth
        hosts = [nodes.get(identity, "") for identity in ids]
        wanted = rule.wanted(step, known_hosts(hosts, fault.hostfile)) if rule.discover else None
        note = discovery_warning(wanted)
        if note:
            self._warn(note)
        if isinstance(wanted, str):
            wanted = None
        servers = [ids[rank] for rank in sorted(layout.shard_ranks.values())]
        leaving, kept = kept_going(rule.leavers(done_before, step, ids, hosts, wanted),
                                   [servers, [ids[rank] for rank in layout.worker_ranks]])
        for identity in kept:
            self._warn(f"the last {'server' if identity in servers else 'worker'} (id {identity}) cannot leave; "
                       "it stays")
        count = rule.count(done_before, step, len(ids) - len(leaving), wanted)
        added = sum(n for n, at in fault.grow_servers if done_before < at <= step)
        found = Resize(step, count, added, tuple(leaving))
        self.pending = found if found else Resize()
        return self.pending

    def _warn(self, text: str) -> None:
        """Print a warning, once until it changes (the discovery file is read every few steps)."""
        if text != self.warned:
            self.warn(f"warning: {text}")
        self.warned = text


def kept_going(leaving: List[int], roles: List[List[int]]) -> Tuple[List[int], List[int]]:
    """``leaving`` (ids) without the first id of each role (``roles``: the ids of each, the
    servers', the workers') that would lose every member, and the ids so kept: the run needs a
    server and a worker (``--leave`` of every server is refused before launch)."""
    kept = [members[0] for members in roles if members and set(members) <= set(leaving)]
    return [identity for identity in leaving if identity not in kept], kept

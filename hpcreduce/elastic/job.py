"""``Job``: what an elastic run knows of its job besides the tracked values.

Who is in it (``ft.membership.Membership``), the policy it changes by, every change so
far as an ``ft.events.RecoveryEvent`` (``Change`` adds ``data_shards``) and the resize
bookkeeping: leaves and growth due up to ``resized_before`` are done, and the discovery
file's problem printed last (printed once). A newcomer gets the membership and the
bookkeeping from the job (``control``/``adopt``), then the values (``State.sync``). A run given
``on_stop`` (``elastic.run``) is stopped at a commit by a stop signal (``stop_at_commit``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ..ft.events import EventLog, RecoveryEvent
from ..ft.membership import Membership
from ..runtime.context import Context
from ..runtime.stop import requests
from .policy import Policy

DETAIL = {"failure": "lost", "growth": "joined", "replacement": "joined", "joined": "joined", "leave": "left"}
"""The ids each kind of change names in a user's ``state.events`` entry."""


@dataclass
class Change(RecoveryEvent):
    """``RecoveryEvent`` plus ``data_shards``: ``[rank id, [shards]]``, the training shards each
    rank reads after a failure, growth or leave (``Policy.data_shards``)."""

    data_shards: List[List[Any]] = field(default_factory=list)


@dataclass
class Job:
    """The membership, policy, changes and resize bookkeeping of one elastic run on one rank."""

    policy: Policy
    members: Membership
    changes: EventLog = field(default_factory=EventLog)
    resized_before: int = 0
    warned: Optional[str] = None
    on_stop: Optional[Callable[[Any], Optional[str]]] = None
    stop_sent: bool = False

    def stop_at_commit(self, ctx: Context) -> None:
        """A commit of a run that takes stop signals (``on_stop``): once this rank received one,
        revoke the communicator (once), so that every rank leaves its step and ``run`` stops them
        all at their last commit. Costs a Python attribute read while no signal came."""
        if self.on_stop is not None and requests.seen is not None and not self.stop_sent and ctx.ft:
            self.stop_sent = True
            ctx.comm.Revoke()

    def control(self) -> Dict[str, Any]:
        """What a newcomer is sent before the values: the membership and the bookkeeping."""
        return {**self.members.control(), "resized_before": self.resized_before}

    def adopt(self, control: Dict[str, Any], rank: int) -> None:
        """A newcomer's membership and bookkeeping, from what the job sent it (``control``)."""
        self.members = Membership.from_control(control, rank)
        self.resized_before = control["resized_before"]


def summary(change: RecoveryEvent, commits: int) -> Dict[str, Any]:
    """A user's ``state.events`` entry for ``change``: kind, ranks after, the commits made before
    it, the ids it names, ``detected_at`` (wall clock, ``time.time()``: when this rank saw the
    failure or learned of it, or when the growth, leave or join began), ``next_step_at`` (when
    the first commit after it was made; None until then) and ``recovered_s`` (the seconds from
    the one to the other, as ``hpcreduce train``'s ``to_next_step_s``)."""
    named = DETAIL.get(change.kind)
    return {"kind": change.kind, "ranks_after": change.ranks_after, "step_commits": commits,
            "detected_at": change.detected_at, "next_step_at": change.next_step_at,
            "recovered_s": None if change.to_next_step_s is None else round(change.to_next_step_s, 4),
            **({named: list(getattr(change, named))} if named else {})}

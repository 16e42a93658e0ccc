"""``State``: the values of a user's loop that survive failures and reach newcomers.

``commit()`` keeps a copy of every tracked value (this rank's point to go back to);
``restore()`` puts the copies back; ``sync()`` makes rank 0's values everyone's. After a
failure every survivor restores and then syncs, so all continue from rank 0's last commit:
an update rank 0 committed is kept on every rank, one it had not is redone by all, and
none is applied twice (Horovod's elastic ``State``). Values named in ``no_copy`` are not
copied: they must change only after the step's last collective and be committed before the
next one (a step committed by ``agreed`` before anyone applies it, as the ring trainer does),
so a failure always finds them as last committed and restore has nothing to undo.

With ``discover`` a commit also reads the discovery file (rank 0, every ``discover_every``
commits; a number of ranks or ``HOST[:SLOTS]`` lines, ``ft.resize.read_discovery``) and asks
``run`` for the change: ranks leave when it asks for fewer ranks (the highest ids) or hosts
(the ranks of hosts it drops, or beyond a host's slots), ranks are spawned when it asks for
more (a file it cannot use changes nothing). A trainer passes a ``Policy`` instead.
Cost of a commit: one copy of every tracked value not in ``no_copy`` (with ``discover``, at
each read, an allgather of the ranks' node names and a small broadcast).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Collection, Dict, List, Optional

from ..errors import UnsupportedInputError
from ..ft.events import RecoveryEvent
from ..ft.membership import Membership
from ..ft.resize import GrowthRule
from ..runtime.context import Context, init
from .job import Job, summary
from .policy import Policy
from .resizing import request_resize
from .tensors import broadcast, kind_of, put_back, snapshot

OWN_NAMES = frozenset({"commit", "restore", "sync", "register_reset_callbacks", "context", "events", "members",
                       "job", "commits"})


class State:
    """Named values (numpy, cupy or torch tensors, dicts of arrays, and picklable scalars) read
    and written as attributes: ``state.weights``, ``state.step += 1``. Arrays and tensors are
    restored and broadcast in place, so references a model holds stay valid. ``events``: one
    dict per change of the job's ranks (kind, ranks_after, step_commits, seconds and the ids
    lost, joined or left); ``job``: the membership, policy and changes (``elastic.job``)."""

    def __init__(self, *, context: Optional[Context] = None, discover: Optional[str] = None,
                 discover_every: int = 1, policy: Optional[Policy] = None, no_copy: Collection[str] = (),
                 **values: Any):
        clashes = sorted(OWN_NAMES & set(values))
        if clashes or not values:
            raise UnsupportedInputError(f"State needs at least one value, and not named {', '.join(clashes)}"
                                        if clashes else "State needs at least one value to track")
        if discover_every < 1:
            raise UnsupportedInputError(f"State: discover_every must be >= 1, got {discover_every}")
        unknown = sorted(set(no_copy) - set(values))
        if unknown or (policy is not None and discover):
            raise UnsupportedInputError(f"State: no_copy names no tracked value {', '.join(unknown)}" if unknown
                                        else "State: give discover or a policy, not both (the policy's growth "
                                             "rule reads the discovery file)")
        ctx = context if context is not None else init()
        policy = policy or Policy(growth=GrowthRule(discover=discover, discover_every=discover_every))
        own = {"context": ctx, "events": [], "job": Job(policy, Membership.founding(ctx.size, ctx.rank)),
               "_values": dict(values), "_kinds": {name: kind_of(value) for name, value in values.items()},
               "_copied": [name for name in values if name not in set(no_copy)], "_saved": {}, "_commits": 0,
               "_callbacks": []}
        for name, value in own.items():
            object.__setattr__(self, name, value)
        self.commit(check_resize=False)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"State tracks no value named {name!r} (it tracks {', '.join(sorted(values))})")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._values:
            raise AttributeError(f"State tracks no value named {name!r}: give every value when the State is made")
        self._values[name] = value

    @property
    def members(self) -> Membership:
        """The job's ranks by stable id (``ft.membership``)."""
        return self.job.members

    @property
    def commits(self) -> int:
        """Commits so far, the one made with the State included (the same on every rank after a sync)."""
        return self._commits

    def commit(self, *, check_resize: bool = True) -> None:
        """Keep a copy of every value not in ``no_copy``; the changes of ranks before this
        commit are closed (their lines echoed); with ``check_resize``, leaves and growth the
        policy asks for at this commit are requested of ``run`` (``ResizeRequested``)."""
        for name in self._copied:
            self._saved[name] = snapshot(self._values[name], self._kinds[name])
        object.__setattr__(self, "_commits", self._commits + 1)
        for change in self.job.changes.step_completed():
            self.job.policy.echo(change.line())
        if check_resize:
            request_resize(self, self._commits)

    def restore(self) -> None:
        """Every value back to this rank's last commit (values in ``no_copy`` are as committed)."""
        for name, saved in self._saved.items():
            self._values[name] = put_back(self._values[name], saved, self._kinds[name])

    def sync(self) -> None:
        """Every rank takes rank 0's values (collective; names in sorted order)."""
        ctx = self.context
        for name in sorted(self._values):
            self._values[name] = broadcast(ctx, self._values[name], self._kinds[name])
        object.__setattr__(self, "_commits", ctx.comm.bcast(self._commits, root=0))

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Functions called (no arguments) after every change of the job's ranks, once the
        state is synced: re-split the data, rebuild what depends on the rank or size."""
        self._callbacks.extend(callbacks)

    def _reset(self, change: RecoveryEvent, started: float) -> None:
        """Record ``change`` (``job.changes`` and ``events``), then run the reset callbacks."""
        self.job.changes.add(change)
        self.events.append(summary(change, self._commits, time.time() - started))
        for callback in self._callbacks:
            callback()

    def _adopt(self, control: Dict[str, Any]) -> None:
        """A newcomer's membership and resize bookkeeping, from what the job broadcast to it."""
        self.job.adopt(control, self.context.rank)

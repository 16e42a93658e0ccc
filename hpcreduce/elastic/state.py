"""``State``: the values of a user's loop that survive failures and reach newcomers.

``commit()`` keeps a copy of every tracked value (this rank's point to go back to);
``restore()`` puts the copies back; ``sync()`` makes rank 0's values everyone's. After a
failure every survivor restores and then syncs, so all continue from rank 0's last commit:
an update rank 0 committed is kept on every rank, one it had not is redone by all, and
none is applied twice (Horovod's elastic ``State``). With ``discover`` a commit also reads
the discovery file (rank 0, every ``discover_every`` commits; a number of ranks or
``HOST[:SLOTS]`` lines, ``ft.resize.read_discovery``) and asks ``run`` to grow the job to the
total it asks for (a file it cannot use, or one asking for fewer ranks, changes nothing here).
Cost of a commit: one copy of every tracked value (plus one small broadcast with ``discover``).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional

from ..errors import UnsupportedInputError
from ..ft.resize import Wanted, read_discovery
from ..ft.membership import Membership
from ..runtime.context import Context, init
from .tensors import broadcast, kind_of, put_back, snapshot

OWN_NAMES = frozenset({"commit", "restore", "sync", "register_reset_callbacks", "context", "events", "members"})


class GrowthRequested(Exception):
    """Raised by ``State.commit`` on every rank at once when the discovery file asks for more
    ranks; ``run`` catches it, spawns ``count`` ranks and calls the user's function again."""

    def __init__(self, count: int):
        super().__init__(f"grow by {count} rank(s)")
        self.count = count


class State:
    """Named values (numpy, cupy or torch tensors, and picklable scalars) read and written
    as attributes: ``state.weights``, ``state.step += 1``. Arrays and tensors are restored
    and broadcast in place, so references a model holds stay valid."""

    def __init__(self, *, context: Optional[Context] = None, discover: Optional[str] = None,
                 discover_every: int = 1, **values: Any):
        clashes = sorted(OWN_NAMES & set(values))
        if clashes or not values:
            raise UnsupportedInputError(f"State needs at least one value, and not named {', '.join(clashes)}"
                                        if clashes else "State needs at least one value to track")
        if discover_every < 1:
            raise UnsupportedInputError(f"State: discover_every must be >= 1, got {discover_every}")
        ctx = context if context is not None else init()
        own = {"context": ctx, "events": [], "members": Membership.founding(ctx.size, ctx.rank),
               "_values": dict(values), "_kinds": {name: kind_of(value) for name, value in values.items()},
               "_saved": {}, "_discover": discover, "_discover_every": discover_every, "_commits": 0,
               "_callbacks": []}
        for name, value in own.items():
            object.__setattr__(self, name, value)
        self.commit(check_growth=False)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"State tracks no value named {name!r} (it tracks {', '.join(sorted(values))})")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._values:
            raise AttributeError(f"State tracks no value named {name!r}: give every value when the State is made")
        self._values[name] = value

    def commit(self, *, check_growth: bool = True) -> None:
        """Keep a copy of every value; with ``discover``, grow if the file asks for more ranks."""
        self._saved.update({name: snapshot(value, self._kinds[name]) for name, value in self._values.items()})
        object.__setattr__(self, "_commits", self._commits + 1)
        if check_growth and self._discover and self._commits % self._discover_every == 0:
            comm = self.context.comm
            found = read_discovery(self._discover) if comm.Get_rank() == 0 else None
            target = comm.bcast(found.total if isinstance(found, Wanted) else None, root=0)
            if target is not None and target > comm.Get_size():
                raise GrowthRequested(target - comm.Get_size())

    def restore(self) -> None:
        """Every value back to this rank's last commit."""
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

    def _reset(self, kind: str, started: float, **details: Any) -> None:
        """Record what changed (``events``), then run the reset callbacks."""
        self.events.append({"kind": kind, "ranks_after": self.context.size, "step_commits": self._commits,
                            "seconds": round(time.time() - started, 4), **details})
        for callback in self._callbacks:
            callback()

    def _adopt(self, control: Dict[str, Any]) -> None:
        """A newcomer's membership, from what the job broadcast to it."""
        object.__setattr__(self, "members", Membership.from_control(control, self.context.rank))

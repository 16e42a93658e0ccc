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

``request_resize(state, at)`` (a commit's, or the loop's before a step) evaluates the policy's
``ft.resize.GrowthRule`` for moment ``at``: the ``--leave``/``--grow`` entries due and, when it
is read then, the discovery file (rank 0 reads it, every rank gets the answer; a problem with it
is echoed once and changes nothing). When ranks are to leave or join it raises
``ResizeRequested`` on every rank at once (after one agreement when the file asked: a rank
failing meanwhile is recovered from first); ``run`` carries it out (``resizing``).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Collection, Dict, List, Optional, Sequence, Tuple

from ..collectives import agree
from ..errors import InputMismatchError, UnsupportedInputError
from ..ft.events import RecoveryEvent
from ..ft.membership import Membership
from ..ft.resize import GrowthRule, Wanted, discovery_warning
from ..ft.watchdog import watchdog
from ..runtime.context import Context, init
from ..runtime.nodes import rank_nodes
from .agreement import agreed
from .handlers import handler_for
from .job import Job, summary
from .policy import Policy
from .state_dicts import Layout, layout_difference

OWN_NAMES = frozenset({"commit", "restore", "sync", "register_reset_callbacks", "context", "events", "members", "names",
                       "job", "commits", "state_dict", "whole_state_dict", "load_state_dict"})


class State:
    """Named values read and written as attributes: ``state.model``, ``state.step += 1``.
    Each is handled by its kind (``elastic.handlers``): numpy, cupy and torch tensors, dicts of
    them and torch modules are restored and synced in place, so references to them stay
    valid; objects with ``state_dict()``/``load_state_dict()`` (optimizers, LR schedulers,
    samplers, ``RandomStates``) are loaded into in place; anything else is copied by value.
    ``events``: one dict per change of the job's ranks (``elastic.job.summary``); ``job``: the
    membership, policy and changes (``elastic.job``)."""

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
        own = {"context": ctx, "job": Job(policy, Membership.founding(ctx.size, ctx.rank)),
               "_values": dict(values), "_handlers": {name: handler_for(value) for name, value in values.items()},
               "_copied": [name for name in values if name not in set(no_copy)], "_saved": {}, "_commits": 0,
               "_callbacks": [], "_change_commits": []}
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

    @property
    def events(self) -> List[Dict[str, Any]]:
        """One dict per change of the job's ranks, oldest first (``elastic.job.summary``): when it
        was detected, and once the next commit is made, when that was and how long it took."""
        return [summary(change, commits) for change, commits in zip(self.job.changes.events, self._change_commits)]

    def commit(self, *, check_resize: bool = True) -> None:
        """Keep a copy of every value not in ``no_copy``; the changes of ranks before this
        commit are closed (their lines echoed); with ``check_resize``, leaves and growth the
        policy asks for at this commit are requested of ``run`` (``ResizeRequested``)."""
        # whole or not at all: a snapshot that communicates (a sharded optimizer's) may fail after
        # others were taken, and a commit of some values only would be restored as one
        saved = {name: self._handlers[name].snapshot(self._values[name]) for name in self._copied}
        object.__setattr__(self, "_saved", saved)
        object.__setattr__(self, "_commits", self._commits + 1)
        for change in self.job.changes.step_completed():
            self.job.policy.echo(change.line())
        self.job.stop_at_commit(self.context)
        if check_resize:
            request_resize(self, self._commits)

    def restore(self) -> None:
        """Every value back to this rank's last commit, in place (values in ``no_copy`` are as
        committed). ``InputMismatchError`` naming the value and the tensor when one no longer
        fits its commit (another model, a tensor of another shape)."""
        self._put_back(self._saved, "State.restore", "its last commit")

    @property
    def names(self) -> List[str]:
        """The tracked values' names, sorted (nothing exported)."""
        return sorted(self._values)

    def state_dict(self) -> Dict[str, Any]:
        """Every value as a checkpoint stores it (a module's or an optimizer's ``state_dict()``,
        tensors and arrays themselves, scalars), by name; nothing is copied."""
        return {name: self._handlers[name].exported(value) for name, value in self._values.items()}

    def whole_state_dict(self) -> Dict[str, Any]:
        """``state_dict()`` with a sharded value's whole state on every rank (collective): what
        each rank can ``load_state_dict`` back, whatever the others hold."""
        return {name: self._handlers[name].whole(value) for name, value in self._values.items()}

    def load_state_dict(self, values: Dict[str, Any]) -> None:
        """Every value from ``values`` (a ``state_dict()``, as a checkpoint stored it), in place
        (local: ``sync`` then gives rank 0's to every rank). ``InputMismatchError`` naming the
        value and the tensor when one does not fit, or when the names are not the tracked ones."""
        if sorted(values) != sorted(self._values):
            raise InputMismatchError(f"State.load_state_dict: values {sorted(values)} given, "
                                     f"{sorted(self._values)} tracked")
        self._put_back(values, "State.load_state_dict", "what is loaded")

    def sync(self, *, problem: Optional[str] = None) -> None:
        """Every rank takes rank 0's values (collective; names in sorted order). First every rank
        compares its values' kinds and tensors (names, shapes, dtypes) with rank 0's, and when
        any differs (or a rank passes a ``problem`` of its own) every rank raises the same
        ``InputMismatchError`` naming the ranks, values and tensors, before anything is
        overwritten. A state dict that its object refuses to load is reported the same way."""
        ctx, names = self.context, sorted(self._values)
        header = {name: (self._handlers[name].kind, self._handlers[name].layout(self._values[name]))
                  for name in names} if ctx.rank == 0 else None
        header, commits = ctx.comm.bcast((header, self._commits) if ctx.rank == 0 else None, root=0)
        agree(problem or self._difference(header), comm=ctx,
              what="State.sync: the ranks' values do not fit rank 0's")
        refused = None
        for name in names:
            try:
                self._values[name] = self._handlers[name].receive(ctx, self._values[name])
            except InputMismatchError as err:
                refused = refused or f"{name!r}: {err}"
        if any(kind in ("state dict", "sharded") for kind, _layout in header.values()):
            agree(refused, comm=ctx, what="State.sync: the ranks' values could not load rank 0's")
        object.__setattr__(self, "_commits", commits)

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Functions called (no arguments) after every change of the job's ranks, once the
        state is synced: re-split the data, rebuild what depends on the rank or size."""
        self._callbacks.extend(callbacks)

    def _put_back(self, values: Dict[str, Any], caller: str, source: str) -> None:
        """Each of ``values`` put back into the tracked value of its name (``InputMismatchError``
        naming the value when it does not fit ``source``)."""
        for name, saved in values.items():
            try:
                self._values[name] = self._handlers[name].put_back(self._values[name], saved)
            except InputMismatchError as err:
                raise InputMismatchError(f"{caller}: {name!r} does not fit {source}: {err}") from err

    def _recover_values(self) -> None:
        """After a failure (collective): restore this rank's last commit, then take rank 0's; a
        value that cannot be restored is reported by every rank (``sync``), never left to hang."""
        try:
            self.restore()
            problem = None
        except InputMismatchError as err:
            problem = str(err)
        self.sync(problem=problem)

    def _difference(self, header: Dict[str, Tuple[str, Optional[Layout]]]) -> Optional[str]:
        """How this rank's values differ from rank 0's ``header`` (kind and layout by name), first only."""
        if sorted(header) != sorted(self._values):
            return f"values {sorted(self._values)} here, {sorted(header)} on rank 0"
        for name, (kind, theirs) in header.items():
            handler = self._handlers[name]
            if handler.kind != kind:
                return f"{name!r} is a {handler.kind} here, a {kind} on rank 0"
            if theirs is not None:
                found = layout_difference(handler.layout(self._values[name]) or [], theirs, "on rank 0")
                if found:
                    return f"{name!r}: {found}"
        return None

    def _leaving(self, staying: Optional[Context], going: bool = False) -> None:
        """Around a leave: before it (``staying`` None; collective over every rank, ``going`` on
        the leaving ones) and after it on the staying ranks (their context), each value's
        handler's part (a sharded value is re-sharded among the ranks that stay)."""
        for name in sorted(self._values):
            handler = self._handlers[name]
            if staying is None:
                handler.before_leave(self._values[name], going)
            else:
                self._values[name] = handler.after_leave(staying, self._values[name])

    def _attempt_ended(self, failed: bool) -> None:
        """The end of one call of the loop (``run``), before its agreement (``failed``: by a
        process failure): each value's handler's part (a ``start_hybrid`` job ends its tables' agreements)."""
        for name in sorted(self._values):
            self._handlers[name].attempt_ended(self._values[name], failed)

    def _reset(self, change: RecoveryEvent) -> None:
        """Record ``change`` (``job.changes`` and ``events``), then run the reset callbacks."""
        self.job.changes.add(change)
        self._change_commits.append(self._commits)
        for callback in self._callbacks:
            callback()

    def _adopt(self, control: Dict[str, Any]) -> None:
        """A newcomer's membership and resize bookkeeping, from what the job broadcast to it."""
        self.job.adopt(control, self.context.rank)


class ResizeRequested(Exception):
    """Raised on every rank at once when ranks are to leave or join before moment ``at``:
    ``leaving`` (stable ids, sorted), then ``count`` ranks to spawn; ``requested_at``: when
    that was decided (wall clock). ``run`` catches it, carries it out and calls the loop again."""

    def __init__(self, at: int, leaving: Sequence[int], count: int, requested_at: float):
        super().__init__(f"before {at}: {len(leaving)} rank(s) leave, {count} join")
        self.at, self.leaving, self.count, self.requested_at = at, list(leaving), count, requested_at


def request_resize(state: State, at: int) -> None:
    """Raise ``ResizeRequested`` when the policy asks for leaves or growth before ``at`` (once
    for each moment: those up to ``job.resized_before`` are done)."""
    job, ctx = state.job, state.context
    rule = job.policy.growth
    if at <= job.resized_before:
        return
    requested, polled = time.time(), rule.reads_target(at)
    wanted, nodes = _poll(state, at) if polled else (None, [])
    leaving = rule.leavers(job.resized_before, at, job.members.ids, nodes, wanted)
    count = rule.count(job.resized_before, at, ctx.size - len(leaving), wanted)
    if leaving or count:
        if polled:  # acted on only once every rank has the file's answer (a failure meanwhile: Interrupted)
            agreed(ctx, lambda: None, f"discovery file before step {at}")
        raise ResizeRequested(at, leaving, count, requested)
    job.resized_before = at


def _poll(state: State, at: int) -> Tuple[Optional[Wanted], List[str]]:
    """What the discovery file asks for (rank 0 reads it; everyone gets the answer) and the
    node of every rank (gathered first when the policy checks the file's hosts, else only for
    a file of hosts). A problem with the file is a warning (once, on rank 0) and changes nothing;
    rank 0's read never raises (``GrowthRule.wanted``), so no rank is left in the broadcast."""
    job, ctx = state.job, state.context
    check = job.policy.known_hosts
    with watchdog.guard(f"discovery file before step {at}"):
        nodes = rank_nodes(ctx.comm) if check else None
        found = job.policy.growth.wanted(at, check(nodes) if check else None) if ctx.rank == 0 else None
        found = ctx.comm.bcast(found, root=0)
        if nodes is None and isinstance(found, Wanted) and found.hosts is not None:
            nodes = rank_nodes(ctx.comm)
    note = discovery_warning(found)
    if note and note != job.warned and ctx.rank == 0:
        job.policy.warn(f"warning: {note}")
    job.warned = note
    return (None if isinstance(found, str) else found), nodes or []

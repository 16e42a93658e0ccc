"""Every rank's comm hook agreed before a step's buckets go, and the hook's state the same everywhere.

A rank whose hook differs (``register_comm_hook`` called on some ranks only) would send buckets
its peers reduce another way, or wait in a collective they never start. So each synchronised
backward begins, on the reducer's own communicator and before its first bucket, with one small
cross-rank check of the hook's name and its state's kind (``collectives.validate.agree``: one
MAX allreduce of a few integers); ``register_comm_hook`` makes the same check with the new hook,
so on a rank that registers alone it meets its peers' next backward and every rank raises the
same ``InputMismatchError`` naming each rank's hook. After the ranks changed (the reducer's
communicator made anew: a failure, a growth, a leave) a hook state with
``state_dict()``/``load_state_dict()`` (``PowerSGDState``) takes rank 0's, so a spawned rank's
state is the survivors' (``elastic.state_dicts.send_tree``).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from ...collectives.validate import InputProblem, agree, stable_hash
from ...elastic.state_dicts import send_tree
from ...runtime.context import Context


def hook_name(hook: Callable[..., Any]) -> str:
    """``hook`` by module and qualified name, as every rank compares it."""
    return f"{getattr(hook, '__module__', '?')}.{getattr(hook, '__qualname__', type(hook).__name__)}"


def agree_on_hook(context: Context, hook: Callable[..., Any], state: Any,
                  problem: Optional[InputProblem] = None) -> None:
    """Raise the same error on every rank of ``context`` if a rank's hook or its state's kind
    differs, or a rank has a ``problem`` (collective)."""
    name, kind = hook_name(hook), type(state).__qualname__
    agree(context, "DistributedDataParallel's comm hook (register_comm_hook on every rank alike)",
          [("comm hook", stable_hash(name), name), ("hook state", stable_hash(kind), kind)], problem)


def sync_hook_state(context: Context, state: Any) -> None:
    """Rank 0's hook ``state`` on every rank, when it has ``state_dict``/``load_state_dict``
    (collective; the kinds already agreed)."""
    if not (callable(getattr(state, "state_dict", None)) and callable(getattr(state, "load_state_dict", None))):
        return
    theirs = send_tree(context, state.state_dict() if context.rank == 0 else None)
    if context.rank != 0:
        state.load_state_dict(theirs)

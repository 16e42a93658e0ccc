"""What ``State`` does to one tracked value, by kind: a handler per kind (Horovod's elastic
State has one per torch type).

- ``in place``: numpy and cupy arrays, torch tensors, dicts of them (nested dicts allowed:
  ``dict(model.named_parameters())``) and torch modules (the tensors of ``state_dict()``,
  which share the module's parameters and buffers). Commit clones the tensors; restore and
  sync copy into the same tensors, so the module, and an optimizer pointing at its
  parameters, keep working on the live ones.
- ``state dict``: anything else with ``state_dict()`` and ``load_state_dict()`` (an optimizer,
  an LR scheduler, a sampler, a GradScaler, ``RandomStates``). Commit keeps a copy of the
  state dict with its tensors cloned; restore loads a copy of it into the same object; sync
  sends rank 0's (``state_dicts.send_tree``) and loads it. An optimizer's lazily created state
  is covered: an empty committed state restores to empty, and a newcomer's empty optimizer
  receives rank 0's momentum buffers.
- ``sharded``: an object whose state is sharded over the ranks (``Sharded``: a
  ``ZeroRedundancyOptimizer``), each part kept on its rank and its ring neighbour.
- ``job``: an object that says itself what a commit keeps and what a recovery does (``Own``:
  a colocated ``start_hybrid`` job, ``hpcreduce.torch.hybrid_elastic``). A parameter server
  (a dedicated-layout job's server ranks) is refused.
- ``scalar``: anything else (ints, floats, strings, small objects): deep-copied, pickled.

Each handler gives ``exported`` (what a checkpoint stores, and what a commit copies),
``put_back`` (restore from such a copy, refusing one whose tensors differ by name or shape,
naming the tensor), ``layout`` (what sync compares with rank 0's before any byte moves) and
``receive`` (collective: rank 0's values into this rank's object); ``attempt_ended`` runs at
the end of each call of the loop (``run``), before its agreement. torch is never imported here.
"""
from __future__ import annotations

import copy
import sys
from typing import Any, Callable, List, Optional

from ..arrays import copy_into
from ..errors import InputMismatchError, UnsupportedInputError
from ..runtime.context import Context
from .state_dicts import Layout, clone_tree, is_leaf, is_tensor, layout, layout_difference, leaves, send_leaf, send_tree


LOAD_ERRORS = (ValueError, KeyError, TypeError, RuntimeError, IndexError)
"""What a ``load_state_dict`` (or a copy into a tensor) raises on a state that does not fit; each
handler turns them into ``InputMismatchError``."""


class Handler:
    """How one kind of value is committed, restored and synced (see the module docstring)."""

    kind = "scalar"

    def exported(self, value: Any) -> Any:
        """``value`` as a checkpoint stores it (tensors not copied)."""
        return value

    def whole(self, value: Any) -> Any:
        """``value``'s whole state on this rank (``exported``, but a sharded one gathered:
        collective)."""
        return self.exported(value)

    def before_leave(self, value: Any, going: bool) -> None:
        """Collective over every rank, the leaving ones (``going``) included, before a leave: what
        the staying ranks need of the leaving ones' (nothing, but for a sharded value or a job)."""

    def after_leave(self, context: Context, value: Any) -> Any:
        """Collective over the staying ranks after a leave (``context``'s): ``value`` for them."""
        return value

    def snapshot(self, value: Any) -> Any:
        """A copy of ``value`` that later changes to it do not touch."""
        return clone_tree(self.exported(value))

    def put_back(self, value: Any, saved: Any) -> Any:
        """``value`` holding ``saved`` again (a ``snapshot`` or a checkpoint's entry);
        ``InputMismatchError`` when it does not fit."""
        return copy.deepcopy(saved)

    def layout(self, value: Any) -> Optional[Layout]:
        """What must be the same as rank 0's for ``receive`` to work (None: nothing)."""
        return None

    def receive(self, context: Context, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (collective; its ``layout`` already agreed);
        ``InputMismatchError`` when this rank's object refuses it."""
        return context.comm.bcast(value, root=0)

    def attempt_ended(self, value: Any, failed: bool) -> None:
        """The end of one call of the loop, on every rank (``failed``: by a process failure),
        before the agreement that ends it (nothing, but for a ``job``)."""


class InPlace(Handler):
    """Arrays, tensors, dicts of them (``kind`` "arrays") and modules (``export``: the module's
    ``state_dict()``, ``kind`` "module"): their tensors copied into in place."""

    def __init__(self, kind: str, export: Callable[[Any], Any] = lambda value: value):
        self.kind, self.export = kind, export

    def exported(self, value: Any) -> Any:
        return self.export(value)

    def put_back(self, value: Any, saved: Any) -> Any:
        mine = self.exported(value)
        problem = layout_difference(layout(mine), layout(saved), "there")
        if problem:
            raise InputMismatchError(problem)
        for (path, leaf), (_, kept) in zip(leaves(mine), leaves(saved)):
            try:
                _copy_leaf(leaf, kept)
            except LOAD_ERRORS as err:
                raise InputMismatchError(f"{path or 'the value'}: {err}") from err
        return value

    def layout(self, value: Any) -> Layout:
        return layout(self.exported(value))

    def receive(self, context: Context, value: Any) -> Any:
        for _path, leaf in leaves(self.exported(value)):
            send_leaf(context, leaf)
        return value


class StateDict(Handler):
    """An object with ``state_dict()``/``load_state_dict()``, loaded into in place."""

    kind = "state dict"

    def exported(self, value: Any) -> Any:
        return value.state_dict()

    def put_back(self, value: Any, saved: Any) -> Any:
        _load(value, clone_tree(saved))  # a copy: an optimizer keeps the tensors it is given
        return value

    def layout(self, value: Any) -> Optional[Layout]:
        """An optimizer's parameters (their shapes by group), which its state must fit."""
        groups = getattr(value, "param_groups", None)
        if not isinstance(groups, list):
            return None
        return [(f"param_groups.{g}.params.{i}", tuple(param.shape), str(param.dtype).replace("torch.", ""))
                for g, group in enumerate(groups) for i, param in enumerate(group.get("params", []))]

    def receive(self, context: Context, value: Any) -> Any:
        theirs = send_tree(context, value.state_dict() if context.rank == 0 else None)
        if context.rank != 0:
            _load(value, theirs)
        return value


class Sharded(Handler):
    """An object whose state is sharded over the ranks (``hpcreduce.torch.ZeroRedundancyOptimizer``):
    a commit keeps its ``shard_snapshot()`` (this rank's part and a copy of its ring neighbour's,
    collective); restore hands that back (``restore_point``); sync (after a failure or a growth)
    has every rank ``reshard`` from the parts kept. Before a leave (at a commit) every rank loads
    the whole state (``full_state_dict``, collective), and after it the staying ranks ``reshard``
    it among themselves. A checkpoint stores its full ``state_dict()``
    (consolidated first) and loads it at any number of ranks."""

    kind = "sharded"

    def exported(self, value: Any) -> Any:
        return value.state_dict()

    def whole(self, value: Any) -> Any:
        return value.full_state_dict()

    def snapshot(self, value: Any) -> Any:
        return value.shard_snapshot()

    def before_leave(self, value: Any, going: bool) -> None:
        value.load_state_dict(value.full_state_dict())

    def after_leave(self, context: Context, value: Any) -> Any:
        value.reshard(context)
        return value

    def put_back(self, value: Any, saved: Any) -> Any:
        if saved is None or isinstance(saved, dict) and "mine" in saved:
            value.restore_point = saved
        else:
            _load(value, clone_tree(saved))
        return value

    def receive(self, context: Context, value: Any) -> Any:
        value.reshard(context)
        return value


class Own(Handler):
    """An object that handles itself (a colocated ``start_hybrid`` job: its tables commit each
    push by an agreement already): a commit keeps its ``elastic_snapshot()`` (its step), restore
    hands it back (``elastic_put_back``), sync has it recover on the survivors
    (``elastic_receive``, collective), a leave has it hand the leaving ranks' part over
    (``elastic_before_leave``, on every rank) and go on with the staying ones
    (``elastic_after_leave``), and every call of the loop ends its own agreements
    (``elastic_attempt_ended``)."""

    kind = "job"

    def exported(self, value: Any) -> Any:
        return value.elastic_snapshot()

    def snapshot(self, value: Any) -> Any:
        return value.elastic_snapshot()

    def put_back(self, value: Any, saved: Any) -> Any:
        value.elastic_put_back(saved)
        return value

    def layout(self, value: Any) -> Optional[Layout]:
        return value.elastic_layout()

    def receive(self, context: Context, value: Any) -> Any:
        value.elastic_receive(context)
        return value

    def before_leave(self, value: Any, going: bool) -> None:
        value.elastic_before_leave(going)

    def after_leave(self, context: Context, value: Any) -> Any:
        value.elastic_after_leave(context)
        return value

    def attempt_ended(self, value: Any, failed: bool) -> None:
        value.elastic_attempt_ended(failed)


SCALAR, STATE_DICT, SHARDED, OWN = Handler(), StateDict(), Sharded(), Own()
ARRAYS, MODULE = InPlace("arrays"), InPlace("module", lambda module: module.state_dict())


def handler_for(value: Any) -> Handler:
    """The handler of ``value``'s kind (a module before a state dict: modules have both)."""
    if is_leaf(value) or (isinstance(value, dict) and _all_leaves(value)):
        return ARRAYS
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.nn.Module):
        return MODULE
    if callable(getattr(value, "elastic_problem", None)):
        problem = value.elastic_problem()  # the same on every rank: the job's layout was agreed
        if problem:
            raise UnsupportedInputError(f"State: {problem}")
        return OWN
    server = sys.modules.get(__name__.rsplit(".", 2)[0] + ".ps.server")
    if server is not None and isinstance(value, server.Server):
        raise UnsupportedInputError("State: a parameter server (a start_hybrid(layout=\"dedicated\") server rank) "
                                    "cannot be tracked: the dedicated layout recovers under hpcreduce.train "
                                    "(hpcreduce.torch.TorchModel); use layout=\"colocated\" with elastic.State")
    if callable(getattr(value, "shard_snapshot", None)) and callable(getattr(value, "reshard", None)):
        return SHARDED
    if callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None)):
        return STATE_DICT
    return SCALAR


def _all_leaves(tree: dict) -> bool:
    """Whether ``tree`` (a dict, nested dicts allowed) holds at least one tensor and nothing else."""
    found: List[bool] = []
    for item in tree.values():
        found.append(_all_leaves(item) if isinstance(item, dict) else is_leaf(item))
    return bool(found) and all(found)


def _load(value: Any, state: Any) -> None:
    """``value.load_state_dict(state)``; ``InputMismatchError`` saying why when it refuses."""
    try:
        value.load_state_dict(state)
    except LOAD_ERRORS as err:
        raise InputMismatchError(f"its load_state_dict refused the state: {type(err).__name__}: {err}") from err


def _copy_leaf(leaf: Any, kept: Any) -> None:
    """``kept``'s values into ``leaf`` (a tensor, or a numpy or cupy array), in place."""
    if is_tensor(leaf):
        import torch
        with torch.no_grad():
            leaf.copy_(kept if is_tensor(kept) else torch.as_tensor(kept))
    else:
        copy_into(leaf, kept.detach().cpu().numpy() if is_tensor(kept) else kept)

"""Trees of tensors (state dicts, dicts of arrays): walked, copied, described and sent.

A state dict (a module's, an optimizer's, an LR scheduler's, a sampler's, the random
generators') is a tree of dicts, lists and tuples whose leaves are torch tensors, numpy
or cupy arrays and small picklable values. ``leaves`` walks one in a fixed order (dict keys
sorted), naming each tensor by its path; ``layout`` is that walk's (path, shape, dtype)
list, which ``layout_difference`` compares. ``clone_tree`` copies a tree so that later
in-place changes (an optimizer's momentum buffers) do not reach the copy. ``send_tree``
gives every rank rank 0's tree: rank 0 broadcasts its skeleton (the tree with each tensor
replaced by a ``Slot`` naming its shape and dtype: one small pickled broadcast, never the
tensors' bytes), every rank allocates what the slots name, and each tensor then travels by
one ``MPI_Bcast`` of its bytes (``send_leaf``). torch is never imported here unless a tree
holds torch tensors.
"""
from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from ..arrays import is_device_array
from ..collectives.broadcast import broadcast_arrays, broadcast_tensor
from ..runtime.context import Context

Layout = List[Tuple[str, Tuple[int, ...], str]]
"""(path, shape, dtype) of every tensor of a tree, in ``leaves`` order."""


@dataclass(frozen=True)
class Slot:
    """Where a tensor (``torch``) or a numpy array (``numpy``) of ``shape`` and ``dtype`` goes."""

    library: str
    shape: Tuple[int, ...]
    dtype: str


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor (without importing torch)."""
    return type(value).__module__.startswith("torch") and hasattr(value, "detach") and hasattr(value, "shape")


def is_leaf(value: Any) -> bool:
    """Whether ``value`` travels as bytes: a torch tensor, a numpy array or a device (cupy) array."""
    return is_tensor(value) or isinstance(value, np.ndarray) or is_device_array(value)


def leaves(tree: Any, path: str = "") -> List[Tuple[str, Any]]:
    """(path, tensor) of every tensor or array of ``tree``: dicts in sorted key order (insertion
    order when the keys do not sort), lists and tuples in order; paths like ``layer.weight``
    (a dict's keys joined by dots) and ``state.0.momentum_buffer``."""
    if is_leaf(tree):
        return [(path, tree)]
    if isinstance(tree, dict):
        try:
            keys = sorted(tree)
        except TypeError:
            keys = list(tree)
        items: Sequence[Tuple[Any, Any]] = [(key, tree[key]) for key in keys]
    elif _is_sequence(tree):
        items = list(enumerate(tree))
    else:
        return []
    return [found for key, item in items for found in leaves(item, f"{path}.{key}" if path else str(key))]


def layout(tree: Any) -> Layout:
    """``tree``'s tensors as (path, shape, dtype), in ``leaves`` order."""
    return [(path, tuple(leaf.shape), _dtype(leaf)) for path, leaf in leaves(tree)]


def layout_difference(mine: Layout, theirs: Layout, where: str) -> Optional[str]:
    """The first way ``mine`` differs from ``theirs`` (the layout ``where``: "on rank 0", "in the
    last commit"), naming the tensor; None when they are the same."""
    if mine == theirs:
        return None
    for (path, shape, dtype), (their_path, their_shape, their_dtype) in zip(mine, theirs):
        if path != their_path:
            return f"{_named(path)} here where {_named(their_path)} is {where}"
        if (shape, dtype) != (their_shape, their_dtype):
            return f"{_named(path)} has shape {shape} {dtype} here, {their_shape} {their_dtype} {where}"
    if len(mine) > len(theirs):
        return f"{_named(mine[len(theirs)][0])} here is not {where}"
    return f"{_named(theirs[len(mine)][0])} {where} is missing here"


def rebuild(tree: Any, stops: Callable[[Any], bool], leaf: Callable[[Any], Any]) -> Any:
    """``tree`` with every value ``stops`` accepts replaced by ``leaf(it)``, depth first in
    insertion order (dicts, lists and tuples rebuilt as new containers, other values kept)."""
    if stops(tree):
        return leaf(tree)
    if isinstance(tree, dict):
        items = {key: rebuild(item, stops, leaf) for key, item in tree.items()}
        return OrderedDict(items) if isinstance(tree, OrderedDict) else items
    if _is_sequence(tree):
        return type(tree)(rebuild(item, stops, leaf) for item in tree)
    return tree


def clone_tree(tree: Any) -> Any:
    """A copy of ``tree`` that shares no tensor, array or container with it."""
    return rebuild(tree, _is_atom, lambda x: _clone(x) if is_leaf(x) else copy.deepcopy(x))


def send_leaf(context: Context, leaf: Any) -> None:
    """Rank 0's bytes of one tensor or array into ``leaf`` on every rank (in place)."""
    if is_tensor(leaf):
        broadcast_tensor(context, leaf, 0)
    else:
        broadcast_arrays(context, [leaf], 0)


def send_tree(context: Context, tree: Any) -> Any:
    """Rank 0's ``tree`` on every rank of ``context`` (collective; other ranks' ``tree`` is not
    read): one pickled broadcast of its skeleton, then one broadcast per tensor or array."""
    found: List[Any] = []

    def slot(leaf: Any) -> Slot:
        found.append(leaf if not isinstance(leaf, np.ndarray) else np.ascontiguousarray(leaf))
        return Slot("torch" if is_tensor(leaf) else "numpy", tuple(leaf.shape), _dtype(leaf))

    def allocate(slot: Slot) -> Any:
        found.append(_allocate(slot))
        return found[-1]

    shape = context.comm.bcast(rebuild(tree, is_leaf, slot) if context.rank == 0 else None, root=0)
    if context.rank != 0:
        shape = rebuild(shape, lambda value: isinstance(value, Slot), allocate)
    for leaf in found:
        send_leaf(context, leaf)
    return tree if context.rank == 0 else shape


def _dtype(leaf: Any) -> str:
    return str(leaf.dtype).replace("torch.", "")


def _named(path: str) -> str:
    return repr(path) if path else "the value"


def _clone(leaf: Any) -> Any:
    return leaf.detach().clone() if is_tensor(leaf) else leaf.copy()


def _is_sequence(value: Any) -> bool:
    """A list or a tuple, but not a namedtuple (rebuilt from its items, it would not be the same)."""
    return isinstance(value, (list, tuple)) and not hasattr(value, "_fields")


def _is_atom(value: Any) -> bool:
    return is_leaf(value) or not (isinstance(value, dict) or _is_sequence(value))


def _allocate(slot: Slot) -> Any:
    """An empty tensor or array for ``slot``, on the host (an optimizer's ``load_state_dict``
    moves its state to its parameters' device)."""
    if slot.library == "numpy":
        return np.empty(slot.shape, dtype=slot.dtype)
    import torch
    return torch.empty(slot.shape, dtype=getattr(torch, slot.dtype))

"""What ``State`` does to one tracked value: copy it, put a copy back, broadcast it in place.

numpy and cupy arrays, and torch tensors (CPU or CUDA), are broadcast by
``collectives.broadcast`` (staged through host memory unless MPI can read them), and torch
is not imported until one is tracked. A dict whose leaves are arrays (nested dicts allowed,
at least one array) is a mapping of arrays, each restored and broadcast in place in sorted
key order. Anything else (ints, floats, strings, small objects) is a scalar: copied by value
and broadcast pickled.
"""
from __future__ import annotations

import copy
from typing import Any, List, Optional

from ..arrays import copy_into, is_device_array
from ..collectives.broadcast import broadcast_arrays, broadcast_tensor
from ..runtime.context import Context


def kind_of(value: Any) -> str:
    """``"array"`` (numpy/cupy), ``"tensor"`` (torch), ``"arrays"`` (a dict of arrays) or ``"scalar"``."""
    if _is_array(value):
        return "array"
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        return "tensor"
    if isinstance(value, dict) and leaves(value):
        return "arrays"
    return "scalar"


def leaves(value: Any) -> Optional[List[Any]]:
    """The arrays of a dict of arrays (nested dicts allowed), in sorted key order; None when
    some leaf is not an array."""
    try:
        keys = sorted(value)
    except TypeError:  # keys that do not sort (mixed types): not a mapping of arrays
        return None
    found: List[Any] = []
    for key in keys:
        item = value[key]
        inner = leaves(item) if isinstance(item, dict) else [item] if _is_array(item) else None
        if inner is None:
            return None
        found += inner
    return found


def snapshot(value: Any, kind: str) -> Any:
    """A copy of ``value`` that later changes to ``value`` do not touch."""
    if kind == "array":
        return value.copy()
    if kind == "tensor":
        return value.detach().clone()
    if kind == "arrays":
        return [array.copy() for array in leaves(value)]
    return copy.deepcopy(value)


def put_back(value: Any, saved: Any, kind: str) -> Any:
    """``value`` holding ``saved`` again (arrays and tensors in place, so references stay valid)."""
    if kind == "array":
        value[...] = saved
        return value
    if kind == "arrays":
        for array, kept in zip(leaves(value), saved):
            copy_into(array, kept)
        return value
    if kind == "tensor":
        import torch
        with torch.no_grad():
            value.copy_(saved)
        return value
    return copy.deepcopy(saved)


def broadcast(context: Context, value: Any, kind: str) -> Any:
    """Rank 0's ``value`` on every rank of ``context`` (arrays and tensors in place)."""
    if kind == "scalar":
        return context.comm.bcast(value, root=0)
    if kind == "tensor":
        broadcast_tensor(context, value, 0)
    else:
        broadcast_arrays(context, leaves(value) if kind == "arrays" else [value], root=0)
    return value


def _is_array(value: Any) -> bool:
    return hasattr(value, "__array_interface__") or is_device_array(value)

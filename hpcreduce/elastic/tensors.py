"""What ``State`` does to one tracked value: copy it, put a copy back, broadcast it in place.

numpy and cupy arrays, and torch tensors (CPU or CUDA), are broadcast by
``collectives.broadcast`` (staged through host memory unless MPI can read them), and torch
is not imported until one is tracked. Anything else (ints, floats, strings, small objects) is a
scalar: copied by value and broadcast pickled.
"""
from __future__ import annotations

import copy
from typing import Any

from ..arrays import is_device_array
from ..collectives.broadcast import broadcast_arrays, broadcast_tensor
from ..runtime.context import Context


def kind_of(value: Any) -> str:
    """``"array"`` (numpy/cupy), ``"tensor"`` (torch) or ``"scalar"``."""
    if hasattr(value, "__array_interface__") or is_device_array(value):
        return "array"
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        return "tensor"
    return "scalar"


def snapshot(value: Any, kind: str) -> Any:
    """A copy of ``value`` that later changes to ``value`` do not touch."""
    if kind == "array":
        return value.copy()
    if kind == "tensor":
        return value.detach().clone()
    return copy.deepcopy(value)


def put_back(value: Any, saved: Any, kind: str) -> Any:
    """``value`` holding ``saved`` again (arrays and tensors in place, so references stay valid)."""
    if kind == "array":
        value[...] = saved
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
        broadcast_arrays(context, [value], root=0)
    return value

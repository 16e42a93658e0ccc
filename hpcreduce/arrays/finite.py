"""The one NaN/Inf rule (gradients, every push, reduced sums): a NaN or an Inf survives a sum,
so a finite sum (or dot product) of the values clears them in one pass; a sum that is not finite
is looked at elementwise (one that overflowed although every value is finite is no error).
``all_finite`` applies it to host and device arrays; the torch side (``torch.finite``) and the
collectives' checked copy out (``collectives.finite_copy``) take their sums in their own pass and
decide by ``finite_by_sum``.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from . import array_module, is_device_array

SMALL_CHECK = 1 << 16  # elements: below, one elementwise pass beats entering np.errstate


def finite_by_sum(total: float, elementwise: Callable[[], bool]) -> bool:
    """The rule's verdict from a sum already taken over the values: finite when ``total`` is,
    else ``elementwise()``'s look."""
    return math.isfinite(total) or elementwise()


def all_finite(values) -> bool:
    """No NaN or Inf. A device array: one reduction and one scalar read back. A host array:
    small ones one elementwise pass; larger ones one BLAS pass (the dot product with itself is
    finite exactly when every element is, short of overflow), the elementwise check only when
    it is not."""
    if is_device_array(values):
        return bool(array_module(values).isfinite(values).all())
    flat = values.reshape(-1)
    if flat.size <= SMALL_CHECK:
        return bool(np.isfinite(flat).all())
    if flat.dtype == np.float16:
        return bool(np.isfinite(flat).all())
    with np.errstate(over="ignore", invalid="ignore"):
        square = float(np.dot(flat, flat))
    return finite_by_sum(square, lambda: bool(np.isfinite(flat).all()))

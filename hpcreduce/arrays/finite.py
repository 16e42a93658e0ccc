"""The one NaN/Inf check of host and device arrays (gradients, pushes, reduced sums)."""
from __future__ import annotations

import numpy as np

from . import array_module, is_device_array

SMALL_CHECK = 1 << 16  # elements: below, one elementwise pass beats entering np.errstate


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
    with np.errstate(over="ignore", invalid="ignore"):
        if flat.dtype != np.float16 and np.isfinite(np.dot(flat, flat)):
            return True
    return bool(np.isfinite(flat).all())

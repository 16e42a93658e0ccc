"""The compiled loop of ``finite_copy`` (numba ``@njit(nogil=True, cache=True)``): imported on
first use, so a process that never checks a reduced buffer never imports numba."""
from __future__ import annotations

from numba import njit


@njit(nogil=True, cache=True, fastmath={"reassoc"})
def divide_sum(reduced, out, divisor):  # pragma: no cover - compiled
    """``out[i] = reduced[i] / divisor`` (each value exact, as numpy's divide), returning the
    values' sum in float64; only the sum's additions may be reordered (so the loop vectorises)."""
    total = 0.0
    for i in range(reduced.size):
        value = reduced[i] / divisor
        out[i] = value
        total += value
    return total

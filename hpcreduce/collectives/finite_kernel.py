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


@njit(nogil=True, cache=True, fastmath={"reassoc"})
def divide_sum_in_place(x, divisor):  # pragma: no cover - compiled
    """``x[i] /= divisor`` (exact, as numpy's divide), returning the values' sum in their own
    precision (``divisor``'s type, x's: float32 lanes are twice float64's; a sum that overflows
    although every value is finite reads as not finite, and the caller then looks elementwise):
    one array, so the loop vectorises (``divide_sum`` with ``out`` the same array would not)."""
    total = divisor - divisor  # 0 of x's dtype
    for i in range(x.size):
        value = x[i] / divisor
        x[i] = value
        total += value
    return total


@njit(nogil=True, cache=True, fastmath={"reassoc"})
def scale_sum_in_place(x, factor):  # pragma: no cover - compiled
    """``x[i] *= factor`` and the values' sum, as ``divide_sum_in_place``: for a divisor that is
    a power of two, ``factor`` its reciprocal (exact), the same bits as the division (both round
    the same real value), at a multiplication's cost (measured 345 against 405 us for 8 MiB)."""
    total = factor - factor
    for i in range(x.size):
        value = x[i] * factor
        x[i] = value
        total += value
    return total

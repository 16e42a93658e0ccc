"""A reduced buffer's copy out with its NaN/Inf verdict in the same pass.

The hierarchical allreduce ends with every rank copying the node's result out (a mean divided
in that copy); ``finish_sum`` also sums what it copies (float32 and float64: one compiled loop,
``finite_kernel``), so a caller that must refuse a NaN or an Inf (the torch wrapper's buckets)
reads its verdict without a pass of its own. A NaN or an Inf anywhere survives the sum, and
every rank sums the same result in the same order, so every rank reaches the same verdict with
no message. The sum is accumulated in float64; one that overflows although every value is
finite reads as not finite, so a caller looks elementwise before it raises.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import numpy as np

from .ops import ReduceOp

_kernel: Optional[Callable] = None
_in_place_kernels: Optional[Tuple[Callable, Callable]] = None


def finish_sum(op: ReduceOp, reduced: np.ndarray, out: np.ndarray, size: int) -> float:
    """``op.finish_into(reduced, out, size)`` and the sum of ``out`` (0 for integers, which hold
    no NaN): one pass for float32 and float64, the copy and then numpy's sum for float16."""
    if out.dtype.kind != "f":
        op.finish_into(reduced, out, size)
        return 0.0
    if out.dtype == np.float16:
        op.finish_into(reduced, out, size)
        return float(np.sum(out, dtype=np.float64))
    global _kernel
    if _kernel is None:
        from .finite_kernel import divide_sum
        _kernel = divide_sum
    divisor = size if op.divide_by_size and size > 1 else 1
    return float(_kernel(reduced, out, out.dtype.type(divisor)))


def finish_sum_in_place(op: ReduceOp, reduced: np.ndarray, size: int) -> float:
    """``op.finish(reduced, size)`` in place and the sum of the result (0 for integers): one pass
    for float32 and float64, the division and then numpy's sum for float16."""
    if reduced.dtype.kind != "f" or reduced.dtype == np.float16:
        op.finish(reduced, size)
        return float(np.sum(reduced, dtype=np.float64)) if reduced.dtype.kind == "f" else 0.0
    global _in_place_kernels
    if _in_place_kernels is None:
        from .finite_kernel import divide_sum_in_place, scale_sum_in_place
        _in_place_kernels = divide_sum_in_place, scale_sum_in_place
    divide, scale = _in_place_kernels
    divisor = size if op.divide_by_size and size > 1 else 1
    if divisor & (divisor - 1) == 0:  # a power of two: multiplied by its exact reciprocal, the same bits
        return float(scale(reduced, reduced.dtype.type(1.0 / divisor)))
    return float(divide(reduced, reduced.dtype.type(divisor)))

"""Where arrays live in memory: exact aliasing versus partial overlap.

A reduction reads its input while it writes its result, so an ``out`` that overlaps
``x`` without being the same memory must go through a temporary, and in-place
reductions of several arrays must not share memory (the first result would be read
as the next input).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

from ..arrays import is_device_array


def start_address(x) -> int:
    """Address of ``x``'s first element (host or device memory)."""
    return x.data.ptr if is_device_array(x) else x.__array_interface__["data"][0]


def byte_span(x) -> Tuple[int, int]:
    """``[low, high)`` addresses that ``x``'s elements occupy (empty for an empty array)."""
    low = high = start_address(x)
    if x.size == 0:
        return low, low
    for extent, stride in zip(x.shape, x.strides):
        reach = (extent - 1) * stride
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    return low, high + x.itemsize


def first_overlap(arrays: Sequence) -> Optional[Tuple[int, int]]:
    """Indices of two of ``arrays`` whose memory may overlap (by byte spans), or None."""
    spans = sorted((is_device_array(x), *byte_span(x), index) for index, x in enumerate(arrays))
    reach = None
    for device, low, high, index in spans:
        if low == high:
            continue
        if reach is not None and reach[0] == device and low < reach[1]:
            return tuple(sorted((reach[2], index)))
        if reach is None or reach[0] != device or high > reach[1]:
            reach = (device, high, index)
    return None

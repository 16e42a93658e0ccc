"""Fusion without copies: gradients that live as views in persistent fusion buffers.

``allreduce_many`` packs small arrays into a fused buffer and unpacks the results: two
copies of every byte. When the arrays already *are* consecutive slices of one flat
buffer (as PyTorch DDP's ``gradient_as_bucket_view`` lays gradients out), the bucket can
be reduced where it lies. ``GradientBuckets`` allocates such buffers, one per fusion
bucket (``plan_buckets``: same memory kind and dtype, in order, at most the fusion
threshold), and hands out a view shaped like each array; ``register`` makes a buffer
allocated elsewhere (a torch tensor's storage) known. ``bucket_region`` recognises a
fusion bucket whose arrays tile a registered buffer end to end, in order, with no gap:
``allreduce_many(..., inplace=True)`` then reduces that region in place, with no copy.
"""
from __future__ import annotations

import weakref
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

from ..arrays import array_module, is_device_array
from ..errors import ConfigurationError
from ..runtime.settings import Setting, positive_integer
from .memory import start_address

FUSION_BYTES = Setting("HPCREDUCE_FUSION_BYTES", positive_integer, 64 << 20, "a number of bytes above 0")
"""Fusion buffer size: 64 MiB unless set (Horovod's default)."""

_REGISTERED: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
"""Registered flat buffers by start address; a buffer leaves when it is freed, so whoever
registers one keeps it alive as long as its views are used."""
_KEPT: Dict[int, object] = {}
"""Registered buffers of array types that take no weak references."""


def plan(sizes: Sequence[int], keys: Sequence[Hashable], cap_bytes: int, *, forward: bool = False,
         first_cap: Optional[int] = None, mixed: bool = False) -> List[List[int]]:
    """The one bucket planner: indices grouped into buckets of one key (dtype, device) each,
    taken in reverse order (the order backward produces gradients, as torch DDP) unless
    ``forward``; a bucket is closed when the next item would take it past ``cap_bytes`` (the
    first bucket: ``first_cap`` when given), an oversized item alone. A change of key closes the
    open bucket unless ``mixed`` (then one bucket per key stays open: fusion of interleaved
    dtypes). Buckets come in the order they were taken (by first index)."""
    order = range(len(sizes)) if forward else reversed(range(len(sizes)))
    open_buckets: Dict[Hashable, List[int]] = {}
    filled: Dict[Hashable, int] = {}
    buckets: List[List[int]] = []
    started = 0
    for index in order:
        key, nbytes = keys[index], sizes[index]
        if not mixed and key not in open_buckets:
            buckets.extend(open_buckets.values())
            open_buckets.clear()
        cap = first_cap if first_cap is not None and started == 1 else cap_bytes
        if key in open_buckets and filled[key] > 0 and filled[key] + nbytes > cap:
            buckets.append(open_buckets.pop(key))
        if key not in open_buckets:
            open_buckets[key], filled[key] = [], 0
            started += 1
        open_buckets[key].append(index)
        filled[key] += nbytes
    buckets.extend(open_buckets.values())
    return sorted(buckets, key=lambda bucket: bucket[0], reverse=not forward)


def plan_buckets(arrays: Sequence, threshold_bytes: int) -> List[List[int]]:
    """``plan`` for fusing ``arrays`` (numpy or cupy): forward, by kind and dtype, mixed."""
    return plan([x.nbytes for x in arrays], [(is_device_array(x), x.dtype.str) for x in arrays],
                threshold_bytes, forward=True, mixed=True)


def fusion_threshold(given: Optional[int] = None) -> int:
    """``given``, else ``HPCREDUCE_FUSION_BYTES`` as ``allreduce_many`` reads it (an unusable
    value counts as the default here: ``allreduce_many`` reports it on every rank)."""
    if given is not None:
        return given
    try:
        return FUSION_BYTES.value()
    except ConfigurationError:
        return FUSION_BYTES.default


def register(buffer) -> None:
    """Make the flat contiguous ``buffer`` (numpy or cupy) known as fusion storage."""
    if buffer.ndim != 1 or not buffer.flags.c_contiguous:
        raise ValueError("a fusion buffer must be flat and contiguous")
    try:
        _REGISTERED[start_address(buffer)] = buffer
    except TypeError:  # an array type without weak references: kept for the process
        _KEPT[start_address(buffer)] = buffer


def bucket_region(arrays: Sequence, bucket: Sequence[int]):
    """The flat slice of a registered buffer that ``arrays[i] for i in bucket`` tile end to
    end, in order (same kind and dtype, each contiguous; empty arrays anywhere); None when
    they do not."""
    first = arrays[bucket[0]]
    filled = [arrays[i] for i in bucket if arrays[i].size]
    if not (_REGISTERED or _KEPT) or not filled or any(
            arrays[i].dtype != first.dtype or is_device_array(arrays[i]) != is_device_array(first)
            or not arrays[i].flags.c_contiguous for i in bucket):
        return None
    start = reach = start_address(filled[0])
    for x in filled:
        if start_address(x) != reach:
            return None
        reach += x.nbytes
    for base, buffer in [*_REGISTERED.items(), *_KEPT.items()]:
        if base <= start and reach <= base + buffer.nbytes and buffer.dtype == first.dtype \
                and is_device_array(buffer) == is_device_array(first) and (start - base) % first.itemsize == 0:
            offset = (start - base) // first.itemsize
            return buffer[offset:offset + (reach - start) // first.itemsize]
    return None


class GradientBuckets:
    """Persistent fusion buffers, and a view into them shaped like each of ``like``.

    ``like``: arrays (numpy or cupy) in the order they will be passed to ``allreduce_many``;
    ``threshold_bytes``: the fusion threshold ``allreduce_many`` will use (its default, the
    ``HPCREDUCE_FUSION_BYTES`` setting, unless given: ``fusion_threshold``). The buffers start zeroed. Local: no
    communication.
    """

    def __init__(self, like: Sequence, threshold_bytes: Optional[int] = None):
        threshold_bytes = fusion_threshold(threshold_bytes)
        self.layout = layout(like)
        self.buffers: List[object] = []
        self.views: List[object] = [None] * len(like)
        for bucket in plan_buckets(like, threshold_bytes):
            first = like[bucket[0]]
            buffer = array_module(first).zeros(sum(like[i].size for i in bucket), first.dtype)
            register(buffer)
            self.buffers.append(buffer)
            offset = 0
            for i in bucket:
                self.views[i] = buffer[offset:offset + like[i].size].reshape(like[i].shape)
                offset += like[i].size

    def matches(self, arrays: Sequence) -> bool:
        """Whether ``arrays`` have the kinds, dtypes and shapes the views were made for."""
        return layout(arrays) == self.layout

    def load(self, arrays: Sequence) -> List[object]:
        """Copy each of ``arrays`` into its view (an array that is its view stays); return the views."""
        for view, x in zip(self.views, arrays):
            if x is not view:
                view[...] = x
        return self.views


def layout(arrays: Sequence) -> List[Tuple[bool, str, Tuple[int, ...]]]:
    return [(is_device_array(x), x.dtype.str, tuple(x.shape)) for x in arrays]


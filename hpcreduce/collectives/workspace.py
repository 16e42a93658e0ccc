"""Scratch buffers reused across collective calls, and the GPU stream transfers order on.

Workspaces are cached on the context (``context.cache``), one per memory kind (host,
device, pinned host), so steady-state calls allocate nothing.
"""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np


class CurrentStream:
    """cupy's current stream, as the transfers wait for it.

    ``begin()`` starts a collective: if it runs on another stream than the last one,
    the last stream is waited for first, since its copies and combines may still use
    the scratch buffers this collective is about to reuse. ``wait()`` blocks until
    all work queued on the collective's stream is done.
    """

    def __init__(self):
        self._stream = None

    def begin(self) -> None:
        import cupy
        stream = cupy.cuda.get_current_stream()
        if self._stream is not None and self._stream.ptr != stream.ptr:
            self._stream.synchronize()
        self._stream = stream

    def wait(self) -> None:
        self._stream.synchronize()


Allocator = Callable[[int], object]


class Workspace:
    """Named scratch buffers, grown on demand and reused across calls.

    ``get(slot, dtype, count)`` returns a view of ``count`` elements; asking the same
    slot again reuses its memory, so steady-state calls allocate nothing.
    """

    def __init__(self, allocate: Allocator):
        self._allocate = allocate
        self._buffers: Dict[str, object] = {}

    def get(self, slot: str, dtype, count: int):
        dtype = np.dtype(dtype)
        nbytes = max(1, count * dtype.itemsize)
        raw = self._buffers.get(slot)
        if raw is None or raw.nbytes < nbytes:
            raw = self._allocate(nbytes)
            self._buffers[slot] = raw
        return raw[:count * dtype.itemsize].view(dtype)

    def nbytes(self) -> int:
        return sum(buffer.nbytes for buffer in self._buffers.values())


def host_allocator(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, dtype=np.uint8)


def device_allocator(nbytes: int):
    import cupy
    return cupy.empty(nbytes, dtype=cupy.uint8)


def pinned_allocator(nbytes: int) -> np.ndarray:
    """Page-locked host memory, so device copies run at full speed and asynchronously."""
    import cupyx
    return cupyx.empty_pinned((nbytes,), dtype=np.uint8)


ALLOCATORS: Dict[str, Allocator] = {
    "host": host_allocator, "device": device_allocator, "pinned": pinned_allocator,
}


def workspace(cache: dict, kind: str) -> Workspace:
    """The context-cached workspace of one memory kind: host, device or pinned."""
    key = f"workspace.{kind}"
    if key not in cache:
        cache[key] = Workspace(ALLOCATORS[kind])
    return cache[key]

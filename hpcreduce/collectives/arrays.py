"""Host (numpy) and device (cupy) arrays, and the scratch buffers reused across calls."""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np


def is_device_array(x) -> bool:
    """True for a cupy array (checked without importing cupy)."""
    return type(x) is not np.ndarray and type(x).__module__.startswith("cupy")


def array_module(x):
    """``numpy`` for host arrays, ``cupy`` for device arrays."""
    if is_device_array(x):
        import cupy
        return cupy
    return np


def cupy_available() -> bool:
    """Whether cupy imports and sees at least one GPU."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # ImportError, or CUDA runtime errors without a driver
        return False


def synchronize(x) -> None:
    """Wait until the GPU work queued on x's current stream is done, so MPI may read it."""
    if is_device_array(x):
        import cupy
        cupy.cuda.get_current_stream().synchronize()


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

"""Host (numpy) and device (cupy) arrays: which kind an array is, and moving it to the host.

cupy is optional: nothing here imports it unless a device array (or a GPU question)
comes up, so numpy-only installations never load it.
"""
from __future__ import annotations

import numpy as np

from ..errors import GpuUnavailableError


def is_device_array(x) -> bool:
    """True for a cupy array (checked without importing cupy)."""
    return type(x) is not np.ndarray and type(x).__module__.startswith("cupy")


def array_module(x):
    """``numpy`` for host arrays, ``cupy`` for device arrays."""
    if is_device_array(x):
        import cupy
        return cupy
    return np


def to_host(x) -> np.ndarray:
    """A numpy copy (of a cupy array) or view (of anything numpy reads) of ``x``."""
    return x.get() if is_device_array(x) else np.asarray(x)


def synchronize(x) -> None:
    """Wait until the GPU work queued on cupy's current stream is done, so MPI may read x."""
    if is_device_array(x):
        import cupy
        cupy.cuda.get_current_stream().synchronize()


def visible_gpus() -> int:
    """The number of GPUs cupy sees; ``GpuUnavailableError`` when none (or no cupy)."""
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # ImportError, or CUDA errors where no driver is installed
        raise GpuUnavailableError(f"no usable GPU: {type(err).__name__}: {err}") from err
    if count < 1:
        raise GpuUnavailableError("no usable GPU: cupy sees 0 devices")
    return count


def cupy_available() -> bool:
    """Whether cupy imports and sees at least one GPU."""
    try:
        visible_gpus()
    except GpuUnavailableError:
        return False
    return True

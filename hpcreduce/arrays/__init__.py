"""Host (numpy) and device (cupy) arrays: which kind an array is, and moving values between them.

cupy is optional: nothing here imports it unless a device array (or a GPU question)
comes up, so numpy-only installations never load it. Values cross between host and
device in two places only: ``to_host`` (down) and ``to_device`` (up); ``copy_into``
writes into an existing array of either kind through them. ``Device`` is the array
module a training run computes with (``Device("cpu")`` or ``Device("gpu")``).
"""
from __future__ import annotations

from typing import Tuple

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


def to_device(x):
    """A cupy array of ``x``'s values: ``x`` itself when it is one, else a host-to-device copy."""
    if is_device_array(x):
        return x
    import cupy
    return cupy.asarray(x)


def copy_into(destination, source) -> None:
    """``destination[...] = source`` where either may be on the host or the device: the
    values cross through ``to_device`` or ``to_host``, never an implicit conversion."""
    destination[...] = to_device(source) if is_device_array(destination) else to_host(source)


def host_pair(x, out) -> Tuple[np.ndarray, np.ndarray]:
    """Host arrays to reduce ``x`` into ``out`` with: themselves, or for a device ``x`` a host copy
    of it and a new host array (the caller copies that into ``out`` afterwards)."""
    if not is_device_array(x):
        return x, out
    host_x = to_host(x)
    return host_x, np.empty_like(host_x)


def synchronize(x) -> None:
    """Wait until the GPU work queued on cupy's current stream is done, so MPI may read x."""
    if is_device_array(x):
        import cupy
        cupy.cuda.get_current_stream().synchronize()


def visible_gpus() -> int:
    """The number of GPUs cupy sees; ``GpuUnavailableError`` saying what is missing (the
    cupy library, a CUDA driver, or a visible device) when none."""
    try:
        import cupy
    except ImportError as err:
        raise GpuUnavailableError(f"the cupy library is not installed ({type(err).__name__}: {err}); "
                                  f"install the cupy wheel for the node's CUDA, e.g. cupy-cuda12x") from err
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # CUDA errors where no driver is installed or no device is visible
        raise GpuUnavailableError(f"cupy {cupy.__version__} finds no usable GPU ({type(err).__name__}: {err}); "
                                  f"check the CUDA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES") from err
    if count < 1:
        raise GpuUnavailableError(f"cupy {cupy.__version__} sees 0 GPUs; check CUDA_VISIBLE_DEVICES")
    return count


def cupy_available() -> bool:
    """Whether cupy imports and sees at least one GPU."""
    try:
        visible_gpus()
    except GpuUnavailableError:
        return False
    return True


DEVICE_KINDS = ("cpu", "gpu")


class Device:
    """Where a training run keeps its parameters and computes: ``xp`` is numpy (cpu) or
    cupy (gpu); ``put`` moves an array there (on cpu a numpy array is returned as it is,
    so the cpu path computes exactly what it did before devices existed)."""

    def __init__(self, kind: str = "cpu"):
        if kind not in DEVICE_KINDS:
            raise ValueError(f"device must be one of {', '.join(DEVICE_KINDS)}, got {kind!r}")
        self.kind = kind
        self.on_gpu = kind == "gpu"
        if self.on_gpu:
            import cupy
            self.xp = cupy
        else:
            self.xp = np

    def put(self, x):
        """``x`` on this device (no copy when it is there already)."""
        return to_device(x) if self.on_gpu else to_host(x)

    def put_all(self, arrays):
        """A dict of every array of ``arrays`` (a mapping) on this device."""
        return {name: self.put(value) for name, value in arrays.items()}

    def __repr__(self) -> str:
        return f"Device({self.kind!r})"

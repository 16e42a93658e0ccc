"""The host-device copy bandwidth cupy measures here: the ceiling of the staged path.

The staged path (``collectives/transfer.py``) copies what a rank sends down to pinned
host memory and what it receives up to the GPU, so each reduced byte crosses the
host-device link about once each way; its busbw cannot beat
``1 / (1 / host_to_device + 1 / device_to_host)`` shared by the ranks on one GPU.
Measured by rank 0 alone (the other ranks wait), pinned memory, median of ``repeats``.
"""
from __future__ import annotations

import time
from typing import Dict, List

import numpy as np

COPY_BYTES = 64 << 20


def copy_bandwidth(comm, stream, ranks_per_gpu: int, nbytes: int = COPY_BYTES, repeats: int = 7) -> Dict[str, float]:
    """{bytes, host_to_device_GBps, device_to_host_GBps, staged_ceiling_busbw_GBps} (the
    same on every rank; collective)."""
    measured = None
    if comm.Get_rank() == 0:
        import cupy
        import cupyx
        host = cupyx.empty_pinned(nbytes // 4, np.float32)
        host[...] = 1.0
        device = cupy.empty(nbytes // 4, cupy.float32)
        up: List[float] = []
        down: List[float] = []
        for _ in range(repeats + 1):  # the first of each is a warm-up
            started = time.perf_counter()
            device.set(host)
            stream.synchronize()
            up.append(time.perf_counter() - started)
            started = time.perf_counter()
            device.get(out=host)
            down.append(time.perf_counter() - started)
        h2d, d2h = (nbytes / float(np.median(times[1:])) / 1e9 for times in (up, down))
        measured = {"bytes": nbytes, "host_to_device_GBps": h2d, "device_to_host_GBps": d2h,
                    "staged_ceiling_busbw_GBps": 1.0 / (1.0 / h2d + 1.0 / d2h) / max(ranks_per_gpu, 1)}
    return comm.bcast(measured, root=0)


def note(pcie: Dict[str, float], ranks_per_gpu: int) -> str:
    """One line for the benchmark's notes."""
    return (f"host-device copies (cupy, pinned, {pcie['bytes'] >> 20} MiB): up {pcie['host_to_device_GBps']:.1f} "
            f"GB/s, down {pcie['device_to_host_GBps']:.1f} GB/s; the staged path's busbw ceiling is about "
            f"{pcie['staged_ceiling_busbw_GBps']:.1f} GB/s per rank ({ranks_per_gpu} rank(s) per GPU)")

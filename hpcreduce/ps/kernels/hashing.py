"""SplitMix64's finaliser for compiled kernels (``arrays.hashing.mix64`` on one uint64)."""
from __future__ import annotations

import numpy as np
from numba import njit

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
M1, M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
S30, S27, S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@njit(nogil=True, cache=True, inline="always")
def mix64(x):
    """The same uint64 as ``arrays.hashing.mix64`` (wrapping arithmetic)."""
    x = (x ^ (x >> S30)) * M1
    x = (x ^ (x >> S27)) * M2
    return x ^ (x >> S31)

"""Counter-based normal and uniform draws (``tables.counter_normal``, ``embedding_configs.counter_uniform``),
one element at a time without temporaries."""
from __future__ import annotations

import numpy as np
from numba import njit

from .hashing import GOLDEN, mix64

TWO_POW_M53 = 2.0 ** -53
S11 = np.uint64(11)


@njit(nogil=True, cache=True)
def counter_normal(key, flat, scale, out):
    """``out[i]`` = N(0, scale**2) of element ``flat[i]`` under ``key`` (Box-Muller on two uniforms
    hashed from the element's number; the formula of ``tables.counter_normal``)."""
    for i in range(len(flat)):
        hashed = mix64(key ^ (np.uint64(flat[i]) * GOLDEN))
        first = 1.0 - np.float64(hashed >> S11) * TWO_POW_M53
        second = np.float64(mix64(hashed + GOLDEN) >> S11) * TWO_POW_M53
        out[i] = np.sqrt(-2.0 * np.log(first)) * np.cos(2.0 * np.pi * second) * scale


@njit(nogil=True, cache=True)
def counter_uniform(key, flat, low, span, out):
    """``out[i]`` = low + span x U[0, 1) of element ``flat[i]`` under ``key``, rounded to
    ``out``'s dtype (the formula of ``torch.embedding_configs.counter_uniform``, float64 inside)."""
    for i in range(len(flat)):
        hashed = mix64(key ^ (np.uint64(flat[i]) * GOLDEN))
        out[i] = low + span * (np.float64(hashed >> S11) * TWO_POW_M53)

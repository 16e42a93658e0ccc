"""Counter-based normal and uniform draws (``tables.counter_normal``, ``embedding_configs.counter_uniform``),
one element at a time without temporaries."""
from __future__ import annotations

import numpy as np
from numba import njit

from .hashing import GOLDEN, mix64

TWO_POW_M53 = 2.0 ** -53
S11 = np.uint64(11)


@njit(nogil=True, cache=True, inline="always")
def normal_of(key, element, scale):
    """N(0, scale**2) of element number ``element`` (uint64) under ``key``: Box-Muller on two
    uniforms hashed from it (the formula of ``tables.counter_normal``), in float64."""
    hashed = mix64(key ^ (element * GOLDEN))
    first = 1.0 - np.float64(hashed >> S11) * TWO_POW_M53
    second = np.float64(mix64(hashed + GOLDEN) >> S11) * TWO_POW_M53
    return np.sqrt(-2.0 * np.log(first)) * np.cos(2.0 * np.pi * second) * scale


@njit(nogil=True, cache=True)
def counter_normal(key, flat, scale, out):
    """``out[i]`` = ``normal_of`` element ``flat[i]``."""
    for i in range(len(flat)):
        out[i] = normal_of(key, np.uint64(flat[i]), scale)


@njit(nogil=True, cache=True)
def counter_normal_rows(key, ids, scale, out):
    """``out[r, c]`` = ``normal_of`` element ``ids[r] * width + c`` (``width``: out's columns; the
    number wraps as a uint64), written where the rows live: no array of element numbers."""
    width = np.uint64(out.shape[1])
    for r in range(len(ids)):
        base = np.uint64(ids[r]) * width
        for c in range(out.shape[1]):
            out[r, c] = normal_of(key, base + np.uint64(c), scale)


@njit(nogil=True, cache=True)
def counter_uniform(key, flat, low, span, out):
    """``out[i]`` = low + span x U[0, 1) of element ``flat[i]`` under ``key``, rounded to
    ``out``'s dtype (the formula of ``torch.embedding_configs.counter_uniform``, float64 inside)."""
    for i in range(len(flat)):
        hashed = mix64(key ^ (np.uint64(flat[i]) * GOLDEN))
        out[i] = low + span * (np.float64(hashed >> S11) * TWO_POW_M53)

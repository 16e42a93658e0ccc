"""Counter-based pseudo-random numbers: a value for any index, computed independently.

Used where every rank (or every shard of a table) must derive the same numbers for
the indices it holds without generating a whole stream: synthetic examples, the
parameter checksum's weights, and the rendezvous hashing that places sparse rows.
"""
from __future__ import annotations

import zlib

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijective, well-mixed hash of uint64 values (wraps mod 2**64)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def unit_uniform(hashed: np.ndarray) -> np.ndarray:
    """Uniform float64 in [0, 1) from the top 53 bits of uint64 hashes."""
    return (hashed >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def name_key(name: str) -> np.uint64:
    """A stable uint64 key for a string (the same in every process and Python version)."""
    return mix64(np.array([zlib.crc32(name.encode("utf-8"))], np.uint64) + GOLDEN)[0]

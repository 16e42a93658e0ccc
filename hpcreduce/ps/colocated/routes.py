"""Routing a colocated request: which rank gets which ids, in the order they are sent.

Ids are grouped into *segments* (one per table, and under replication a second one per
table for the replica holder), and the items of a request are ordered by (destination rank,
segment) so that each rank's part of the send buffer is contiguous and, inside it, each
table's ids come in table order. Segments are indexed by table number over every table of
the job (not just those in the request), so every rank's count header has the same length.
Row bytes travel as ``MPI.BYTE`` so tables of several widths and dtypes share one message.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import numpy as np
from mpi4py import MPI


@dataclass
class Route:
    """Where the items of a request go: ``offsets[s]``, where segment s starts among the
    concatenated segments' items; ``order``, item numbers (over the concatenated segments) sorted
    by (destination, segment); ``counts[d, s]``, items of segment s to rank d."""

    segments: int
    offsets: np.ndarray
    order: np.ndarray
    counts: np.ndarray


def route(dests: Sequence[np.ndarray], size: int) -> Route:
    """The route of items whose destination ranks are ``dests[s]`` for each segment s."""
    segments = len(dests)
    lengths = np.array([len(d) for d in dests], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    key = np.concatenate([np.asarray(d, np.int64) * segments + s for s, d in enumerate(dests)]) \
        if segments else np.empty(0, np.int64)
    small = np.uint16 if size * segments <= np.iinfo(np.uint16).max else np.int64
    order = np.argsort(key.astype(small), kind="stable")  # a radix sort for 16-bit keys
    counts = np.bincount(key, minlength=size * segments).reshape(size, segments).astype(np.int64)
    return Route(segments, offsets, order, counts)


def byte_spec(buffer: np.ndarray, block_bytes: np.ndarray) -> List:
    """An mpi4py ``[buffer, (counts, displacements), BYTE]`` for per-rank blocks of ``block_bytes``."""
    counts = np.asarray(block_bytes, np.int64)
    if counts.max(initial=0) >= 2**31:
        raise ValueError(f"a block of {int(counts.max())} bytes to one rank is past MPI's int count")
    displacements = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return [buffer, (counts.astype(np.int32), displacements.astype(np.int32)), MPI.BYTE]


def as_bytes(rows: np.ndarray, row_bytes: int) -> np.ndarray:
    """``rows`` as an (n, ``row_bytes``) uint8 array (a view when contiguous)."""
    return np.ascontiguousarray(rows).reshape(-1).view(np.uint8).reshape(len(rows), row_bytes)

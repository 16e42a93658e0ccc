"""Every table's items in one flat byte buffer: packing, unpacking and grouping without per-table loops.

A call's items (ids, rows, gradients) live in two orders: *natural* (segment after segment,
each segment's items in the order given) and *wire* (grouped by rank, then segment, as
``routes.Route`` orders them). Items of segment s are ``widths[s]`` bytes. ``move`` copies
items between the two orders in one compiled pass, whatever the tables' widths and dtypes.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def _move(src, src_at, dst, dst_at, width):
    for i in range(len(width)):
        s, d = src_at[i], dst_at[i]
        for j in range(width[i]):
            dst[d + j] = src[s + j]


def move(src: np.ndarray, src_at: np.ndarray, dst: np.ndarray, dst_at: np.ndarray, width: np.ndarray,
         unit: int) -> None:
    """``dst[dst_at[i]:+width[i]] = src[src_at[i]:+width[i]]`` for every item i (byte buffers and
    offsets, all multiples of ``unit``: ``word(...)``), copied ``unit`` bytes at a time."""
    kind = np.dtype(f"u{unit}")
    _move(src[:len(src) // unit * unit].view(kind), src_at // unit, dst[:len(dst) // unit * unit].view(kind),
          dst_at // unit, width // unit)


def word(row_bytes: np.ndarray) -> int:
    """The widest word (8, 4, 2 or 1 bytes) dividing every row width and an id's 8 bytes: every
    offset of a call's buffers is a multiple of it."""
    unit = 8
    while unit > 1 and np.any(np.asarray(row_bytes) % unit):
        unit //= 2
    return unit


@njit(nogil=True, cache=True)
def group(segment, segments):
    """A stable counting sort of items by ``segment``: (order, starts), segment s's items at
    ``order[starts[s]:starts[s + 1]]`` in their first order."""
    starts = np.zeros(segments + 1, np.int64)
    for i in range(len(segment)):
        starts[segment[i] + 1] += 1
    for s in range(segments):
        starts[s + 1] += starts[s]
    fill = starts[:-1].copy()
    order = np.empty(len(segment), np.int64)
    for i in range(len(segment)):
        order[fill[segment[i]]] = i
        fill[segment[i]] += 1
    return order, starts


def offsets(width: np.ndarray) -> np.ndarray:
    """Where each item starts when items of ``width`` bytes follow each other."""
    ends = np.cumsum(width)
    return ends - width


def wire_segments(counts: np.ndarray) -> np.ndarray:
    """The segment of each item of a buffer laid out by ``counts[rank, segment]`` (rank, then segment)."""
    ranks, segments = counts.shape
    return np.repeat(np.tile(np.arange(segments, dtype=np.int64), ranks), counts.reshape(-1))


def by_segment(counts: np.ndarray, widths: np.ndarray, extra: int = 0
               ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For a wire buffer laid out by ``counts`` (items of ``widths[s] + extra`` bytes): (order,
    starts, wire offset of each item, width of each item), with ``order``/``starts`` grouping
    the items by segment (rank order kept inside a segment)."""
    segment = wire_segments(counts)
    width = widths[segment]
    order, starts = group(segment, counts.shape[1])
    return order, starts, offsets(width + extra), width


def natural_to_wire(order: np.ndarray, lengths: np.ndarray, widths: np.ndarray, extra: int = 0
                    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For items of segments ``lengths`` (``widths[s]`` bytes each) sent in ``order`` (natural
    item numbers by wire position; wire items ``extra`` bytes longer): per wire item, (its
    natural byte offset, its wire byte offset, its width)."""
    width = np.repeat(widths, lengths)
    wire_width = width[order]
    return offsets(width)[order], offsets(wire_width + extra), wire_width

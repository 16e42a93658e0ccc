"""Every table's items in one flat byte buffer: packing, unpacking and grouping without per-table loops.

A call's items (ids, rows, gradients) live in two orders: *natural* (segment after segment,
each segment's items in the order given) and *wire* (grouped by rank, then segment, as
``routes.Route`` orders them); a receiver's blocks (rank, segment) are regrouped by segment.
Items of segment s are ``widths[s]`` bytes. ``move`` copies items between orders in one
compiled pass, whatever the tables' widths and dtypes; ``regroup`` joins whole blocks.
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


def offsets(width: np.ndarray) -> np.ndarray:
    """Where each item starts when items of ``width`` bytes follow each other."""
    ends = np.cumsum(width)
    return ends - width


def by_segment(sizes: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """For blocks of ``sizes[rank, segment]`` bytes laid out rank by rank, then segment by
    segment: (where each block starts there, where it starts when the blocks are laid out
    segment by segment, ranks in order inside a segment), both shaped like ``sizes``."""
    return offsets(sizes.reshape(-1)).reshape(sizes.shape), offsets(sizes.T.reshape(-1)).reshape(sizes.T.shape).T


def regroup(src: np.ndarray, sizes: np.ndarray, to_segments: bool = True) -> np.ndarray:
    """``src`` (blocks of ``sizes[rank, segment]`` bytes, rank by rank) laid out segment by segment
    (ranks in order inside a segment), or back with ``to_segments=False``: whole blocks joined
    by one ``np.concatenate`` (a memcpy each; a few descriptors, none per item)."""
    rank_major, segment_major = by_segment(sizes)
    starts, order = (rank_major.T, sizes.T) if to_segments else (segment_major, sizes)
    blocks = [src[start:start + size] for start, size in zip(starts.reshape(-1).tolist(), order.reshape(-1).tolist())
              if size]
    return np.concatenate(blocks) if blocks else src[:0].copy()


def natural_to_wire(order: np.ndarray, lengths: np.ndarray, widths: np.ndarray
                    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For items of segments ``lengths`` (``widths[s]`` bytes each) sent in ``order`` (natural
    item numbers by wire position): per wire item, (its natural byte offset, its wire byte
    offset, its width)."""
    width = np.repeat(widths, lengths)
    wire_width = width[order]
    return offsets(width)[order], offsets(wire_width), wire_width
